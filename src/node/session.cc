// Session (session.h): one client's session on genie-node, its thread and its requests.
//
// Over 600 lines: one class: its request loop and a handler per request body (puts, gets, graph
// registration and runs, sends to peers, attached puts), all on the session's thread over its
// TensorStore and endpoint, sharing the tensor and payload helpers at the top of the file.
#include "session.h"

#include <ATen/ATen.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <cstring>
#include <future>
#include <optional>

#include "compiled_parts.h"
#include "genie/log.h"

namespace genie::node {

using transport::ConstBuffer;
using transport::Endpoint;
using transport::InboundMessage;
using wire::ErrorCode;

namespace {

using Clock = std::chrono::steady_clock;

/// Leader/followers (D. Schmidt et al., "Leader/Followers", PLoPD 2000): a session thread with
/// nothing to do drives the transport's worker itself for this long (µs) before it sleeps,
/// unless another thread already does, so that the callback of its next request runs on it
/// and the request needs no wake-up. The dedicated progress thread stands aside meanwhile.
constexpr std::chrono::microseconds kSessionLeaderPoll{200};
/// A session thread receiving a request's payload drives the worker for this long (µs)
/// before it waits for the progress thread to finish the receive.
constexpr std::chrono::microseconds kReceivePoll{1000};

/// Allocates an empty tensor laid out as `desc` on `device` (its whole storage span); `pinned`:
/// in page-locked host memory from PyTorch's caching host allocator (a GPU node's staging).
at::Tensor allocate(const wire::TensorDesc& desc, c10::Device device, bool pinned = false) {
  auto dtype = Executor::scalarType(desc.dtype());
  std::vector<int64_t> shape(desc.shape()->begin(), desc.shape()->end());
  auto options = at::TensorOptions().dtype(*dtype).device(device).pinned_memory(pinned);
  if (desc.nbytes() == 0) return at::empty(shape, options);
  std::vector<int64_t> strides;
  if (desc.strides() && desc.strides()->size()) {
    strides.assign(desc.strides()->begin(), desc.strides()->end());
  } else {
    auto contiguous = c10::contiguous_strides(shape);
    strides.assign(contiguous.begin(), contiguous.end());
  }
  const int64_t elements = static_cast<int64_t>(desc.nbytes() / c10::elementSize(*dtype));
  return at::empty({elements}, options).as_strided(shape, strides, desc.storage_offset());
}

/// Moves a tensor received in host memory (laid out as `desc`) to the node's device, storage
/// span and all. On the CPU it is the tensor itself; on a GPU it is one staged copy (the
/// payload lands in host memory first; UCX could write device memory directly where it is
/// built with CUDA, which is not done yet).
at::Tensor onDevice(at::Tensor host, const wire::TensorDesc& desc, c10::Device device) {
  if (device.is_cpu()) return host;
  at::Tensor placed = allocate(desc, device);
  if (desc.nbytes() == 0) return placed;
  const auto bytes = static_cast<int64_t>(desc.nbytes());
  at::Tensor to = at::from_blob(placed.storage().mutable_data(), {bytes}, at::TensorOptions().dtype(at::kByte).device(device));
  at::Tensor from = at::from_blob(host.storage().mutable_data(), {bytes}, at::TensorOptions().dtype(at::kByte));
  to.copy_(from);
  return placed;
}

/// The bytes of a tensor's storage span, as they travel (wire::TensorDesc.nbytes).
std::byte* storageBytes(const at::Tensor& t) {
  return static_cast<std::byte*>(t.storage().mutable_data());
}

/// A defined tensor as its bytes travel (GetTensors, RunResult, SendTensors): in host memory,
/// contiguous, and holding its logical values: a conjugate or negative view (fft.ifft's output
/// has the conj bit) is resolved, since the wire has no such bits. Each step is a dispatcher
/// call, made only where needed (a CPU node's tensors are in host memory already).
at::Tensor travelling(at::Tensor t) {
  if (!t.is_cpu()) t = t.cpu();
  if (t.is_conj()) t = t.resolve_conj();
  if (t.is_neg()) t = t.resolve_neg();
  return t.contiguous();
}

/// The parts a multi-tensor payload is received into: each tensor's storage span (`made`, in
/// host memory) where its slot says, and `gaps` (resized here) for the bytes between and after
/// them. Nothing when the slots do not lie in the payload in order without overlapping (a
/// client may lay them out otherwise: the caller stages the payload then).
std::optional<std::vector<transport::Buffer>> payloadParts(const flatbuffers::Vector<flatbuffers::Offset<wire::TensorSlot>>& slots,
                                                           const std::vector<at::Tensor>& made, uint64_t payload_size,
                                                           std::vector<std::byte>& gaps) {
  uint64_t at = 0, largest_gap = 0;
  for (uint32_t i = 0; i < slots.size(); ++i) {
    const uint64_t offset = slots.Get(i)->payload_offset();
    if (offset < at) return std::nullopt;
    largest_gap = std::max(largest_gap, offset - at);
    at = offset + slots.Get(i)->desc()->nbytes();
  }
  if (at > payload_size) return std::nullopt;
  gaps.resize(std::max(largest_gap, payload_size - at));
  std::vector<transport::Buffer> parts;
  at = 0;
  for (uint32_t i = 0; i < slots.size(); ++i) {
    const uint64_t offset = slots.Get(i)->payload_offset(), bytes = slots.Get(i)->desc()->nbytes();
    if (offset > at) parts.push_back({gaps.data(), offset - at});
    if (bytes > 0) parts.push_back({storageBytes(made[i]), bytes});
    at = offset + bytes;
  }
  if (payload_size > at) parts.push_back({gaps.data(), payload_size - at});
  return parts;
}

/// "host:port" (or "[v6]:port") split into host and port; false when it is not one.
bool splitPeer(std::string_view peer, std::string& host, uint16_t& port) {
  const size_t colon = peer.rfind(':');
  if (colon == std::string_view::npos || colon == 0 || colon + 1 == peer.size() || peer.size() - colon > 6) return false;
  uint32_t value = 0;
  for (char c : peer.substr(colon + 1)) {
    if (c < '0' || c > '9') return false;
    value = value * 10 + static_cast<uint32_t>(c - '0');
  }
  if (value == 0 || value > 65535) return false;
  std::string_view name = peer.substr(0, colon);
  if (name.size() >= 2 && name.front() == '[' && name.back() == ']') name = name.substr(1, name.size() - 2);
  if (name.empty()) return false;
  host.assign(name);
  port = static_cast<uint16_t>(value);
  return true;
}

/// The Error a failed put to `peer` becomes: the peer's own refusal keeps its code; a
/// connection that could not be made or failed is PeerUnreachable; each names the peer.
Status peerError(const std::string& peer, const Status& failed) {
  if (const RemoteDetail* remote = failed.remote()) {
    return wire::requestError(static_cast<ErrorCode>(remote->code),
                              fmt::format("SendTensors: peer {} refused: {}", peer, failed.message()));
  }
  if (failed.code() == StatusCode::kPeerUnreachable || failed.code() == StatusCode::kTimeout) {
    return wire::requestError(ErrorCode::PeerUnreachable,
                              fmt::format("SendTensors: peer {} is unreachable: {}", peer, failed.message()));
  }
  return wire::requestError(wire::errorCodeOf(failed), fmt::format("SendTensors to peer {}: {}", peer, failed.message()));
}

}  // namespace

void NodeContext::reply(Endpoint& to, const flatbuffers::DetachedBuffer& header, ConstBuffer payload,
                        std::shared_ptr<void> keep_alive) {
  auto send = [&] {
    to.send(wire::bytesOf(header), payload, [keep_alive = std::move(keep_alive)](Status s) {
      if (!s) GENIE_LOG_DEBUG("reply not delivered: {}", s.message());
    });
  };
  // On the progress thread, inline. From a session thread: inline when nobody holds the worker
  // (the progress thread sleeps, or stands aside after this thread led), else handed to the
  // progress thread, which is polling. std::ref: the std::function holds a reference, not a
  // heap copy of the lambda (kOnlyIfFree never keeps `start` past the call).
  if (!worker->drive(std::ref(send), [] { return true; }, std::chrono::microseconds(0),
                     transport::Worker::Takeover::kOnlyIfFree)) {
    send();
  }
}

Session::Session(NodeContext& node, std::shared_ptr<Endpoint> endpoint, wire::Handle id)
    : node(node), endpoint_(std::move(endpoint)), id_(id) {
  thread = std::thread([this] { run(); });
}

Session::~Session() { stop(); }

void Session::enqueue(InboundMessage message) {
  std::lock_guard<std::mutex> lock(mutex);
  queue.push_back(std::move(message));
  queued.fetch_add(1, std::memory_order_release);
  cv.notify_one();
}

void Session::enqueueAttached(InboundMessage message) {
  std::lock_guard<std::mutex> lock(mutex);
  attached_queue.push_back(std::move(message));
  queued.fetch_add(1, std::memory_order_release);
  cv.notify_one();
}

void Session::stop() {
  {
    std::lock_guard<std::mutex> lock(mutex);
    if (stopping && !thread.joinable()) return;
    stopping = true;
    cv.notify_one();
  }
  if (thread.joinable() && thread.get_id() != std::this_thread::get_id()) thread.join();
}

void Session::run() {
  pthread_setname_np(pthread_self(), "genie-session");  // else it inherits its creator's name
  reportMemoryOfThisThread();
  // On a GPU every request of this session runs on one stream of the device's pool (PyTorch's
  // 32 per device, round robin), current on this thread for the session's life: one session's
  // uploads and downloads (copies that synchronize their own stream only) overlap another's
  // kernels, where the device's default stream would serialize them. Reads back to host
  // (`.cpu()`) synchronize this stream; node-to-node sends read on this thread too.
  std::optional<c10::StreamGuard> stream;
  if (!node.device.is_cpu()) {
    try {
      stream.emplace(c10::impl::VirtualGuardImpl(node.device.type()).getStreamFromGlobalPool(node.device));
    } catch (const c10::Error& e) {  // a device type without streams: its current stream
      GENIE_LOG_DEBUG("session {}: no stream of its own on {}: {}", wire::toString(id_), node.device.str(),
                      e.what_without_backtrace());
    }
  }
  for (;;) {
    std::optional<InboundMessage> message;
    if (queued.load(std::memory_order_acquire) == 0 && !stopping.load(std::memory_order_acquire)) lead();
    bool attached = false;  // a put of another node's connection attached to this session
    {
      std::unique_lock<std::mutex> lock(mutex);
      cv.wait(lock, [&] { return stopping || !queue.empty() || !attached_queue.empty(); });
      std::deque<InboundMessage>& from = attached_queue.empty() ? queue : attached_queue;
      if (from.empty()) break;
      attached = &from == &attached_queue;
      message.emplace(std::move(from.front()));
      from.pop_front();
      queued.fetch_sub(1, std::memory_order_relaxed);
    }
    if (attached) {
      handleAttached(*message);
      continue;
    }
    if (idle_since_ != Clock::time_point{}) {
      const auto gap = std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - idle_since_);
      last_gap_ = gap <= node.idle_poll ? gap : std::chrono::microseconds(0);
    }
    // Verified on the progress thread; the header bytes are the message's own.
    const wire::Message* msg = flatbuffers::GetRoot<wire::Message>(message->header().data());
    try {
      handle(*message, *msg);
    } catch (const std::exception& e) {
      node.replyError(*endpoint_, msg->request_id(), wire::requestError(ErrorCode::Internal, e.what()));
    }
    idle_since_ = Clock::now();
  }
  // The session ends: its connections to other nodes close, everything it held is freed.
  peers.clear();
  tensors.clear();
  GENIE_LOG_INFO("session {} from {} ended; its tensors are freed", wire::toString(id_), endpoint_->peer());
}

