#include "memory_account.h"

#include <c10/util/ThreadLocalDebugInfo.h>
#include <fmt/format.h>

namespace genie::node {

namespace {

thread_local RunMemoryScope* t_run = nullptr;

std::string limitText(uint64_t limit) { return limit == 0 ? std::string("no limit") : fmt::format("{} bytes", limit); }

/// c10's memory reporting hook: charges the calling thread's run, if any.
class NodeMemoryReporter final : public c10::MemoryReportingInfoBase {
 public:
  void reportMemoryUsage(void*, int64_t alloc_size, size_t, size_t, c10::Device) override {
    if (t_run != nullptr && alloc_size != 0) t_run->charge(alloc_size);
  }
  bool memoryProfilingEnabled() const override { return true; }
};

}  // namespace

std::string NodeMemory::overMessage(const SessionMemory& session, uint64_t requested) const {
  return fmt::format("out of memory: {} bytes requested; this session uses {} bytes of its quota ({}), the node {} "
                     "bytes of its limit ({})",
                     requested, session.resident + session.transient_counted, limitText(session.limit), used_,
                     limitText(limit_));
}

std::optional<std::string> NodeMemory::reserve(SessionMemory& session, uint64_t bytes, wire::Residency residency) {
  std::lock_guard<std::mutex> lock(mutex_);
  const uint64_t session_use = session.resident + session.transient_counted;
  if ((session.limit != 0 && session_use + bytes > session.limit) || (limit_ != 0 && used_ + bytes > limit_)) {
    return overMessage(session, bytes);
  }
  session.resident += bytes;
  used_ += bytes;
  by_class_[static_cast<int>(residency)] += bytes;
  return std::nullopt;
}

std::optional<std::string> NodeMemory::wouldFit(const SessionMemory& session, uint64_t bytes) const {
  std::lock_guard<std::mutex> lock(mutex_);
  const uint64_t session_use = session.resident + session.transient_counted;
  if ((session.limit != 0 && session_use + bytes > session.limit) || (limit_ != 0 && used_ + bytes > limit_)) {
    return overMessage(session, bytes);
  }
  return std::nullopt;
}

uint64_t NodeMemory::used() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return used_;
}

uint64_t NodeMemory::resident(const SessionMemory& session) const {
  std::lock_guard<std::mutex> lock(mutex_);
  return session.resident;
}

void NodeMemory::release(SessionMemory& session, uint64_t bytes, wire::Residency residency) {
  std::lock_guard<std::mutex> lock(mutex_);
  session.resident -= bytes;
  used_ -= bytes;
  by_class_[static_cast<int>(residency)] -= bytes;
}

std::optional<std::string> NodeMemory::addTransient(SessionMemory& session, int64_t delta) {
  std::lock_guard<std::mutex> lock(mutex_);
  session.transient += delta;
  const uint64_t counted = session.transient > 0 ? static_cast<uint64_t>(session.transient) : 0;
  used_ = used_ - session.transient_counted + counted;
  session.transient_counted = counted;
  if (delta > 0 && ((session.limit != 0 && session.resident + counted > session.limit) || (limit_ != 0 && used_ > limit_))) {
    return overMessage(session, static_cast<uint64_t>(delta));
  }
  return std::nullopt;
}

void NodeMemory::endRun(SessionMemory& session) {
  std::lock_guard<std::mutex> lock(mutex_);
  used_ -= session.transient_counted;
  session.transient = 0;
  session.transient_counted = 0;
}

void NodeMemory::snapshot(uint64_t (&by_class)[4]) const {
  std::lock_guard<std::mutex> lock(mutex_);
  for (int i = 0; i < 4; ++i) by_class[i] = by_class_[i];
}

void reportMemoryOfThisThread() {
  static const auto reporter = std::make_shared<NodeMemoryReporter>();
  if (c10::ThreadLocalDebugInfo::get(c10::DebugInfoKind::PROFILER_STATE) == nullptr) {
    c10::ThreadLocalDebugInfo::_push(c10::DebugInfoKind::PROFILER_STATE, reporter);
  }
}

RunMemoryScope::RunMemoryScope(NodeMemory& memory, SessionMemory& session)
    : memory_(memory), session_(session), previous_(t_run) {
  t_run = this;
}

RunMemoryScope::~RunMemoryScope() {
  t_run = previous_;
  memory_.endRun(session_);
}

void RunMemoryScope::charge(int64_t delta) {
  auto over = memory_.addTransient(session_, delta);
  if (over && !over_) over_ = std::move(over);
}

}  // namespace genie::node
