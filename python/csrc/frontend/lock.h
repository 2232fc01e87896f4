// The process lock: one recursive lock that every entry into the frontend's runtimes holds
// (the recorder's PrivateUse1 kernel, the runtimes' requests, the `genie` API), so that threads
// using remote devices at once are serialized op by op, as one CUDA stream serializes kernels.
//
// Deadlock rule: nobody waits for this lock while holding the GIL. `lock()` first tries to take
// it; when it must wait and the calling thread holds the GIL, it releases the GIL while it waits
// (Py_BEGIN_ALLOW_THREADS). So a thread that holds the lock may take the GIL (a Python callback)
// without deadlocking against a thread that holds the GIL and wants the lock. The recorder's C++
// path itself never takes the GIL while it holds the lock: it releases the lock before calling
// Python (python/csrc/frontend/recorder.h).
//
// After fork, the child calls reinitAfterFork() (genie.runtime's at-fork hook): a lock another
// thread of the parent held would otherwise stay held forever.
#pragma once

#include <atomic>
#include <mutex>
#include <thread>

namespace genie::frontend {

class ProcessLock {
 public:
  /// Takes the lock (recursively: the owning thread may take it again). Never waits with the
  /// GIL held (see the top of this file).
  void lock();
  /// Tries once; true when this thread now holds it.
  bool try_lock();
  /// Releases one level. std::system_error when this thread does not hold it.
  void unlock();
  /// True when the calling thread holds the lock.
  bool heldByThisThread() const { return owner_.load(std::memory_order_acquire) == std::this_thread::get_id(); }
  /// How many times the calling thread holds it (0 when another thread or none does).
  int depth() const { return heldByThisThread() ? depth_ : 0; }
  /// Releases every level this thread holds and returns how many (0 if none); restore(n) takes
  /// them again. The recorder's kernel uses them around a call into Python.
  int releaseAll();
  void restore(int depth);
  /// In a forked child: a fresh, unheld lock.
  void reinitAfterFork();

 private:
  std::mutex mutex_;
  std::atomic<std::thread::id> owner_{};
  int depth_ = 0;  // written by the owner only
};

/// The one process lock.
ProcessLock& processLock();

/// Holds processLock() for its lifetime.
class LockGuard {
 public:
  LockGuard() { processLock().lock(); }
  ~LockGuard() { processLock().unlock(); }
  LockGuard(const LockGuard&) = delete;
  LockGuard& operator=(const LockGuard&) = delete;
};

/// Releases every level of processLock() this thread holds for its lifetime (a call into Python
/// from a path that may be entered with the lock held).
class LockReleased {
 public:
  LockReleased() : depth_(processLock().releaseAll()) {}
  ~LockReleased() { processLock().restore(depth_); }
  LockReleased(const LockReleased&) = delete;
  LockReleased& operator=(const LockReleased&) = delete;

 private:
  int depth_;
};

}  // namespace genie::frontend
