// Memory accounting of genie-node: the node's limit and each session's quota.
//
// What counts: a session's resident tensors (bytes per storage, by residency class) plus, while
// one of its runs executes, the bytes that run has allocated and not yet freed on its session
// thread (its transient memory, e.g. activations; measured through c10's memory reporting,
// which the CPU allocator and the CUDA caching allocator call on every allocation and free).
// A session may hold at most its quota (NodeConfig::session_memory_limit); all sessions
// together at most the node's limit (NodeConfig::memory_limit); 0 means no limit. Resident
// bytes are reserved before they are received (a refused upload's payload is never pulled);
// a run that goes over is stopped after the op that went over, with OutOfMemory.
//
// Thread safety: every NodeMemory function may be called from any thread (one mutex).
#pragma once

#include <c10/core/Allocator.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "genie/wire/codec.h"

namespace genie::node {

/// A session's share: its quota and what it uses now. Guarded by its NodeMemory's mutex.
struct SessionMemory {
  explicit SessionMemory(uint64_t limit) : limit(limit) {}
  const uint64_t limit;            // bytes; 0: only the node's limit applies
  uint64_t resident = 0;           // bytes of its resident tensors
  int64_t transient = 0;           // bytes its current run allocated net (may go negative: frees of older memory)
  uint64_t transient_counted = 0;  // max(0, transient): the part counted against both limits
};

class NodeMemory {
 public:
  explicit NodeMemory(uint64_t limit) : limit_(limit) {}

  /// Reserves `bytes` of resident memory for a session. The error (OutOfMemory) names the
  /// bytes asked for and both figures: the session's use and quota, the node's use and limit.
  std::optional<std::string> reserve(SessionMemory& session, uint64_t bytes, wire::Residency residency);
  void release(SessionMemory& session, uint64_t bytes, wire::Residency residency);
  /// Whether `bytes` more resident bytes would fit now (reserves nothing): the OutOfMemory
  /// message as reserve gives it when they would not.
  std::optional<std::string> wouldFit(const SessionMemory& session, uint64_t bytes) const;

  /// A run of `session` allocated (delta > 0) or freed bytes. Returns the OutOfMemory message
  /// when the session or the node is now over its limit.
  std::optional<std::string> addTransient(SessionMemory& session, int64_t delta);
  /// The run ended: its transient bytes leave both counts.
  void endRun(SessionMemory& session);

  uint64_t limit() const { return limit_; }
  /// Bytes in use now: every session's resident bytes plus the counted transient bytes.
  uint64_t used() const;
  /// `session`'s resident bytes now (what Ack, RunResult and Stats report to it).
  uint64_t resident(const SessionMemory& session) const;
  /// Resident bytes by residency class (index = wire::Residency).
  void snapshot(uint64_t (&by_class)[4]) const;

 private:
  std::string overMessage(const SessionMemory& session, uint64_t requested) const;

  mutable std::mutex mutex_;
  const uint64_t limit_;
  uint64_t used_ = 0;  // resident bytes of every session plus the counted transient bytes of running runs
  uint64_t by_class_[4] = {};
};

/// Makes c10 report every allocation and free of the calling thread (installs a memory
/// reporter as the thread's PROFILER_STATE debug info, for the thread's lifetime): call it
/// once on every thread that allocates or frees the node's tensors (session threads, the
/// progress thread, the thread that ends sessions). c10's CPU allocator keeps a size table of
/// reported blocks; a block allocated while reporting and freed on a thread without it would
/// stay in that table, so every such thread reports.
void reportMemoryOfThisThread();

/// While alive, the calling thread's allocations and frees are charged to `session` as a
/// run's transient memory; over() then tells when a limit was crossed.
class RunMemoryScope {
 public:
  RunMemoryScope(NodeMemory& memory, SessionMemory& session);
  ~RunMemoryScope();
  RunMemoryScope(const RunMemoryScope&) = delete;
  RunMemoryScope& operator=(const RunMemoryScope&) = delete;

  /// The OutOfMemory message once the run went over a limit (checked between ops).
  const std::optional<std::string>& over() const { return over_; }

  void charge(int64_t delta);  // from the reporter

 private:
  NodeMemory& memory_;
  SessionMemory& session_;
  std::optional<std::string> over_;
  RunMemoryScope* previous_;
};

}  // namespace genie::node
