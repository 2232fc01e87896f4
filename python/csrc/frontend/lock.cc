#include "frontend/lock.h"

#include <Python.h>

#include <new>
#include <system_error>

namespace genie::frontend {

void ProcessLock::lock() {
  const auto me = std::this_thread::get_id();
  if (owner_.load(std::memory_order_acquire) == me) {
    ++depth_;
    return;
  }
  if (!mutex_.try_lock()) {
    if (Py_IsInitialized() && PyGILState_Check()) {
      Py_BEGIN_ALLOW_THREADS
      mutex_.lock();
      Py_END_ALLOW_THREADS
    } else {
      mutex_.lock();
    }
  }
  owner_.store(me, std::memory_order_release);
  depth_ = 1;
}

bool ProcessLock::try_lock() {
  const auto me = std::this_thread::get_id();
  if (owner_.load(std::memory_order_acquire) == me) {
    ++depth_;
    return true;
  }
  if (!mutex_.try_lock()) return false;
  owner_.store(me, std::memory_order_release);
  depth_ = 1;
  return true;
}

void ProcessLock::unlock() {
  if (!heldByThisThread()) {
    throw std::system_error(std::make_error_code(std::errc::operation_not_permitted),
                            "genie: the process lock is released by a thread that does not hold it");
  }
  if (--depth_ == 0) {
    owner_.store(std::thread::id(), std::memory_order_release);
    mutex_.unlock();
  }
}

int ProcessLock::releaseAll() {
  if (!heldByThisThread()) return 0;
  const int depth = depth_;
  depth_ = 0;
  owner_.store(std::thread::id(), std::memory_order_release);
  mutex_.unlock();
  return depth;
}

void ProcessLock::restore(int depth) {
  if (depth <= 0) return;
  lock();
  depth_ = depth;
}

void ProcessLock::reinitAfterFork() {
  // The parent's mutex may have been held by a thread that does not exist in the child.
  mutex_.~mutex();
  new (&mutex_) std::mutex();
  owner_.store(std::thread::id(), std::memory_order_release);
  depth_ = 0;
}

ProcessLock& processLock() {
  static ProcessLock* lock = new ProcessLock();  // never destroyed: threads may hold it at exit
  return *lock;
}

}  // namespace genie::frontend