void Session::lead() {
  // A client whose requests come a few ms apart (a decode loop: it records the next step
  // meanwhile) finds this thread polling rather than asleep, which would cost two wake-ups
  // per request (the progress thread's, then this one's). The window follows the last gap,
  // so a client that pauses for longer than node.idle_poll costs 200 µs of polling, not more.
  auto window = kSessionLeaderPoll;
  if (last_gap_.count() > 0) window = std::clamp(2 * last_gap_, kSessionLeaderPoll, std::max(node.idle_poll, kSessionLeaderPoll));
  const auto deadline = Clock::now() + window;
  auto ready = [this] { return queued.load(std::memory_order_acquire) != 0 || stopping.load(std::memory_order_acquire); };
  for (;;) {
    const auto slice_start = Clock::now();
    const auto slice = std::min<std::chrono::microseconds>(
        kSessionLeaderPoll, std::chrono::duration_cast<std::chrono::microseconds>(deadline - slice_start));
    if (slice.count() <= 0) return;
    node.worker->drive({}, ready, slice, transport::Worker::Takeover::kUnlessAnotherCaller);
    // A slice that ended early without a request: another thread leads, or needs the worker.
    if (ready() || Clock::now() - slice_start < slice / 2) return;
    sched_yield();  // between slices, the core to any thread that has work (2-core hosts)
  }
}

