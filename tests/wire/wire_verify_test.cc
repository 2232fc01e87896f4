// verifyMessage on hostile input: sizes, identifier, FlatBuffers structure (truncation,
// random bytes, bit flips) and every semantic rule, each asserting the field it names.
#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "genie/wire/codec.h"
#include "sample_messages.h"

namespace genie::wire {
namespace {

using samples::handle;

/// Bytes in 8-byte aligned storage, as a transport would hand them over.
class AlignedBytes {
 public:
  explicit AlignedBytes(std::span<const std::byte> bytes)
      : words_((bytes.size() + 7) / 8 + 1), size_(bytes.size()) {
    std::memcpy(words_.data(), bytes.data(), bytes.size());
  }
  uint8_t* data() { return reinterpret_cast<uint8_t*>(words_.data()); }
  std::span<const std::byte> span(size_t n) const {
    return std::as_bytes(std::span(reinterpret_cast<const uint8_t*>(words_.data()), n));
  }
  std::span<const std::byte> span() const { return span(size_); }
  size_t size() const { return size_; }

 private:
  std::vector<uint64_t> words_;
  size_t size_;
};

Status verifyStatus(std::span<const std::byte> header, size_t payload_bytes = 0,
                    const VerifyLimits& limits = {}) {
  auto r = verifyMessage(header, payload_bytes, limits);
  return r.isOk() ? Status::ok() : r.status();
}

void expectInvalid(const flatbuffers::DetachedBuffer& buf, size_t payload_bytes,
                   std::string_view want, StatusCode code = StatusCode::kInvalidMessage) {
  const Status st = verifyStatus(bytesOf(buf), payload_bytes);
  ASSERT_FALSE(st.isOk()) << "accepted; wanted: " << want;
  EXPECT_EQ(st.code(), code) << st.toString();
  EXPECT_NE(st.message().find(want), std::string::npos)
      << "message: " << st.message() << "\nwanted: " << want;
}

void expectValid(const flatbuffers::DetachedBuffer& buf, size_t payload_bytes = 0) {
  const Status st = verifyStatus(bytesOf(buf), payload_bytes);
  EXPECT_TRUE(st.isOk()) << st.toString();
}

template <typename T>
flatbuffers::DetachedBuffer finished(flatbuffers::FlatBufferBuilder& fbb,
                                     flatbuffers::Offset<T> body, uint64_t request_id = 1) {
  finishMessage(fbb, request_id, body);
  return fbb.Release();
}

/// A vector of `values` whose elements start 4 bytes off an 8-byte boundary: the 2.0.8
/// Verifier accepts it, the semantic pass must not.
flatbuffers::Offset<flatbuffers::Vector<int64_t>> misalignedInt64s(
    flatbuffers::FlatBufferBuilder& fbb, const std::vector<int64_t>& values) {
  const size_t bytes = values.size() * sizeof(int64_t);
  fbb.ForceVectorAlignment(bytes + 4, 1, 8);
  fbb.StartVector(values.size() * 2, sizeof(int32_t));
  for (auto it = values.rbegin(); it != values.rend(); ++it) {
    fbb.PushElement(static_cast<int32_t>(static_cast<uint64_t>(*it) >> 32));
    fbb.PushElement(static_cast<int32_t>(*it & 0xffffffff));
  }
  return flatbuffers::Offset<flatbuffers::Vector<int64_t>>(fbb.EndVector(values.size()));
}

// ---------------------------------------------------------------------------------------
// A PutTensors (or TensorData / RunResult) whose slot `index` is built from raw fields;
// slots before it are valid.

struct RawSlot {
  std::optional<Handle> handle = samples::handle(1);
  bool with_desc = true;
  DType dtype = DType::Float32;
  std::vector<int64_t> shape{5, 6};
  std::vector<int64_t> strides{};
  bool misaligned_shape = false;
  int64_t storage_offset = 0;
  uint64_t nbytes = 120;
  int8_t memory = 0;
  int32_t device_index = 0;
  int8_t residency = 0;
  uint64_t payload_offset = 0;
  bool remote = false;
  uint64_t remote_length = 120;
  std::vector<uint8_t> rkey{1, 2};
};

flatbuffers::Offset<TensorSlot> rawSlot(flatbuffers::FlatBufferBuilder& fbb, const RawSlot& s) {
  flatbuffers::Offset<TensorDesc> desc = 0;
  if (s.with_desc) {
    auto shape = s.misaligned_shape ? misalignedInt64s(fbb, s.shape) : fbb.CreateVector(s.shape);
    auto strides = s.strides.empty() ? 0 : fbb.CreateVector(s.strides);
    desc = CreateTensorDesc(fbb, s.dtype, shape, strides, s.storage_offset, s.nbytes,
                            static_cast<MemoryKind>(s.memory), s.device_index);
  }
  flatbuffers::Offset<RemoteBuffer> remote = 0;
  if (s.remote) {
    remote = CreateRemoteBuffer(fbb, 0x1000, s.remote_length,
                                s.rkey.empty() ? 0 : fbb.CreateVector(s.rkey));
  }
  return CreateTensorSlot(fbb, s.handle ? &*s.handle : nullptr, desc,
                          static_cast<Residency>(s.residency), s.payload_offset, remote);
}

flatbuffers::DetachedBuffer rawSlots(const RawSlot& bad, size_t index = 0,
                                     Body body = Body::PutTensors) {
  flatbuffers::FlatBufferBuilder fbb;
  std::vector<flatbuffers::Offset<TensorSlot>> slots;
  for (size_t i = 0; i < index; ++i) slots.push_back(rawSlot(fbb, RawSlot{}));
  slots.push_back(rawSlot(fbb, bad));
  auto vec = fbb.CreateVector(slots);
  switch (body) {
    case Body::TensorData: return finished(fbb, CreateTensorData(fbb, vec));
    case Body::RunResult: return finished(fbb, CreateRunResult(fbb, vec, 1));
    default: return finished(fbb, CreatePutTensors(fbb, vec));
  }
}

// ---------------------------------------------------------------------------------------
// Sizes, identifier, alignment, limits

TEST(WireVerify, RejectsHeadersTooSmall) {
  const AlignedBytes zeros(std::as_bytes(std::span(std::vector<uint8_t>(8).data(), 8)));
  for (size_t n = 0; n < kMinHeaderBytes; ++n) {
    const Status st = verifyStatus(zeros.span(n));
    ASSERT_FALSE(st.isOk());
    EXPECT_EQ(st.code(), StatusCode::kInvalidMessage);
    EXPECT_NE(st.message().find(fmt::format("header of {} bytes is too small", n)),
              std::string::npos)
        << st.message();
  }
}

TEST(WireVerify, RejectsOversizedHeaders) {
  auto ping = buildPing(1, 1);
  VerifyLimits tight;
  tight.max_header_bytes = ping.size() - 1;
  const Status st = verifyStatus(bytesOf(ping), 0, tight);
  EXPECT_EQ(st.code(), StatusCode::kTooLarge);
  EXPECT_NE(st.message().find(fmt::format("header of {} bytes exceeds max_header_bytes {}",
                                          ping.size(), ping.size() - 1)),
            std::string::npos)
      << st.message();
  tight.max_header_bytes = ping.size();
  EXPECT_TRUE(verifyStatus(bytesOf(ping), 0, tight).isOk());

  // Default limit: 64 MiB. One word more is refused before anything is read.
  std::vector<uint64_t> big(((size_t{64} << 20) + 8) / 8);
  std::memcpy(big.data(), ping.data(), ping.size());
  const Status big_st = verifyStatus(std::as_bytes(std::span(big)));
  EXPECT_EQ(big_st.code(), StatusCode::kTooLarge) << big_st.toString();
  EXPECT_NE(big_st.message().find("exceeds max_header_bytes 67108864"), std::string::npos);
}

TEST(WireVerify, RejectsOversizedPayloads) {
  auto messages = samples::sampleMessages();
  const auto& put = messages[2];
  ASSERT_EQ(put.body, Body::PutTensors);
  VerifyLimits tight;
  tight.max_payload_bytes = put.payload_bytes - 1;
  const Status st = verifyStatus(bytesOf(put.header), put.payload_bytes, tight);
  EXPECT_EQ(st.code(), StatusCode::kTooLarge);
  EXPECT_NE(st.message().find("exceeds max_payload_bytes"), std::string::npos);
  const Status huge = verifyStatus(bytesOf(put.header), (size_t{64} << 30) + 1);
  EXPECT_EQ(huge.code(), StatusCode::kTooLarge);
}

TEST(WireVerify, RejectsWrongIdentifier) {
  auto ping = buildPing(1, 1);
  AlignedBytes bytes(bytesOf(ping));
  bytes.data()[4] = 'X';
  Status st = verifyStatus(bytes.span());
  EXPECT_EQ(st.code(), StatusCode::kInvalidMessage);
  EXPECT_NE(st.message().find("file identifier is \"XNIE\", expected \"GNIE\""), std::string::npos)
      << st.message();
  std::memset(bytes.data() + 4, 0, 4);
  st = verifyStatus(bytes.span());
  EXPECT_NE(st.message().find("\\x00\\x00\\x00\\x00"), std::string::npos) << st.message();
}

TEST(WireVerify, RejectsUnalignedHeaderStorage) {
  auto ping = buildPing(1, 1);
  std::vector<uint64_t> storage(ping.size() / 8 + 2);
  auto* shifted = reinterpret_cast<uint8_t*>(storage.data()) + 4;
  std::memcpy(shifted, ping.data(), ping.size());
  const Status st = verifyStatus(std::as_bytes(std::span(shifted, ping.size())));
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("not 8-byte aligned"), std::string::npos);
}

TEST(WireVerify, EnforcesDepthAndTableLimits) {
  auto messages = samples::sampleMessages();
  const auto& put = messages[2];
  VerifyLimits shallow;
  shallow.max_depth = 2;  // Message > PutTensors > TensorSlot is already 3
  Status st = verifyStatus(bytesOf(put.header), put.payload_bytes, shallow);
  EXPECT_EQ(st.code(), StatusCode::kInvalidMessage);
  EXPECT_NE(st.message().find("Message: failed FlatBuffers verification"), std::string::npos);
  VerifyLimits few;
  few.max_tables = 4;
  st = verifyStatus(bytesOf(put.header), put.payload_bytes, few);
  EXPECT_NE(st.message().find("more than 4 tables"), std::string::npos) << st.message();

  // The nested Graph is verified under the same limits: the envelope (2 tables) passes,
  // the Graph does not.
  const auto& reg = messages[6];
  ASSERT_EQ(reg.body, Body::RegisterGraph);
  VerifyLimits three;
  three.max_tables = 3;
  st = verifyStatus(bytesOf(reg.header), 0, three);
  EXPECT_NE(st.message().find("RegisterGraph.graph: failed FlatBuffers verification of a Graph"),
            std::string::npos)
      << st.message();
}

// ---------------------------------------------------------------------------------------
// Structure: truncation, random bytes, bit flips

TEST(WireVerify, RejectsEveryTruncation) {
  for (const auto& sample : samples::sampleMessages()) {
    AlignedBytes bytes(bytesOf(sample.header));
    size_t accepted = 0;
    for (size_t n = 0; n < bytes.size(); ++n) {
      const Status st = verifyStatus(bytes.span(n), sample.payload_bytes);
      if (st.isOk()) {
        // Only trailing alignment padding may be cut: nothing the message refers to.
        const auto tail = bytes.span().subspan(n);
        EXPECT_TRUE(
            std::all_of(tail.begin(), tail.end(), [](std::byte b) { return b == std::byte{0}; }))
            << bodyName(sample.body) << " accepted a prefix of " << n << " bytes";
        ++accepted;
        continue;
      }
      EXPECT_TRUE(st.code() == StatusCode::kInvalidMessage) << st.toString();
    }
    EXPECT_LE(accepted, 7u) << bodyName(sample.body);
  }
}

TEST(WireVerify, RejectsRandomBuffers) {
  std::mt19937_64 rng(20240601);
  size_t rejected = 0;
  for (int i = 0; i < 6000; ++i) {
    const size_t n = rng() % 600;
    std::vector<uint64_t> words(n / 8 + 1);
    for (auto& w : words) w = rng();
    auto* bytes = reinterpret_cast<uint8_t*>(words.data());
    if (i % 3 >= 1 && n >= 8) std::memcpy(bytes + 4, "GNIE", 4);  // past the identifier
    if (i % 3 == 2 && n >= 16) {                                  // and a plausible root offset
      const uint32_t root = 8 + 4 * static_cast<uint32_t>(rng() % ((n - 8) / 4));
      std::memcpy(bytes, &root, 4);
    }
    const Status st = verifyStatus(std::as_bytes(std::span(bytes, n)), rng() % 4096);
    ASSERT_FALSE(st.isOk()) << "random buffer " << i << " of " << n << " bytes accepted";
    ASSERT_TRUE(st.code() == StatusCode::kInvalidMessage) << st.toString();
    ASSERT_FALSE(st.message().empty());
    ++rejected;
  }
  EXPECT_EQ(rejected, 6000u);
}

/// What must hold for any message verifyMessage accepted.
void expectConsistent(const Message& m, size_t payload_bytes) {
  auto slots = [&](const flatbuffers::Vector<flatbuffers::Offset<TensorSlot>>* v) {
    for (uint32_t i = 0; v && i < v->size(); ++i) {
      const TensorSlot* s = v->Get(i);
      ASSERT_NE(s->desc(), nullptr);
      auto span = tensorSpanBytes(*s->desc());
      ASSERT_TRUE(span.isOk());
      EXPECT_EQ(span.value(), s->desc()->nbytes());
      if (!s->remote()) {
        EXPECT_LE(s->payload_offset() + s->desc()->nbytes(), payload_bytes);
      }
    }
  };
  switch (m.body_type()) {
    case Body::PutTensors: slots(m.body_as_PutTensors()->tensors()); break;
    case Body::TensorData: slots(m.body_as_TensorData()->tensors()); break;
    case Body::RunResult: {
      slots(m.body_as_RunResult()->outputs());
      const auto* described = m.body_as_RunResult()->described();
      for (uint32_t i = 0; described && i < described->size(); ++i) {
        const TensorSlot* s = described->Get(i);
        ASSERT_NE(s->handle(), nullptr);
        EXPECT_FALSE(isNull(*s->handle()));
        ASSERT_NE(s->desc(), nullptr);
        auto span = tensorSpanBytes(*s->desc());
        ASSERT_TRUE(span.isOk());
        EXPECT_EQ(span.value(), s->desc()->nbytes());
        EXPECT_EQ(s->payload_offset(), 0u);
        EXPECT_EQ(s->remote(), nullptr);
      }
      break;
    }
    case Body::RunGraph: {
      const auto* free = m.body_as_RunGraph()->free();
      for (uint32_t i = 0; free && i < free->size(); ++i) EXPECT_FALSE(isNull(*free->Get(i)));
      break;
    }
    case Body::RegisterGraph: {
      const auto* g = m.body_as_RegisterGraph()->graph();
      auto graph = verifyGraph(std::as_bytes(std::span(g->data(), g->size())));
      EXPECT_TRUE(graph.isOk()) << graph.status().toString();
      break;
    }
    case Body::SendTensors: {
      const SendTensors* send = m.body_as_SendTensors();
      ASSERT_NE(send->peer(), nullptr);
      EXPECT_GT(send->peer()->size(), 0u);
      ASSERT_NE(send->peer_session(), nullptr);
      EXPECT_FALSE(isNull(*send->peer_session()));
      ASSERT_NE(send->handles(), nullptr);
      ASSERT_NE(send->peer_handles(), nullptr);
      ASSERT_EQ(send->handles()->size(), send->peer_handles()->size());
      for (uint32_t i = 0; i < send->handles()->size(); ++i) {
        EXPECT_FALSE(isNull(*send->handles()->Get(i)));
        EXPECT_FALSE(isNull(*send->peer_handles()->Get(i)));
      }
      EXPECT_EQ(payload_bytes, 0u);
      break;
    }
    default: EXPECT_NE(m.body(), nullptr);
  }
}

TEST(WireVerify, SurvivesEveryBitFlip) {
  size_t accepted = 0, rejected = 0;
  for (const auto& sample : samples::sampleMessages()) {
    AlignedBytes bytes(bytesOf(sample.header));
    for (size_t bit = 0; bit < bytes.size() * 8; ++bit) {
      bytes.data()[bit / 8] ^= static_cast<uint8_t>(1u << (bit % 8));
      auto r = verifyMessage(bytes.span(), sample.payload_bytes);
      if (r.isOk()) {
        ++accepted;
        expectConsistent(*r.value(), sample.payload_bytes);
      } else {
        ++rejected;
        ASSERT_TRUE(r.status().code() == StatusCode::kInvalidMessage ||
                    r.status().code() == StatusCode::kTooLarge)
            << r.status().toString();
        ASSERT_FALSE(r.status().message().empty());
      }
      bytes.data()[bit / 8] ^= static_cast<uint8_t>(1u << (bit % 8));
    }
    ASSERT_TRUE(verifyStatus(bytes.span(), sample.payload_bytes).isOk());  // restored
  }
  // Flips in values (ids, sizes, names) are legal; flips in offsets and enums are not.
  EXPECT_GT(accepted, 0u);
  EXPECT_GT(rejected, 0u);
}

// ---------------------------------------------------------------------------------------
// Semantics: tensors

TEST(WireVerifySemantics, NbytesMustMatchShape) {
  RawSlot s;
  s.nbytes = 100;
  expectInvalid(rawSlots(s, 3), 120,
                "PutTensors.tensors[3].desc: nbytes 100 does not match shape [5,6] of Float32 "
                "(120 bytes)");
  RawSlot strided;
  strided.strides = {12, 2};
  strided.storage_offset = 3;
  expectInvalid(rawSlots(strided), 1024,
                "PutTensors.tensors[0].desc: nbytes 120 does not match shape [5,6] strides "
                "[12,2] storage_offset 3 of Float32 (248 bytes)");
  strided.nbytes = 248;
  expectValid(rawSlots(strided), 248);
}

TEST(WireVerifySemantics, HandleRequiredAndNotNull) {
  RawSlot missing;
  missing.handle.reset();
  expectInvalid(rawSlots(missing), 120, "PutTensors.tensors[0].handle: missing (required)");
  RawSlot null;
  null.handle = Handle();
  expectInvalid(rawSlots(null, 1), 120,
                "PutTensors.tensors[1].handle: {0,0} is not a valid handle");
  expectInvalid(rawSlots(null, 0, Body::TensorData), 120, "TensorData.tensors[0].handle");
  // RunResult outputs returned without being kept have no handle.
  expectValid(rawSlots(missing, 0, Body::RunResult), 120);
  expectValid(rawSlots(null, 0, Body::RunResult), 120);
}

TEST(WireVerifySemantics, DescRequiredAndWellFormed) {
  RawSlot s;
  s.with_desc = false;
  expectInvalid(rawSlots(s), 120, "PutTensors.tensors[0].desc: missing (required)");
  s = RawSlot{};
  s.dtype = DType::Undefined;
  expectInvalid(rawSlots(s), 120,
                "PutTensors.tensors[0].desc: dtype Undefined is not a defined element type");
  s.dtype = static_cast<DType>(100);
  expectInvalid(rawSlots(s), 120, "PutTensors.tensors[0].desc: dtype DType(100)");
  s = RawSlot{};
  s.shape = {5, -6};
  expectInvalid(rawSlots(s), 120, "PutTensors.tensors[0].desc: shape[1] is -6 (negative)");
  s = RawSlot{};
  s.strides = {1};
  expectInvalid(rawSlots(s), 120,
                "PutTensors.tensors[0].desc: strides has rank 1 but shape [5,6] has rank 2");
  s = RawSlot{};
  s.strides = {6, -1};
  expectInvalid(rawSlots(s), 120, "PutTensors.tensors[0].desc: strides[1] is -1 (negative)");
  s = RawSlot{};
  s.storage_offset = -1;
  expectInvalid(rawSlots(s), 120, "PutTensors.tensors[0].desc: storage_offset -1 is negative");
  s = RawSlot{};
  s.memory = 5;
  expectInvalid(rawSlots(s), 120, "PutTensors.tensors[0].desc.memory: 5 is not a MemoryKind");
  s = RawSlot{};
  s.device_index = -1;
  expectInvalid(rawSlots(s), 120, "PutTensors.tensors[0].desc.device_index: -1 is negative");
  s = RawSlot{};
  s.shape = {1ll << 40, 1ll << 40};
  expectInvalid(rawSlots(s), 120, "overflows int64");
  s = RawSlot{};
  s.residency = 9;
  expectInvalid(rawSlots(s), 120, "PutTensors.tensors[0].residency: 9 is not a Residency");
}

TEST(WireVerifySemantics, VectorsOfWideScalarsMustBeAligned) {
  RawSlot s;
  s.misaligned_shape = true;
  expectInvalid(rawSlots(s), 120,
                "PutTensors.tensors[0].desc.shape: elements are not 8-byte aligned");
  s.misaligned_shape = false;
  expectValid(rawSlots(s), 120);
  // An empty vector has no element to misread: accepted wherever it sits (builders do not
  // always 8-byte align an empty [int64], e.g. an empty IntListValue).
  s.misaligned_shape = true;
  s.shape = {};
  s.nbytes = 4;
  expectValid(rawSlots(s), 120);
}

TEST(WireVerifySemantics, PayloadOffsetsAlignedAndInside) {
  RawSlot s;
  s.payload_offset = 32;
  expectInvalid(rawSlots(s), 256,
                "PutTensors.tensors[0].payload_offset: 32 is not a multiple of 64");
  s.payload_offset = 64;
  expectValid(rawSlots(s), 184);
  expectInvalid(
      rawSlots(s), 183,
      "PutTensors.tensors[0]: payload_offset 64 + nbytes 120 exceeds the payload of 183 bytes");
  s.payload_offset = ~uint64_t{0} - 63;  // offset + nbytes would wrap around
  expectInvalid(rawSlots(s), 1 << 20, "exceeds the payload of 1048576 bytes");
}

TEST(WireVerifySemantics, RemoteSlotsSkipThePayload) {
  RawSlot s;
  s.remote = true;
  s.payload_offset = 12345;  // ignored: the bytes move by RMA
  expectValid(rawSlots(s), 0);
  s.rkey.clear();
  expectInvalid(rawSlots(s), 0, "PutTensors.tensors[0].remote.rkey: missing (required)");
  s.rkey = {1};
  s.remote_length = 100;
  expectInvalid(rawSlots(s), 0,
                "PutTensors.tensors[0].remote.length: 100 is less than the tensor's nbytes 120");
}

// ---------------------------------------------------------------------------------------
// Semantics: envelope and bodies

TEST(WireVerifySemantics, BodyMustBeKnownAndPresent) {
  {
    flatbuffers::FlatBufferBuilder fbb;
    fbb.Finish(CreateMessage(fbb, 1, Body::NONE, 0), MessageIdentifier());
    expectInvalid(fbb.Release(), 0, "Message.body: NONE");
  }
  {
    flatbuffers::FlatBufferBuilder fbb;
    auto ack = CreateAck(fbb, 1).Union();
    fbb.Finish(CreateMessage(fbb, 1, static_cast<Body>(200), ack), MessageIdentifier());
    expectInvalid(fbb.Release(), 0, "Message.body: type 200 is not a known Body");
  }
  {
    flatbuffers::FlatBufferBuilder fbb;
    finishMessage(fbb, 1, Body::Ack, 0);
    expectInvalid(fbb.Release(), 0, "Ack: missing body table");
  }
}

TEST(WireVerifySemantics, BodiesWithoutTensorsTakeNoPayload) {
  expectInvalid(buildAck(1, 2), 1, "Ack: carries no tensors but payload_bytes is 1");
  expectInvalid(buildHello(1, "a", "b", 1), 64,
                "Hello: carries no tensors but payload_bytes is 64");
  const Handle one[] = {handle(1)};
  expectInvalid(buildGetTensors(1, one), 8,
                "GetTensors: carries no tensors but payload_bytes is 8");
  expectValid(buildAck(1, 2), 0);
}

TEST(WireVerifySemantics, PingAndPongPayloadsAreOpaque) {
  expectValid(buildPing(1, 2), 0);
  expectValid(buildPing(1, 2), 4096);
  expectValid(buildPong(1, 2), 4096);
}

TEST(WireVerifySemantics, WelcomeNeedsASession) {
  WelcomeArgs w;
  expectInvalid(buildWelcome(1, w), 0, "Welcome.session_id: {0,0} is not a valid handle");
  flatbuffers::FlatBufferBuilder fbb;
  expectInvalid(finished(fbb, CreateWelcome(fbb, 1, nullptr)), 0,
                "Welcome.session_id: missing (required)");
}

TEST(WireVerifySemantics, GetAndFreeHandles) {
  const Handle with_null[] = {handle(1), Handle()};
  expectInvalid(buildGetTensors(1, with_null), 0,
                "GetTensors.handles[1]: {0,0} is not a valid handle");
  expectInvalid(buildFreeTensors(1, std::span(with_null).subspan(1)), 0,
                "FreeTensors.handles[0]: {0,0} is not a valid handle");
  const Handle two[] = {handle(1), handle(2)};
  const RemoteBufferArgs one[] = {{1, 2, {3}, MemoryKind::Host}};
  expectInvalid(buildGetTensors(1, two, one), 0,
                "GetTensors.remote: has 1 entries but handles has 2");
  const RemoteBufferArgs no_rkey[] = {{1, 2, {3}, MemoryKind::Host}, {1, 2, {}, MemoryKind::Host}};
  expectInvalid(buildGetTensors(1, two, no_rkey), 0,
                "GetTensors.remote[1].rkey: missing (required)");
  expectValid(buildFreeTensors(1, {}));
  // Misaligned Handle structs.
  flatbuffers::FlatBufferBuilder fbb;
  fbb.ForceVectorAlignment(sizeof(Handle) + 4, 1, 8);
  fbb.StartVector(4, sizeof(uint32_t));
  for (uint32_t w : {0u, 1u, 0u, 1u}) fbb.PushElement(w);
  flatbuffers::Offset<flatbuffers::Vector<const Handle*>> handles(fbb.EndVector(1));
  expectInvalid(finished(fbb, CreateFreeTensors(fbb, handles)), 0,
                "FreeTensors.handles: elements are not 8-byte aligned");
}

TEST(WireVerifySemantics, RegisterGraphNeedsAValidNestedGraph) {
  {
    flatbuffers::FlatBufferBuilder fbb;
    expectInvalid(finished(fbb, CreateRegisterGraph(fbb)), 0,
                  "RegisterGraph.graph: missing (required)");
  }
  {
    std::byte junk[16];
    std::fill(std::begin(junk), std::end(junk), std::byte{0xff});
    expectInvalid(buildRegisterGraph(1, junk), 0,
                  "RegisterGraph.graph: failed FlatBuffers verification of a Graph");
  }
  {
    samples::GraphMaker g;
    g.tensorInput(DType::Float32, {2});
    g.node("aten::add", "Tensor", {g.tensor(0), g.tensor(1)});
    auto graph = g.finish();
    expectInvalid(buildRegisterGraph(1, bytesOf(graph)), 0,
                  "RegisterGraph.graph.nodes[0].args[1].value: TensorValue 1 is not defined "
                  "before this node (ids 0..0 are)");
  }
  {
    // The nested Graph 4 bytes off an 8-byte boundary.
    auto graph = samples::sampleGraph();
    flatbuffers::FlatBufferBuilder fbb;
    fbb.ForceVectorAlignment(graph.size() + 4, 1, 8);
    auto bytes = fbb.CreateVector(graph.data(), graph.size());
    expectInvalid(finished(fbb, CreateRegisterGraph(fbb, bytes)), 0,
                  "RegisterGraph.graph: nested Graph at header offset");
  }
}

TEST(WireVerifySemantics, GraphRegisteredNeedsAnId) {
  flatbuffers::FlatBufferBuilder fbb;
  expectInvalid(finished(fbb, CreateGraphRegistered(fbb, nullptr, 1)), 0,
                "GraphRegistered.graph_id: missing (required)");
}

TEST(WireVerifySemantics, RunGraphBindings) {
  auto run = [](auto&& fill) {
    flatbuffers::FlatBufferBuilder fbb;
    const GraphId id(1, 2);
    std::vector<flatbuffers::Offset<InputBinding>> inputs;
    std::vector<flatbuffers::Offset<ScalarBinding>> scalars;
    std::vector<flatbuffers::Offset<OutputSpec>> outputs;
    const GraphId* gid = &id;
    fill(fbb, inputs, scalars, outputs, gid);
    return finished(fbb, CreateRunGraph(fbb, gid, fbb.CreateVector(inputs),
                                        fbb.CreateVector(scalars), fbb.CreateVector(outputs)));
  };
  expectValid(run([](auto&...) {}));
  expectInvalid(run([](auto&, auto&, auto&, auto&, const GraphId*& gid) { gid = nullptr; }), 0,
                "RunGraph.graph_id: missing (required)");
  const Handle null;
  expectInvalid(run([&](auto& fbb, auto& in, auto&...) {
                  in.push_back(CreateInputBinding(fbb, 0, BindingKind::Handle, &null));
                }),
                0, "RunGraph.inputs[0].handle: {0,0} is not a valid handle");
  expectInvalid(run([&](auto& fbb, auto& in, auto&...) {
                  in.push_back(CreateInputBinding(fbb, 0, BindingKind::Inline));
                }),
                0, "RunGraph.inputs[0].inline: missing (required)");
  expectInvalid(run([&](auto& fbb, auto& in, auto&...) {
                  in.push_back(CreateInputBinding(fbb, 0, static_cast<BindingKind>(7)));
                }),
                0, "RunGraph.inputs[0].kind: 7 is not a BindingKind");
  expectInvalid(
      run([&](auto& fbb, auto& in, auto&...) {
        RawSlot s;
        s.handle.reset();
        in.push_back(CreateInputBinding(fbb, 0, BindingKind::Inline, nullptr, rawSlot(fbb, s)));
      }),
      100,
      "RunGraph.inputs[0].inline: payload_offset 0 + nbytes 120 exceeds the payload of 100 bytes");
  expectInvalid(run([&](auto& fbb, auto&, auto& sc, auto&...) {
                  auto v = CreateStringValue(fbb, fbb.CreateString("x")).Union();
                  sc.push_back(CreateScalarBinding(fbb, 0, Value::StringValue, v));
                }),
                0,
                "RunGraph.scalars[0].value: StringValue is not IntValue, DoubleValue or BoolValue");
  expectInvalid(
      run([&](auto& fbb, auto&, auto& sc, auto&...) { sc.push_back(CreateScalarBinding(fbb, 0)); }),
      0, "RunGraph.scalars[0].value: NONE is not IntValue");
  expectInvalid(run([&](auto& fbb, auto&, auto& sc, auto&...) {
                  sc.push_back(CreateScalarBinding(fbb, 0, Value::IntValue, 0));
                }),
                0, "RunGraph.scalars[0].value: missing IntValue table");
  expectInvalid(run([&](auto& fbb, auto&, auto&, auto& out, auto&) {
                  out.push_back(CreateOutputSpec(fbb, 3, OutputAction::KeepResident));
                }),
                0, "RunGraph.outputs[0].handle: missing (required)");
  expectInvalid(run([&](auto& fbb, auto&, auto&, auto& out, auto&) {
                  out.push_back(CreateOutputSpec(fbb, 3, static_cast<OutputAction>(9)));
                }),
                0, "RunGraph.outputs[0].action: 9 is not an OutputAction");
  expectInvalid(run([&](auto& fbb, auto&, auto&, auto& out, auto&) {
                  out.push_back(CreateOutputSpec(fbb, 3, OutputAction::Return, nullptr,
                                                 static_cast<Residency>(4)));
                }),
                0, "RunGraph.outputs[0].residency: 4 is not a Residency");
  expectInvalid(run([&](auto& fbb, auto&, auto&, auto& out, auto&) {
                  out.push_back(CreateOutputSpec(fbb, 3, OutputAction::KeepAndDescribe));
                }),
                0, "RunGraph.outputs[0].handle: missing (required)");
  expectInvalid(run([&](auto& fbb, auto&, auto&, auto& out, auto&) {
                  out.push_back(CreateOutputSpec(fbb, 3, OutputAction::KeepAndDescribe, &null));
                }),
                0, "RunGraph.outputs[0].handle: {0,0} is not a valid handle");
  const Handle h(1, 1);
  auto colocated = [&](std::string group) {
    return run([&](auto& fbb, auto&, auto&, auto& out, auto&) {
      out.push_back(CreateOutputSpec(fbb, 3, OutputAction::KeepResident, &h, Residency::StatefulKvCache,
                                     CreateColocation(fbb, fbb.CreateString(group), 1024)));
    });
  };
  expectValid(colocated("GPT2LMHeadModel#1"));
  expectValid(colocated(std::string(kMaxColocationGroupBytes, 'g')));
  expectInvalid(colocated(""), 0, "RunGraph.outputs[0].colocation.group: 0 bytes, not 1..256");
  expectInvalid(colocated(std::string(kMaxColocationGroupBytes + 1, 'g')), 0,
                "RunGraph.outputs[0].colocation.group: 257 bytes, not 1..256");
}

TEST(WireVerifySemantics, RunGraphFree) {
  auto run = [](std::vector<Handle> free) {
    flatbuffers::FlatBufferBuilder fbb;
    const GraphId id(1, 2);
    auto free_vec = fbb.CreateVectorOfStructs(free.data(), free.size());
    return finished(fbb, CreateRunGraph(fbb, &id, 0, 0, 0, free_vec));
  };
  expectValid(run({}));
  expectValid(run({samples::handle(1), samples::handle(2)}));
  expectInvalid(run({samples::handle(1), Handle()}), 0,
                "RunGraph.free[1]: {0,0} is not a valid handle");
  // free rides on a run: the inline inputs' payload is still allowed beside it.
  RunGraphArgs args;
  args.graph_id = GraphId(1, 2);
  args.free = {samples::handle(3)};
  TensorSlotArgs small;
  small.desc = {.dtype = DType::Int32, .shape = {2}};
  args.inputs.push_back({0, Handle(), small});
  auto built = buildRunGraph(1, args);
  ASSERT_TRUE(built.isOk());
  expectValid(built.value(), 8);
}

TEST(WireVerifySemantics, RunResultDescribedSlots) {
  // described slots: handle required, descriptor consistent, no bytes (offset 0, no remote),
  // whatever the payload holds for `outputs`.
  auto result = [](const RawSlot& d) {
    flatbuffers::FlatBufferBuilder fbb;
    std::vector<flatbuffers::Offset<TensorSlot>> described = {rawSlot(fbb, RawSlot{}),
                                                              rawSlot(fbb, d)};
    return finished(fbb, CreateRunResult(fbb, 0, 1, fbb.CreateVector(described)));
  };
  expectValid(result(RawSlot{}), 0);  // 120 bytes described, none in the payload
  RawSlot missing;
  missing.handle.reset();
  expectInvalid(result(missing), 0, "RunResult.described[1].handle: missing (required)");
  RawSlot null;
  null.handle = Handle();
  expectInvalid(result(null), 0, "RunResult.described[1].handle: {0,0} is not a valid handle");
  RawSlot offset;
  offset.payload_offset = 64;
  expectInvalid(result(offset), 256, "RunResult.described[1].payload_offset: 64 for a described tensor");
  RawSlot remote;
  remote.remote = true;
  expectInvalid(result(remote), 0, "RunResult.described[1].remote: set for a described tensor");
  RawSlot bad_desc;
  bad_desc.nbytes = 100;
  expectInvalid(result(bad_desc), 0,
                "RunResult.described[1].desc: nbytes 100 does not match shape [5,6] of Float32");
  RawSlot no_desc;
  no_desc.with_desc = false;
  expectInvalid(result(no_desc), 0, "RunResult.described[1].desc: missing (required)");
  RawSlot residency;
  residency.residency = 9;
  expectInvalid(result(residency), 0, "RunResult.described[1].residency: 9 is not a Residency");
}

TEST(WireVerifySemantics, BoundGraphInputs) {
  // GraphInput.handle is optional; {0,0} means "not bound".
  samples::GraphMaker g;
  g.tensorInput(DType::Float32, {2}, samples::handle(4));
  g.tensorInput(DType::Float32, {2}, Handle());
  g.node("aten::add", "Tensor", {g.tensor(0), g.tensor(1)});
  auto bytes = g.finish();
  auto graph = verifyGraph(bytesOf(bytes));
  ASSERT_TRUE(graph.isOk()) << graph.status().toString();
  ASSERT_NE(graph.value()->inputs()->Get(0)->handle(), nullptr);
  EXPECT_TRUE(*graph.value()->inputs()->Get(0)->handle() == samples::handle(4));
  EXPECT_EQ(graph.value()->inputs()->Get(1)->handle(), nullptr);
  expectValid(buildRegisterGraph(1, bytesOf(bytes)));
}

TEST(WireVerifySemantics, SendTensorsNamesAPeerASessionAndPairedHandles) {
  const SendTensorsArgs good{"127.0.0.1:7070", "t", handle(9), {handle(1), handle(2)}, {handle(3), handle(4)}};
  expectValid(buildSendTensors(1, good));
  expectInvalid(buildSendTensors(1, good), 16, "SendTensors: carries no tensors but payload_bytes is 16");
  auto bad = good;
  bad.peer = "";
  expectInvalid(buildSendTensors(1, bad), 0, "SendTensors.peer: missing (required)");
  bad = good;
  bad.peer = std::string(kMaxPeerChars + 1, 'h');
  expectInvalid(buildSendTensors(1, bad), 0, "SendTensors.peer: is 513 chars (at most 512)");
  bad = good;
  bad.auth_token = std::string(kMaxPeerTokenChars + 1, 't');
  expectInvalid(buildSendTensors(1, bad), 0, "SendTensors.auth_token: is 2049 chars (at most 2048)");
  bad = good;
  bad.peer_session = Handle();
  expectInvalid(buildSendTensors(1, bad), 0, "SendTensors.peer_session: missing (required)");
  bad = good;
  bad.handles.clear();
  bad.peer_handles.clear();
  expectInvalid(buildSendTensors(1, bad), 0, "SendTensors.handles: missing (required)");
  bad = good;
  bad.peer_handles.pop_back();
  expectInvalid(buildSendTensors(1, bad), 0, "SendTensors.peer_handles: has 1 entries but handles has 2");
  bad = good;
  bad.handles[1] = Handle();
  expectInvalid(buildSendTensors(1, bad), 0, "SendTensors.handles[1]: {0,0} is not a valid handle");
  bad = good;
  bad.peer_handles[0] = Handle();
  expectInvalid(buildSendTensors(1, bad), 0, "SendTensors.peer_handles[0]: {0,0} is not a valid handle");
  // A {0,0} peer_session written explicitly (the builder leaves it out) is refused too.
  flatbuffers::FlatBufferBuilder fbb;
  const Handle null_session;
  auto peer = fbb.CreateString("h:1");
  auto handles = fbb.CreateVectorOfStructs(good.handles.data(), good.handles.size());
  auto peer_handles = fbb.CreateVectorOfStructs(good.peer_handles.data(), good.peer_handles.size());
  expectInvalid(finished(fbb, CreateSendTensors(fbb, peer, 0, &null_session, handles, peer_handles)), 0,
                "SendTensors.peer_session: {0,0} is not a valid handle");
}

TEST(WireVerifySemantics, HelloAttachSessionIsOptional) {
  expectValid(buildHello(1, "a", "b", 1));
  expectValid(buildHello(1, "a", "b", 1, kProtocolVersion, handle(5)));
}

TEST(WireVerifySemantics, StatsRequestPartsAreBounded) {
  std::vector<GraphId> ids(kMaxStatsParts, GraphId(1, 2));
  expectValid(buildStatsRequest(1, ids));
  ids.emplace_back(3, 4);
  expectInvalid(buildStatsRequest(1, ids), 0, "StatsRequest.parts: 1025 graph ids, more than 1024");
}

TEST(WireVerifySemantics, StatsResidency) {
  StatsArgs s;
  s.resident = {{Residency::Gradient, 1}, {static_cast<Residency>(7), 2}};
  expectInvalid(buildStats(1, s), 0, "Stats.resident[1].residency: 7 is not a Residency");
}

}  // namespace
}  // namespace genie::wire