Status Session::receive(InboundMessage& message, void* destination, size_t bytes, transport::MemoryType memory) {
  return receive(message, std::vector<transport::Buffer>{{destination, bytes, memory}});
}

Status Session::receive(InboundMessage& message, std::vector<transport::Buffer> parts) {
  std::promise<Status> done;
  auto future = done.get_future();
  std::atomic<bool> received{false};
  // Drive the receive from here for a while (the progress thread may be standing aside).
  auto start = [&] {
    message.receivePayloadInParts(std::move(parts), [&done, &received](Status s) {
      received.store(true, std::memory_order_release);  // before: set_value may end this frame
      done.set_value(std::move(s));
    });
  };
  node.worker->drive(std::ref(start), [&received] { return received.load(std::memory_order_acquire); }, kReceivePoll);
  return future.get();  // bounded by the transport: a dead peer fails it within the peer timeout
}

void Session::handle(InboundMessage& message, const wire::Message& msg) {
  const uint64_t id = msg.request_id();
  switch (msg.body_type()) {
    case wire::Body::PutTensors: {
      if (Status error = putTensors(message, *msg.body_as_PutTensors()); !error) return node.replyError(*endpoint_, id, error);
      node.reply(*endpoint_, wire::buildAck(id, msg.body_as_PutTensors()->tensors()->size(), node.memory.resident(memory)));
      return;
    }
    case wire::Body::GetTensors: return getTensors(id, *msg.body_as_GetTensors());
    case wire::Body::FreeTensors: {
      const auto* handles = msg.body_as_FreeTensors()->handles();
      uint32_t freed = 0;
      for (uint32_t i = 0; handles && i < handles->size(); ++i) freed += tensors.release(*handles->Get(i));
      if (msg.body_as_FreeTensors()->want_reply()) node.reply(*endpoint_, wire::buildAck(id, freed, node.memory.resident(memory)));
      return;
    }
    case wire::Body::RegisterGraph: return registerGraph(id, *msg.body_as_RegisterGraph());
    case wire::Body::RunGraph: return runGraph(id, message, *msg.body_as_RunGraph());
    case wire::Body::StatsRequest: {
      wire::StatsArgs stats = node.collectStats();
      stats.session_resident = node.memory.resident(memory);
      stats.colocation = tensors.colocation();
      if (const auto* parts = msg.body_as_StatsRequest()->parts(); parts && parts->size() > 0) {
        if (const CompiledParts* compiled = CompiledParts::current()) {
          std::vector<wire::GraphId> graphs;
          for (uint32_t i = 0; i < parts->size(); ++i) graphs.push_back(*parts->Get(i));
          stats.parts = compiled->facts(graphs);
        }
      }
      return node.reply(*endpoint_, wire::buildStats(id, stats));
    }
    case wire::Body::SendTensors: return sendToPeer(id, *msg.body_as_SendTensors());
    default:
      node.replyError(*endpoint_, id, wire::requestError(ErrorCode::InvalidMessage,
                                      fmt::format("genie-node does not serve {}", wire::bodyName(msg.body_type()))));
  }
}

Status Session::putTensors(InboundMessage& message, const wire::PutTensors& put) {
  const auto* slots = put.tensors();
  // Each tensor's bytes are reserved before its payload is received: an upload over the
  // session's quota or the node's limit is refused without pulling its bytes (rendezvous).
  uint32_t reserved = 0;
  auto unreserve = [&] {
    for (uint32_t i = 0; i < reserved; ++i) {
      node.memory.release(memory, slots->Get(i)->desc()->nbytes(), slots->Get(i)->residency());
    }
  };
  auto refuse = [&](Status error) {
    unreserve();
    message.releasePayload();
    return error;
  };
  for (; reserved < slots->size(); ++reserved) {
    const wire::TensorSlot* slot = slots->Get(reserved);
    if (tensors.contains(*slot->handle())) {
      return refuse(wire::requestError(ErrorCode::DuplicateHandle, fmt::format("PutTensors.tensors[{}]: handle {} is already in use",
                                                             reserved, wire::toString(*slot->handle()))));
    }
    if (const wire::Colocation* c = slot->colocation()) {
      Status admitted = tensors.admit(std::string(wire::stringOf(c->group())), c->bytes(),
                                      fmt::format("PutTensors.tensors[{}]", reserved));
      if (!admitted) return refuse(admitted);
    }
    if (auto error = node.memory.reserve(memory, slot->desc()->nbytes(), slot->residency())) {
      return refuse(wire::requestError(ErrorCode::OutOfMemory, fmt::format("PutTensors.tensors[{}]: {}", reserved, *error)));
    }
  }
  // Payloads land in host memory, then one copy to the device (a GPU's staging in page-locked
  // memory, reused through PyTorch's caching host allocator: no page faults, a fast copy up); or,
  // on a CUDA node with direct uploads, straight in device memory, UCX moving them there
  // (--gpu-upload, docs/node.md).
  const bool direct = node.device.is_cuda() && node.direct_device_uploads;
  const bool pinned = node.device.is_cuda() && !direct;
  const c10::Device land = direct ? node.device : c10::Device(c10::kCPU);
  const auto memory_type = direct ? transport::MemoryType::kCuda : transport::MemoryType::kHost;
  if (!node.device.is_cpu()) {  // which path this transfer takes (--log-level debug)
    GENIE_LOG_DEBUG("session {}: PutTensors of {} tensor(s), {} payload bytes: {}", wire::toString(id_), slots->size(),
                    message.payloadSize(),
                    direct ? fmt::format("UCX writes {} memory", node.device.str())
                           : fmt::format("staged in page-locked host memory, then copied to {}", node.device.str()));
  }
  std::vector<at::Tensor> made;
  try {
    for (uint32_t i = 0; i < slots->size(); ++i) made.push_back(allocate(*slots->Get(i)->desc(), land, pinned));
  } catch (const std::exception& e) {
    return refuse(wire::requestError(ErrorCode::OutOfMemory, fmt::format("PutTensors.tensors[{}]: {}", made.size(), e.what())));
  }
  // Payload: straight into the storage when it is one tensor, else one staging copy.
  if (message.payloadSize() > 0) {
    if (slots->size() == 1 && slots->Get(0)->payload_offset() == 0 && made[0].storage().nbytes() == message.payloadSize()) {
      Status received = receive(message, storageBytes(made[0]), message.payloadSize(), memory_type);
      if (!received) return refuse(wire::requestError(ErrorCode::PeerUnreachable, received.message()));
    } else if (direct) {
      at::Tensor staging;
      try {
        staging = at::empty({static_cast<int64_t>(message.payloadSize())}, at::TensorOptions().dtype(at::kByte).device(land));
      } catch (const std::exception& e) {
        return refuse(wire::requestError(ErrorCode::OutOfMemory, fmt::format("PutTensors: {}", e.what())));
      }
      Status received = receive(message, staging.data_ptr(), message.payloadSize(), memory_type);
      if (!received) return refuse(wire::requestError(ErrorCode::PeerUnreachable, received.message()));
      for (uint32_t i = 0; i < slots->size(); ++i) {  // device to device, on this session's stream
        const auto* slot = slots->Get(i);
        const auto bytes = static_cast<int64_t>(slot->desc()->nbytes());
        if (bytes == 0) continue;
        at::from_blob(storageBytes(made[i]), {bytes}, at::TensorOptions().dtype(at::kByte).device(land))
            .copy_(staging.narrow(0, static_cast<int64_t>(slot->payload_offset()), bytes));
      }
    } else if (std::vector<std::byte> gaps; auto parts = payloadParts(*slots, made, message.payloadSize(), gaps)) {
      // Each tensor's bytes straight into its storage (UCX's iov), the padding between them
      // into `gaps`: no staging copy.
      Status received = receive(message, std::move(*parts));
      if (!received) return refuse(wire::requestError(ErrorCode::PeerUnreachable, received.message()));
    } else {
      at::Tensor staging;
      try {
        staging = at::empty({static_cast<int64_t>(message.payloadSize())},
                            at::TensorOptions().dtype(at::kByte).pinned_memory(pinned));
      } catch (const std::exception& e) {
        return refuse(wire::requestError(ErrorCode::OutOfMemory, fmt::format("PutTensors: {}", e.what())));
      }
      const auto* from = static_cast<const std::byte*>(staging.data_ptr());
      Status received = receive(message, staging.data_ptr(), message.payloadSize());
      if (!received) return refuse(wire::requestError(ErrorCode::PeerUnreachable, received.message()));
      for (uint32_t i = 0; i < slots->size(); ++i) {
        const auto* slot = slots->Get(i);
        std::memcpy(storageBytes(made[i]), from + slot->payload_offset(), slot->desc()->nbytes());
      }
    }
  }
  for (uint32_t i = 0; i < slots->size(); ++i) {
    const auto* slot = slots->Get(i);
    if (!direct) made[i] = onDevice(std::move(made[i]), *slot->desc(), node.device);
    // Reserved above, each a new storage. A handle named twice in this message fails here.
    const std::string group = slot->colocation() ? std::string(wire::stringOf(slot->colocation()->group())) : "";
    if (Status error = tensors.store(*slot->handle(), made[i], slot->residency(), /*reserved=*/true, &group); !error) {
      for (uint32_t j = i; j < slots->size(); ++j) {
        node.memory.release(memory, slots->Get(j)->desc()->nbytes(), slots->Get(j)->residency());
      }
      for (uint32_t j = 0; j < i; ++j) tensors.release(*slots->Get(j)->handle());
      return wire::requestError(wire::errorCodeOf(error), fmt::format("PutTensors.tensors[{}]: {}", i, error.message()));
    }
  }
  return Status::ok();
}

void Session::sendTensors(uint64_t id, bool run_result, const std::vector<std::pair<wire::Handle, at::Tensor>>& out,
                          uint64_t exec_us, std::span<const wire::TensorSlotArgs> described) {
  // Returned tensors travel from host memory, contiguous, one payload: zero-copy for a single
  // contiguous host tensor. The bytes are the logical values: a conjugate or negative view
  // (fft.ifft's output has the conj bit) is resolved first, since the wire has no such bits.
  std::vector<wire::TensorSlotArgs> slots;
  std::vector<at::Tensor> contiguous;
  slots.reserve(out.size());
  contiguous.reserve(out.size());
  wire::PayloadLayout layout;
  for (size_t i = 0; i < out.size(); ++i) {  // the wire has no bytes for a quantized tensor (codec.h)
    if (out[i].second.defined() && out[i].second.is_quantized()) {
      return node.replyError(*endpoint_, id, wire::requestError(
          ErrorCode::SchemaMismatch,
          fmt::format("tensor {} is quantized ({}): a quantized tensor travels as its integer representation "
                      "(int_repr) with its scale and zero point", wire::toString(out[i].first),
                      c10::toString(out[i].second.scalar_type()))));
    }
  }
  for (const auto& [handle, tensor] : out) {
    at::Tensor t = tensor.defined() ? travelling(tensor) : tensor;
    wire::TensorSlotArgs slot;
    slot.handle = handle;
    slot.desc.dtype = t.defined() ? Executor::wireDType(t.scalar_type()) : wire::DType::Float32;
    slot.desc.shape = t.defined() ? t.sizes().vec() : std::vector<int64_t>{0};
    slot.payload_offset = layout.add(t.defined() ? t.nbytes() : 0);
    slots.push_back(std::move(slot));
    contiguous.push_back(std::move(t));
  }
  auto header = run_result ? wire::buildRunResult(id, slots, exec_us, described, node.memory.resident(memory))
                            : wire::buildTensorData(id, slots);
  if (!header) return node.replyError(*endpoint_, id, wire::requestError(ErrorCode::Internal, header.status().message()));
  if (contiguous.size() == 1 && contiguous[0].defined() && layout.size() == contiguous[0].nbytes()) {
    auto keep = std::make_shared<at::Tensor>(contiguous[0]);
    node.reply(*endpoint_, *header, {keep->data_ptr(), layout.size()}, keep);
    return;
  }
  auto staging = std::make_shared<std::vector<std::byte>>(layout.size());
  for (size_t i = 0; i < contiguous.size(); ++i) {
    if (contiguous[i].defined() && contiguous[i].nbytes()) {
      std::memcpy(staging->data() + slots[i].payload_offset, contiguous[i].data_ptr(), contiguous[i].nbytes());
    }
  }
  node.reply(*endpoint_, *header, {staging->data(), staging->size()}, staging);
}

void Session::getTensors(uint64_t id, const wire::GetTensors& get) {
  std::vector<std::pair<wire::Handle, at::Tensor>> out;
  for (uint32_t i = 0; i < get.handles()->size(); ++i) {
    const wire::Handle& handle = *get.handles()->Get(i);
    const at::Tensor* tensor = tensors.find(handle);
    if (tensor == nullptr) {
      return node.replyError(*endpoint_, id, wire::requestError(ErrorCode::UnknownHandle,
                                             fmt::format("GetTensors.handles[{}]: no tensor {} in this session", i,
                                                         wire::toString(handle))));
    }
    out.emplace_back(handle, *tensor);
  }
  sendTensors(id, false, out, 0);
}

void Session::registerGraph(uint64_t id, const wire::RegisterGraph& reg) {
  std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(reg.graph()->data()), reg.graph()->size());
  auto registered = node.graphs.add(bytes, *reg.graph_nested_root());
  if (!registered) return node.replyError(*endpoint_, id, registered.status());
  node.reply(*endpoint_, wire::buildGraphRegistered(id, registered->id, registered->graph->nodes().size()));
}

void Session::runGraph(uint64_t id, InboundMessage& message, const wire::RunGraph& run) {
  // Frees ride on the run and come first, whatever becomes of the run (FreeTensors semantics:
  // unknown handles are ignored).
  for (uint32_t i = 0; run.free() && i < run.free()->size(); ++i) tensors.release(*run.free()->Get(i));
  std::shared_ptr<const CompiledGraph> graph = node.graphs.find(*run.graph_id());
  if (!graph) {
    message.releasePayload();
    return node.replyError(*endpoint_, id, wire::requestError(ErrorCode::UnknownGraph,
                                           fmt::format("graph {} is not registered", wire::toString(*run.graph_id()))));
  }
  std::vector<at::Tensor> inputs(graph->numInputs());
  if (Status error = bindInputs(message, run, *graph, inputs); !error) return node.replyError(*endpoint_, id, error);
  for (uint32_t i = 0; run.outputs() && i < run.outputs()->size(); ++i) {  // co-location groups: before anything runs
    if (const wire::Colocation* c = run.outputs()->Get(i)->colocation()) {
      Status admitted = tensors.admit(std::string(wire::stringOf(c->group())), c->bytes(), fmt::format("RunGraph.outputs[{}]", i));
      if (!admitted) return node.replyError(*endpoint_, id, admitted);
    }
  }
  std::vector<ScalarSlotValue> scalars(graph->numScalarInputs(), int64_t{0});
  const auto* scalar_bindings = run.scalars();
  for (uint32_t i = 0; scalar_bindings && i < scalar_bindings->size(); ++i) {
    const wire::ScalarBinding* s = scalar_bindings->Get(i);
    if (s->slot() >= scalars.size()) {
      return node.replyError(*endpoint_, id, wire::requestError(ErrorCode::InvalidMessage,
                                             fmt::format("RunGraph.scalars[{}]: slot {} out of range", i, s->slot())));
    }
    if (s->value_type() == wire::Value::IntValue) scalars[s->slot()] = s->value_as_IntValue()->v();
    if (s->value_type() == wire::Value::DoubleValue) scalars[s->slot()] = s->value_as_DoubleValue()->v();
    if (s->value_type() == wire::Value::BoolValue) scalars[s->slot()] = s->value_as_BoolValue()->v();
  }
  auto start = Clock::now();
  Result<std::vector<at::Tensor>> result = Status(StatusCode::kInternal, "the run did not run");
  {
    // The run's allocations count against the session's quota and the node's limit.
    RunMemoryScope run_memory(node.memory, memory);
    std::vector<uint64_t> needed;  // the values this run returns or keeps: the rest die at their last use
    for (uint32_t i = 0; run.outputs() && i < run.outputs()->size(); ++i) needed.push_back(run.outputs()->Get(i)->value());
    result = node.executor.run(*graph, inputs, scalars, &run_memory.over(), std::span<const uint64_t>(needed));
  }
  if (!result) return node.replyError(*endpoint_, id, result.status());
  node.ops_executed += graph->nodes().size();
  auto exec_us = std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - start).count();
  std::vector<std::pair<wire::Handle, at::Tensor>> returned;
  std::vector<wire::TensorSlotArgs> described;
  if (Status error = applyOutputs(run, *result, returned, described); !error) {
    return node.replyError(*endpoint_, id, error);
  }
  sendTensors(id, true, returned, static_cast<uint64_t>(exec_us), described);
}

Status Session::bindInputs(InboundMessage& message, const wire::RunGraph& run,
                                                const CompiledGraph& graph, std::vector<at::Tensor>& inputs) {
  // Explicit bindings: resident tensors by handle, or small tensors inline in the payload.
  std::vector<std::byte> staging;
  if (message.payloadSize() > 0) {
    staging.resize(message.payloadSize());
    if (Status received = receive(message, staging.data(), staging.size()); !received) {
      return wire::requestError(ErrorCode::PeerUnreachable, received.message());
    }
  }
  const auto* bindings = run.inputs();
  for (uint32_t i = 0; bindings && i < bindings->size(); ++i) {
    const wire::InputBinding* binding = bindings->Get(i);
    if (binding->input() >= inputs.size()) {
      return wire::requestError(ErrorCode::InvalidMessage, fmt::format("RunGraph.inputs[{}]: input {} of a graph with {} inputs",
                                                                 i, binding->input(), inputs.size()));
    }
    if (binding->kind() == wire::BindingKind::Handle) {
      const at::Tensor* tensor = tensors.find(*binding->handle());
      if (tensor == nullptr) {
        return wire::requestError(ErrorCode::UnknownHandle, fmt::format("RunGraph.inputs[{}]: no tensor {} in this session", i,
                                                                  wire::toString(*binding->handle())));
      }
      inputs[binding->input()] = *tensor;
    } else {
      const wire::TensorSlot* slot = binding->inline_();
      at::Tensor t = allocate(*slot->desc(), c10::Device(c10::kCPU));
      if (slot->desc()->nbytes()) std::memcpy(storageBytes(t), staging.data() + slot->payload_offset(), slot->desc()->nbytes());
      inputs[binding->input()] = onDevice(std::move(t), *slot->desc(), node.device);
    }
  }
  // Bound inputs (Graph.inputs[i].handle) not bound explicitly: this session's tensor.
  const auto& bound = graph.inputHandles();
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (inputs[i].defined()) continue;
    if (i < bound.size() && !wire::isNull(bound[i])) {
      const at::Tensor* tensor = tensors.find(bound[i]);
      if (tensor == nullptr) {
        return wire::requestError(ErrorCode::UnknownHandle,
                            fmt::format("RunGraph: input {} is bound by the graph to handle {}, which is not a tensor "
                                        "in this session (bind the input explicitly or put the tensor first)",
                                        i, wire::toString(bound[i])));
      }
      inputs[i] = *tensor;
      continue;
    }
    return wire::requestError(ErrorCode::InvalidMessage, fmt::format("RunGraph: input {} is not bound", i));
  }
  return Status::ok();
}

void Session::sendToPeer(uint64_t id, const wire::SendTensors& send) {
  const std::string peer(wire::stringOf(send.peer()));
  std::string host;
  uint16_t port = 0;
  if (!splitPeer(peer, host, port)) {
    return node.replyError(*endpoint_, id, wire::requestError(ErrorCode::InvalidMessage,
                                           fmt::format("SendTensors.peer: '{}' is not HOST:PORT", peer)));
  }
  const wire::Handle peer_session = *send.peer_session();
  if (peer_session == id_) {
    // Its own thread would wait for itself: the put would queue behind this very request.
    return node.replyError(*endpoint_, id, wire::requestError(ErrorCode::InvalidMessage,
                                           "SendTensors.peer_session: is this session itself"));
  }
  // The tensors as they travel (host memory, contiguous), under the peer's handles, with the
  // residency they have here. Only this session's handles can be named.
  const uint32_t n = send.handles()->size();
  std::vector<wire::TensorSlotArgs> slots(n);
  std::vector<at::Tensor> travel(n);
  wire::PayloadLayout layout;
  for (uint32_t i = 0; i < n; ++i) {
    const wire::Handle& handle = *send.handles()->Get(i);
    const at::Tensor* tensor = tensors.find(handle);
    if (tensor == nullptr) {
      return node.replyError(*endpoint_, id, wire::requestError(ErrorCode::UnknownHandle,
                                             fmt::format("SendTensors.handles[{}]: no tensor {} in this session", i,
                                                         wire::toString(handle))));
    }
    if (const std::string* group = tensors.groupOf(handle)) {
      return node.replyError(*endpoint_, id, wire::requestError(ErrorCode::InvalidMessage,
                                             fmt::format("SendTensors.handles[{}]: tensor {} belongs to co-location group "
                                                         "'{}', which stays on this node (the scheduler's hint: weights "
                                                         "and KV caches stay where their group runs)",
                                                         i, wire::toString(handle), *group)));
    }
    travel[i] = travelling(*tensor);
    wire::TensorSlotArgs& slot = slots[i];
    slot.handle = *send.peer_handles()->Get(i);
    slot.desc.dtype = Executor::wireDType(travel[i].scalar_type());
    slot.desc.shape = travel[i].sizes().vec();
    slot.residency = tensors.residencyOf(handle);
    slot.payload_offset = layout.add(travel[i].nbytes());
    if (slot.desc.dtype == wire::DType::Undefined) {
      return node.replyError(*endpoint_, id, wire::requestError(ErrorCode::Internal,
                                             fmt::format("SendTensors.handles[{}]: dtype {} has no wire dtype", i,
                                                         c10::toString(travel[i].scalar_type()))));
    }
  }
  // One tensor travels straight from its storage; several are copied into one payload.
  std::vector<std::byte> staging;
  std::span<const std::byte> payload;
  if (n == 1) {
    payload = {static_cast<const std::byte*>(travel[0].const_data_ptr()), static_cast<size_t>(layout.size())};
  } else {
    staging.resize(layout.size());
    for (uint32_t i = 0; i < n; ++i) {
      if (travel[i].nbytes()) std::memcpy(staging.data() + slots[i].payload_offset, travel[i].const_data_ptr(), travel[i].nbytes());
    }
    payload = staging;
  }
  // The connection to that session: reused while it is up (the peer closes it when the session
  // ends or the node stops), else made anew; at most kMaxPeerConnections, least recently used
  // closed first.
  auto linked = [&] {
    return std::find_if(peers.begin(), peers.end(),
                        [&](const PeerLink& l) { return l.address == peer && l.peer_session == peer_session; });
  };
  client::Client* client = nullptr;
  if (auto link = linked(); link != peers.end()) {
    if (link->client->connected()) {
      client = link->client.get();
    } else {
      peers.erase(link);
    }
  }
  if (client == nullptr && peers.size() >= kMaxPeerConnections) {
    peers.erase(std::min_element(peers.begin(), peers.end(),
                                 [](const PeerLink& a, const PeerLink& b) { return a.last_used < b.last_used; }));
  }
  std::unique_ptr<client::Client> fresh;
  Status result;
  uint64_t bytes_sent = 0;
  const std::string token(wire::stringOf(send.auth_token()));
  // Off this thread: connecting and the put are bounded by the data plane (connect timeout, a
  // dead peer within the peer timeout) and the client's timeout; meanwhile this session runs
  // the puts other nodes send it.
  runServingAttached([&] {
    try {
      if (client == nullptr) {
        client::ClientOptions options;
        options.name = node.peer_client_name;
        options.auth_token = token;
        options.transport = node.peer_transport;
        options.attach_session = peer_session;
        auto connected = client::Client::connect(host, port, options);
        if (!connected) {
          result = connected.status();
          return;
        }
        fresh = std::move(*connected);
        client = fresh.get();
      }
      const uint64_t before = client->counters().bytes_sent;
      result = client->putTensors(slots, payload);
      bytes_sent = client->counters().bytes_sent - before;
    } catch (const std::exception& e) {
      result = GENIE_ERROR(kInternal, "{}", e.what());
    }
  });
  node.peer_bytes_sent += bytes_sent;
  ++sends_;
  if (auto link = linked(); link != peers.end()) {
    if (link->client->connected()) {
      link->last_used = sends_;
    } else {
      peers.erase(link);  // closed under the put: the next send connects again
    }
  } else if (fresh && fresh->connected()) {
    peers.push_back({peer, peer_session, std::move(fresh), sends_});
  }
  if (!result) {
    GENIE_LOG_DEBUG("session {}: SendTensors to {} failed: {}", wire::toString(id_), peer, result.message());
    return node.replyError(*endpoint_, id, peerError(peer, result));
  }
  ++node.peer_transfers;
  node.reply(*endpoint_, wire::buildAck(id, n, node.memory.resident(memory)));
}

void Session::runServingAttached(const std::function<void()>& work) {
  bool done = false;  // under `mutex`
  std::thread helper([&] {
    work();
    std::lock_guard<std::mutex> lock(mutex);
    done = true;
    cv.notify_all();
  });
  std::unique_lock<std::mutex> lock(mutex);
  for (;;) {
    cv.wait(lock, [&] { return done || !attached_queue.empty(); });
    if (attached_queue.empty()) break;
    InboundMessage message = std::move(attached_queue.front());
    attached_queue.pop_front();
    queued.fetch_sub(1, std::memory_order_relaxed);
    lock.unlock();
    handleAttached(message);
    lock.lock();
  }
  lock.unlock();
  helper.join();
}

void Session::handleAttached(InboundMessage& message) {
  // Verified on the progress thread, which hands attached connections' PutTensors only.
  const wire::Message* msg = flatbuffers::GetRoot<wire::Message>(message.header().data());
  Endpoint& to = *message.endpoint();
  const uint64_t id = msg->request_id();
  const uint64_t bytes = message.header().size() + message.payloadSize();
  try {
    const wire::PutTensors& put = *msg->body_as_PutTensors();
    if (Status error = putTensors(message, put); !error) return node.replyError(to, id, error);
    node.peer_bytes_received += bytes;
    ++node.peer_transfers;
    node.reply(to, wire::buildAck(id, put.tensors()->size(), node.memory.resident(memory)));
  } catch (const std::exception& e) {
    node.replyError(to, id, wire::requestError(ErrorCode::Internal, e.what()));
  }
}

/// The descriptor of a tensor as it lives on the node: its own strides and storage offset.
static wire::TensorDescArgs describe(const at::Tensor& t) {
  wire::TensorDescArgs desc;
  desc.dtype = Executor::wireDType(t.scalar_type());
  desc.shape = t.sizes().vec();
  desc.strides = t.strides().vec();
  desc.storage_offset = t.storage_offset();
  desc.memory = t.is_cuda() ? wire::MemoryKind::Cuda : wire::MemoryKind::Host;
  desc.device_index = t.is_cuda() ? t.device().index() : 0;
  return desc;
}

Status Session::applyOutputs(const wire::RunGraph& run, const std::vector<at::Tensor>& values,
                                                  std::vector<std::pair<wire::Handle, at::Tensor>>& returned,
                                                  std::vector<wire::TensorSlotArgs>& described) {
  std::vector<wire::Handle> kept;
  auto fail = [&](Status error) {
    for (const auto& handle : kept) tensors.release(handle);
    returned.clear();
    described.clear();
    return error;
  };
  const auto* outputs = run.outputs();
  for (uint32_t i = 0; outputs && i < outputs->size(); ++i) {
    const wire::OutputSpec* spec = outputs->Get(i);
    if (spec->value() >= values.size()) {
      return fail(wire::requestError(ErrorCode::InvalidMessage, fmt::format("RunGraph.outputs[{}]: value {} of a graph with {} values", i,
                                                          spec->value(), values.size())));
    }
    const at::Tensor& value = values[spec->value()];
    const wire::OutputAction action = spec->action();
    if (action != wire::OutputAction::Return) {
      if (!value.defined()) {
        return fail(wire::requestError(ErrorCode::InvalidMessage,
                     fmt::format("RunGraph.outputs[{}]: value {} is None and cannot be kept", i, spec->value())));
      }
      const std::string group = spec->colocation() ? std::string(wire::stringOf(spec->colocation()->group())) : "";
      if (Status error = tensors.store(*spec->handle(), value, spec->residency(), /*reserved=*/false, &group); !error) {
        return fail(wire::requestError(wire::errorCodeOf(error), fmt::format("RunGraph.outputs[{}]: {}", i, error.message())));
      }
      kept.push_back(*spec->handle());
    }
    if (action == wire::OutputAction::Return || action == wire::OutputAction::ReturnAndKeep) {
      returned.emplace_back(spec->handle() ? *spec->handle() : wire::Handle(), value);
    }
    if (action == wire::OutputAction::KeepAndDescribe) {
      wire::TensorSlotArgs slot;
      slot.handle = *spec->handle();
      slot.desc = describe(value);
      slot.residency = spec->residency();
      if (slot.desc.dtype == wire::DType::Undefined) {
        return fail(wire::requestError(ErrorCode::Internal, fmt::format("RunGraph.outputs[{}]: value {} has dtype {}, which the wire "
                                                      "cannot describe", i, spec->value(), c10::toString(value.scalar_type()))));
      }
      described.push_back(std::move(slot));
    }
  }
  return Status::ok();
}

}  // namespace genie::node
