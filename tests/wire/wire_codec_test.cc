// Builders and readers of the wire codec: every Body type round-trips (build, verify, read
// back every field), plus names, sizes, tensor spans, handles and graph hashing.
#include <gtest/gtest.h>
#include <xxhash.h>

#include <cmath>
#include <cstring>
#include <unordered_map>

#include "genie/wire/codec.h"
#include "sample_messages.h"

namespace genie::wire {
namespace {

using samples::handle;

const Message* mustVerify(const flatbuffers::DetachedBuffer& buf, size_t payload_bytes = 0) {
  auto r = verifyMessage(bytesOf(buf), payload_bytes);
  EXPECT_TRUE(r.isOk()) << r.status().toString();
  return r.isOk() ? r.value() : nullptr;
}
// The Message points into the buffer: a temporary buffer would leave it dangling.
const Message* mustVerify(flatbuffers::DetachedBuffer&& buf, size_t payload_bytes = 0) = delete;

std::vector<int64_t> toVector(const flatbuffers::Vector<int64_t>* v) {
  return v ? std::vector<int64_t>(v->begin(), v->end()) : std::vector<int64_t>();
}

void expectHandle(const Handle* h, const Handle& want) {
  ASSERT_NE(h, nullptr);
  EXPECT_EQ(h->hi(), want.hi());
  EXPECT_EQ(h->lo(), want.lo());
}

TEST(WireConstants, MatchSchema) {
  EXPECT_EQ(kProtocolVersion, 1u);
  EXPECT_EQ(kFileIdentifier, std::string_view(MessageIdentifier()));
  EXPECT_EQ(kPayloadAlignment, 64u);
  VerifyLimits limits;
  EXPECT_EQ(limits.max_header_bytes, 64u << 20);
  EXPECT_EQ(limits.max_depth, 64u);
  EXPECT_EQ(limits.max_tables, 1'000'000u);
  EXPECT_EQ(limits.max_payload_bytes, uint64_t{64} << 30);
}

TEST(WireNames, DTypeSizesAndNames) {
  EXPECT_EQ(dtypeSize(DType::Undefined), 0u);
  EXPECT_EQ(dtypeSize(DType::Float32), 4u);
  EXPECT_EQ(dtypeSize(DType::Float64), 8u);
  EXPECT_EQ(dtypeSize(DType::Float16), 2u);
  EXPECT_EQ(dtypeSize(DType::BFloat16), 2u);
  EXPECT_EQ(dtypeSize(DType::Int8), 1u);
  EXPECT_EQ(dtypeSize(DType::Int16), 2u);
  EXPECT_EQ(dtypeSize(DType::Int32), 4u);
  EXPECT_EQ(dtypeSize(DType::Int64), 8u);
  EXPECT_EQ(dtypeSize(DType::UInt8), 1u);
  EXPECT_EQ(dtypeSize(DType::Bool), 1u);
  EXPECT_EQ(dtypeSize(DType::Complex64), 8u);
  EXPECT_EQ(dtypeSize(DType::Complex128), 16u);
  EXPECT_EQ(dtypeSize(DType::Float8_e4m3fn), 1u);
  EXPECT_EQ(dtypeSize(DType::Float8_e5m2), 1u);
  EXPECT_EQ(dtypeSize(DType::UInt16), 2u);
  EXPECT_EQ(dtypeSize(DType::UInt32), 4u);
  EXPECT_EQ(dtypeSize(DType::UInt64), 8u);
  EXPECT_EQ(dtypeSize(DType::ComplexHalf), 4u);
  EXPECT_EQ(dtypeSize(DType::Float8_e4m3fnuz), 1u);
  EXPECT_EQ(dtypeSize(DType::Float8_e5m2fnuz), 1u);
  EXPECT_EQ(dtypeSize(DType::Float8_e8m0fnu), 1u);
  EXPECT_EQ(dtypeSize(DType::Float4_e2m1fn_x2), 1u);
  EXPECT_EQ(dtypeSize(DType::Bits1x8), 1u);
  EXPECT_EQ(dtypeSize(DType::Bits8), 1u);
  EXPECT_EQ(dtypeSize(DType::Bits16), 2u);
  EXPECT_EQ(dtypeSize(DType::QUInt8), 1u);
  EXPECT_EQ(dtypeSize(DType::QInt32), 4u);
  EXPECT_EQ(dtypeSize(static_cast<DType>(100)), 0u);
  EXPECT_EQ(dtypeName(DType::Float32), "Float32");
  EXPECT_EQ(dtypeName(DType::Float8_e4m3fn), "Float8_e4m3fn");
  EXPECT_EQ(dtypeName(static_cast<DType>(-3)), "unknown");
}

TEST(WireNames, BodyAndErrorCodeNames) {
  EXPECT_EQ(bodyName(Body::NONE), "NONE");
  EXPECT_EQ(bodyName(Body::PutTensors), "PutTensors");
  EXPECT_EQ(bodyName(Body::Goodbye), "Goodbye");
  EXPECT_EQ(bodyName(static_cast<Body>(200)), "unknown");
  EXPECT_EQ(errorCodeName(ErrorCode::UnknownHandle), "UnknownHandle");
  EXPECT_EQ(errorCodeName(static_cast<ErrorCode>(999)), "unknown");
  EXPECT_EQ(stringOf(nullptr), "");
}

TEST(WireTensorSpan, ContiguousStridedOffsetAndEmpty) {
  const int64_t shape[] = {5, 6};
  EXPECT_EQ(tensorSpanBytes(DType::Float32, shape).value(), 120u);
  const int64_t strides[] = {12, 2};  // every other column of a [5,12] storage
  EXPECT_EQ(tensorSpanBytes(DType::Float32, shape, strides).value(), (4 * 12 + 5 * 2 + 1) * 4u);
  EXPECT_EQ(tensorSpanBytes(DType::Float32, shape, {}, 10).value(), (30u + 10) * 4);
  const int64_t expanded[] = {0, 1};  // broadcast rows: one row of storage
  EXPECT_EQ(tensorSpanBytes(DType::Int64, shape, expanded).value(), 6u * 8);
  const int64_t empty[] = {3, 0, 4};
  EXPECT_EQ(tensorSpanBytes(DType::Float64, empty, {}, 7).value(), 0u);
  EXPECT_EQ(tensorSpanBytes(DType::Complex128, {}).value(), 16u);  // a 0-dim scalar
}

TEST(WireTensorSpan, RejectsBadDescriptions) {
  const int64_t shape[] = {5, 6};
  auto undefined = tensorSpanBytes(DType::Undefined, shape);
  ASSERT_FALSE(undefined.isOk());
  EXPECT_EQ(undefined.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(undefined.status().message().find("dtype Undefined"), std::string::npos);

  const int64_t negative[] = {5, -1};
  EXPECT_NE(tensorSpanBytes(DType::Float32, negative).status().message().find("shape[1] is -1"),
            std::string::npos);
  const int64_t one_stride[] = {1};
  EXPECT_NE(tensorSpanBytes(DType::Float32, shape, one_stride)
                .status()
                .message()
                .find("strides has rank 1 but shape [5,6] has rank 2"),
            std::string::npos);
  const int64_t neg_stride[] = {1, -1};
  EXPECT_NE(tensorSpanBytes(DType::Float32, shape, neg_stride)
                .status()
                .message()
                .find("strides[1] is -1"),
            std::string::npos);
  EXPECT_NE(tensorSpanBytes(DType::Float32, shape, {}, -4)
                .status()
                .message()
                .find("storage_offset -4 is negative"),
            std::string::npos);
  const int64_t huge[] = {int64_t{1} << 40, int64_t{1} << 30};
  EXPECT_NE(tensorSpanBytes(DType::Float32, huge).status().message().find("overflows int64"),
            std::string::npos);
  const int64_t huge_stride[] = {int64_t{1} << 62, int64_t{1} << 62};
  const int64_t two[] = {3, 3};
  EXPECT_FALSE(tensorSpanBytes(DType::Int8, two, huge_stride).isOk());
  EXPECT_FALSE(tensorSpanBytes(DType::Int8, two, {}, std::numeric_limits<int64_t>::max()).isOk());
  std::vector<int64_t> rank65(65, 1);
  EXPECT_NE(tensorSpanBytes(DType::Int8, rank65).status().message().find("rank 65 is over 64"),
            std::string::npos);
}

TEST(WirePayloadLayout, AlignsEveryTensor) {
  PayloadLayout layout;
  EXPECT_EQ(layout.add(24), 0u);
  EXPECT_EQ(layout.size(), 24u);
  EXPECT_EQ(layout.add(64), 64u);
  EXPECT_EQ(layout.add(1), 128u);
  EXPECT_EQ(layout.add(0), 192u);
  EXPECT_EQ(layout.size(), 192u);
}

TEST(WireHandle, NullEqualityHashAndString) {
  EXPECT_TRUE(isNull(Handle()));
  EXPECT_FALSE(isNull(Handle(0, 1)));
  EXPECT_FALSE(isNull(Handle(1, 0)));
  EXPECT_TRUE(Handle(1, 2) == Handle(1, 2));
  EXPECT_FALSE(Handle(1, 2) == Handle(2, 1));
  EXPECT_EQ(toString(Handle(1, 42)), "0000000000000001000000000000002a");
  EXPECT_EQ(toString(Handle(~0ull, 0xabcdefull)), "ffffffffffffffff0000000000abcdef");
  EXPECT_EQ(toString(GraphId(0x10, 0x20)), "00000000000000100000000000000020");

  std::unordered_map<Handle, int, HandleHash, HandleEqual> map;
  for (uint64_t i = 0; i < 100; ++i) map[handle(i)] = static_cast<int>(i);
  map[handle(7)] = 700;
  EXPECT_EQ(map.size(), 100u);
  EXPECT_EQ(map.at(handle(7)), 700);
  EXPECT_EQ(map.at(handle(99)), 99);
  EXPECT_EQ(map.count(Handle(1, 1)), 0u);
  std::unordered_map<GraphId, int, GraphIdHash, GraphIdEqual> graphs;
  graphs[GraphId(1, 2)] = 1;
  EXPECT_EQ(graphs.count(GraphId(1, 2)), 1u);
  EXPECT_EQ(graphs.count(GraphId(2, 1)), 0u);
}

TEST(WireHashGraph, IsXxh3Of128BitsStableAndDistinct) {
  auto graph = samples::sampleGraph();
  const GraphId a = hashGraph(bytesOf(graph));
  const GraphId b = hashGraph(bytesOf(graph));
  EXPECT_TRUE(a == b);
  const XXH128_hash_t want = XXH3_128bits(graph.data(), graph.size());
  EXPECT_EQ(a.hi(), want.high64);
  EXPECT_EQ(a.lo(), want.low64);
  // Pinned: the id of fixed bytes must never change across builds (ids are cached by nodes).
  const char fixed[] = "genie";
  const GraphId pinned = hashGraph(std::as_bytes(std::span(fixed, 5)));
  EXPECT_EQ(toString(pinned), "1abe528c612608bb50459a6b3518baf8");  // XXH3-128, high64 first

  samples::GraphMaker other;
  other.tensorInput(DType::Float32, {2, 3});
  other.node("aten::relu", "", {other.tensor(0)});
  auto other_bytes = other.finish();
  EXPECT_FALSE(hashGraph(bytesOf(other_bytes)) == a);
  // One byte changed changes the id.
  std::vector<uint64_t> copy((graph.size() + 7) / 8);
  std::memcpy(copy.data(), graph.data(), graph.size());
  reinterpret_cast<uint8_t*>(copy.data())[graph.size() - 1] ^= 1;
  EXPECT_FALSE(hashGraph(std::as_bytes(
                   std::span(reinterpret_cast<const uint8_t*>(copy.data()), graph.size()))) == a);
}

TEST(WireBuild, HeadersAreAlignedAndIdentified) {
  for (const auto& sample : samples::sampleMessages()) {
    EXPECT_EQ(reinterpret_cast<uintptr_t>(sample.header.data()) % kHeaderAlignment, 0u)
        << bodyName(sample.body);
    EXPECT_EQ(sample.header.size() % kHeaderAlignment, 0u) << bodyName(sample.body);
    EXPECT_TRUE(flatbuffers::BufferHasIdentifier(sample.header.data(), "GNIE"));
    auto r = verifyMessage(bytesOf(sample.header), sample.payload_bytes);
    ASSERT_TRUE(r.isOk()) << bodyName(sample.body) << ": " << r.status().toString();
    EXPECT_EQ(r.value()->body_type(), sample.body);
  }
}

TEST(WireBuild, SamplesCoverEveryBody) {
  auto all = samples::sampleMessages();
  ASSERT_EQ(all.size(), static_cast<size_t>(Body::MAX));
  for (size_t i = 0; i < all.size(); ++i) EXPECT_EQ(all[i].body, static_cast<Body>(i + 1));
}

TEST(WireBuild, BuildersReportBadTensors) {
  TensorSlotArgs bad;
  bad.handle = handle(1);
  bad.desc.dtype = DType::Float32;
  bad.desc.shape = {2, -3};
  const TensorSlotArgs slots[] = {TensorSlotArgs{}, bad};
  auto put = buildPutTensors(1, std::span(slots).subspan(1));
  ASSERT_FALSE(put.isOk());
  EXPECT_EQ(put.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(put.status().message().find("tensors[0]: shape[1] is -3"), std::string::npos)
      << put.status().message();
  RunGraphArgs run;
  run.inputs.push_back({0, Handle(), bad});
  auto rg = buildRunGraph(1, run);
  ASSERT_FALSE(rg.isOk());
  EXPECT_NE(rg.status().message().find("inputs[0]"), std::string::npos);
}

// ---------------------------------------------------------------------------------------
// Round trips, one per Body member.

TEST(WireRoundTrip, Hello) {
  auto buf = buildHello(77, "client-x", "secret", -5);
  const Message* m = mustVerify(buf);
  ASSERT_NE(m, nullptr);
  EXPECT_EQ(m->request_id(), 77u);
  ASSERT_EQ(m->body_type(), Body::Hello);
  const Hello* h = m->body_as_Hello();
  EXPECT_EQ(h->protocol_version(), kProtocolVersion);
  EXPECT_EQ(stringOf(h->client_name()), "client-x");
  EXPECT_EQ(stringOf(h->auth_token()), "secret");
  EXPECT_EQ(h->pid(), -5);
  // Empty strings are left out and read back empty; the version can be overridden.
  auto bare = buildHello(0, "", "", 0, 9);
  const Message* b = mustVerify(bare);
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(b->request_id(), 0u);
  EXPECT_EQ(b->body_as_Hello()->client_name(), nullptr);
  EXPECT_EQ(b->body_as_Hello()->protocol_version(), 9u);
  // A new session leaves attach_session out; an attaching connection names the session.
  EXPECT_EQ(h->attach_session(), nullptr);
  auto attach = buildHello(3, "node", "t", 1, kProtocolVersion, handle(40));
  const Message* a = mustVerify(attach);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(a->body_as_Hello()->attach_session(), nullptr);
  EXPECT_TRUE(*a->body_as_Hello()->attach_session() == handle(40));
}

TEST(WireRoundTrip, Welcome) {
  WelcomeArgs w;
  w.session_id = handle(5);
  w.node_name = "node-7";
  w.device = "cuda:1";
  w.memory_limit = 80ull << 30;
  w.max_header_bytes = 1 << 20;
  auto buf = buildWelcome(1, w);
  const Message* m = mustVerify(buf);
  ASSERT_NE(m, nullptr);
  const Welcome* r = m->body_as_Welcome();
  ASSERT_NE(r, nullptr);
  EXPECT_EQ(r->protocol_version(), kProtocolVersion);
  expectHandle(r->session_id(), handle(5));
  EXPECT_EQ(stringOf(r->node_name()), "node-7");
  EXPECT_EQ(stringOf(r->device()), "cuda:1");
  EXPECT_EQ(r->memory_limit(), 80ull << 30);
  EXPECT_EQ(r->max_header_bytes(), 1u << 20);
}

void expectSlot(const TensorSlot* s, const TensorSlotArgs& want, uint64_t nbytes) {
  ASSERT_NE(s, nullptr);
  if (isNull(want.handle)) {
    EXPECT_EQ(s->handle(), nullptr);
  } else {
    expectHandle(s->handle(), want.handle);
  }
  ASSERT_NE(s->desc(), nullptr);
  EXPECT_EQ(s->desc()->dtype(), want.desc.dtype);
  EXPECT_EQ(toVector(s->desc()->shape()), want.desc.shape);
  EXPECT_EQ(toVector(s->desc()->strides()), want.desc.strides);
  EXPECT_EQ(s->desc()->storage_offset(), want.desc.storage_offset);
  EXPECT_EQ(s->desc()->nbytes(), nbytes);
  EXPECT_EQ(s->desc()->memory(), want.desc.memory);
  EXPECT_EQ(s->desc()->device_index(), want.desc.device_index);
  EXPECT_EQ(s->residency(), want.residency);
  EXPECT_EQ(s->payload_offset(), want.payload_offset);
  if (!want.remote) {
    EXPECT_EQ(s->remote(), nullptr);
    return;
  }
  ASSERT_NE(s->remote(), nullptr);
  EXPECT_EQ(s->remote()->address(), want.remote->address);
  EXPECT_EQ(s->remote()->length(), want.remote->length);
  EXPECT_EQ(s->remote()->memory(), want.remote->memory);
  ASSERT_NE(s->remote()->rkey(), nullptr);
  EXPECT_EQ(std::vector<uint8_t>(s->remote()->rkey()->begin(), s->remote()->rkey()->end()),
            want.remote->rkey);
}

std::vector<TensorSlotArgs> threeSlots(PayloadLayout& layout) {
  std::vector<TensorSlotArgs> slots(3);
  slots[0].handle = handle(1);
  slots[0].desc.dtype = DType::Float32;
  slots[0].desc.shape = {5, 6};
  slots[0].residency = Residency::PersistentWeight;
  slots[0].payload_offset = layout.add(120);
  slots[1].handle = handle(2);
  slots[1].desc.dtype = DType::Int16;
  slots[1].desc.shape = {3, 2};
  slots[1].desc.strides = {1, 3};  // a transposed [2,3]
  slots[1].desc.storage_offset = 2;
  slots[1].residency = Residency::StatefulKvCache;
  slots[1].payload_offset = layout.add((2 + 2 * 1 + 1 * 3 + 1) * 2);
  slots[2].handle = handle(3);
  slots[2].desc.dtype = DType::UInt8;
  slots[2].desc.shape = {1024};
  slots[2].desc.memory = MemoryKind::Cuda;
  slots[2].desc.device_index = 3;
  slots[2].residency = Residency::Gradient;
  slots[2].remote = RemoteBufferArgs{0xdead0000, 4096, {7, 7, 7}, MemoryKind::Cuda};
  return slots;
}

TEST(WireRoundTrip, PutTensors) {
  PayloadLayout layout;
  auto slots = threeSlots(layout);
  EXPECT_EQ(layout.size(), 128u + 16);
  auto buf = buildPutTensors(9, slots);
  ASSERT_TRUE(buf.isOk()) << buf.status().toString();
  const Message* m = mustVerify(buf.value(), layout.size());
  ASSERT_NE(m, nullptr);
  EXPECT_EQ(m->request_id(), 9u);
  const auto* tensors = m->body_as_PutTensors()->tensors();
  ASSERT_NE(tensors, nullptr);
  ASSERT_EQ(tensors->size(), 3u);
  expectSlot(tensors->Get(0), slots[0], 120);
  expectSlot(tensors->Get(1), slots[1], 16);
  expectSlot(tensors->Get(2), slots[2], 1024);
  EXPECT_EQ(tensorSpanBytes(*tensors->Get(1)->desc()).value(), 16u);
  // One byte less of payload and the last in-payload tensor no longer fits.
  auto short_payload = verifyMessage(bytesOf(buf.value()), layout.size() - 1);
  ASSERT_FALSE(short_payload.isOk());
  EXPECT_NE(short_payload.status().message().find("PutTensors.tensors[1]: payload_offset 128 + "
                                                  "nbytes 16 exceeds the payload of 143 bytes"),
            std::string::npos)
      << short_payload.status().message();
}

TEST(WireRoundTrip, PutTensorsRefusesQuantizedBytes) {
  // A quantized tensor's bytes mean nothing without its quantizer: it travels as int_repr.
  PayloadLayout layout;
  std::vector<TensorSlotArgs> slots(1);
  slots[0].handle = handle(1);
  slots[0].desc.dtype = DType::QUInt8;
  slots[0].desc.shape = {4};
  slots[0].payload_offset = layout.add(4);
  auto buf = buildPutTensors(3, slots);
  ASSERT_TRUE(buf.isOk()) << buf.status().toString();
  auto verified = verifyMessage(bytesOf(buf.value()), layout.size());
  ASSERT_FALSE(verified.isOk());
  EXPECT_NE(verified.status().message().find("PutTensors.tensors[0].desc.dtype: QUInt8 tensors carry no bytes"),
            std::string::npos)
      << verified.status().message();
}

TEST(WireRoundTrip, GetTensors) {
  const Handle handles[] = {handle(1), handle(2)};
  auto buf = buildGetTensors(3, handles);
  const Message* m = mustVerify(buf);
  ASSERT_NE(m, nullptr);
  const GetTensors* g = m->body_as_GetTensors();
  ASSERT_NE(g->handles(), nullptr);
  ASSERT_EQ(g->handles()->size(), 2u);
  expectHandle(g->handles()->Get(0), handle(1));
  expectHandle(g->handles()->Get(1), handle(2));
  EXPECT_EQ(g->remote(), nullptr);

  const RemoteBufferArgs remote[] = {{0x10, 100, {1}, MemoryKind::Host},
                                     {0x20, 200, {2, 2}, MemoryKind::Cuda}};
  auto with_remote = buildGetTensors(4, handles, remote);
  const Message* r = mustVerify(with_remote);
  ASSERT_NE(r, nullptr);
  const auto* rb = r->body_as_GetTensors()->remote();
  ASSERT_NE(rb, nullptr);
  ASSERT_EQ(rb->size(), 2u);
  EXPECT_EQ(rb->Get(1)->address(), 0x20u);
  EXPECT_EQ(rb->Get(1)->length(), 200u);
  EXPECT_EQ(rb->Get(1)->memory(), MemoryKind::Cuda);
  EXPECT_EQ(rb->Get(1)->rkey()->size(), 2u);
}

TEST(WireRoundTrip, TensorData) {
  PayloadLayout layout;
  auto slots = threeSlots(layout);
  auto buf = buildTensorData(12, slots);
  ASSERT_TRUE(buf.isOk());
  const Message* m = mustVerify(buf.value(), layout.size());
  ASSERT_NE(m, nullptr);
  const auto* tensors = m->body_as_TensorData()->tensors();
  ASSERT_EQ(tensors->size(), 3u);
  expectSlot(tensors->Get(0), slots[0], 120);
  expectSlot(tensors->Get(1), slots[1], 16);
  expectSlot(tensors->Get(2), slots[2], 1024);
}

TEST(WireRoundTrip, FreeTensors) {
  const Handle handles[] = {handle(4), handle(5), handle(6)};
  auto buf = buildFreeTensors(13, handles, false);
  const Message* m = mustVerify(buf);
  ASSERT_NE(m, nullptr);
  const FreeTensors* f = m->body_as_FreeTensors();
  EXPECT_FALSE(f->want_reply());
  ASSERT_EQ(f->handles()->size(), 3u);
  expectHandle(f->handles()->Get(2), handle(6));
  auto with_reply = buildFreeTensors(14, handles);  // must outlive `d`, which points into it
  const Message* d = mustVerify(with_reply);
  ASSERT_NE(d, nullptr);
  EXPECT_TRUE(d->body_as_FreeTensors()->want_reply());
}

TEST(WireRoundTrip, RegisterGraph) {
  auto graph = samples::sampleGraph();
  auto buf = buildRegisterGraph(15, bytesOf(graph));
  const Message* m = mustVerify(buf);
  ASSERT_NE(m, nullptr);
  const auto* bytes = m->body_as_RegisterGraph()->graph();
  ASSERT_NE(bytes, nullptr);
  ASSERT_EQ(bytes->size(), graph.size());
  EXPECT_EQ(std::memcmp(bytes->data(), graph.data(), graph.size()), 0);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(bytes->data()) % kHeaderAlignment, 0u);
  const GraphId id = hashGraph(std::as_bytes(std::span(bytes->data(), bytes->size())));
  EXPECT_TRUE(id == hashGraph(bytesOf(graph)));

  const Graph* g = m->body_as_RegisterGraph()->graph_nested_root();
  ASSERT_NE(g, nullptr);
  EXPECT_EQ(stringOf(g->name()), "sample");
  ASSERT_EQ(g->inputs()->size(), 2u);
  EXPECT_EQ(toVector(g->inputs()->Get(0)->desc()->shape()), (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(g->inputs()->Get(1)->desc()->nbytes(), 12u);
  EXPECT_EQ(g->inputs()->Get(0)->handle(), nullptr);
  expectHandle(g->inputs()->Get(1)->handle(), samples::handle(12));
  EXPECT_EQ(g->num_scalar_inputs(), 1u);
  ASSERT_EQ(g->nodes()->size(), 7u);
  EXPECT_EQ(graphNumValues(*g), 10u);
  const Node* add = g->nodes()->Get(0);
  EXPECT_EQ(stringOf(add->op()), "aten::add");
  EXPECT_EQ(stringOf(add->overload()), "Tensor");
  EXPECT_EQ(add->num_outputs(), 1u);
  ASSERT_EQ(add->args()->size(), 3u);
  EXPECT_EQ(add->args()->Get(1)->value_as_TensorValue()->value(), 1u);
  EXPECT_EQ(stringOf(add->args()->Get(2)->name()), "alpha");
  EXPECT_EQ(add->args()->Get(2)->value_as_IntValue()->v(), 1);
  const auto* view = g->nodes()->Get(2)->args()->Get(1)->value_as_IntListValue();
  ASSERT_NE(view, nullptr);
  EXPECT_EQ(toVector(view->v()), (std::vector<int64_t>{0, 2}));
  EXPECT_EQ(view->scalar_slots()->Get(0), 0);
  EXPECT_EQ(view->scalar_slots()->Get(1), -1);
  const Node* to = g->nodes()->Get(4);
  EXPECT_EQ(to->args()->Get(1)->value_as_DTypeValue()->v(), DType::Float16);
  EXPECT_EQ(stringOf(to->args()->Get(3)->value_as_DeviceValue()->type()), "cuda");
  EXPECT_EQ(to->args()->Get(5)->value_type(), Value::NoneValue);
  const auto* opt = g->nodes()->Get(5)->args()->Get(1)->value_as_OptionalTensorListValue();
  EXPECT_EQ(opt->values()->Get(0), -1);
  const Node* lit = g->nodes()->Get(6);
  EXPECT_EQ(lit->num_outputs(), 2u);
  EXPECT_EQ(lit->args()->Get(1)->value_as_ComplexValue()->im(), -1.0);
  EXPECT_EQ(lit->args()->Get(2)->value_as_DoubleListValue()->v()->Get(1), 2.5);
  EXPECT_EQ(lit->args()->Get(3)->value_as_BoolListValue()->v()->Get(0), 1);
  EXPECT_EQ(stringOf(lit->args()->Get(4)->value_as_StringValue()->v()), "mean");
  EXPECT_EQ(lit->args()->Get(5)->value_as_ScalarInputValue()->slot(), 0u);
}

TEST(WireRoundTrip, GraphRegistered) {
  auto buf = buildGraphRegistered(16, GraphId(0xaa, 0xbb), 42);
  const Message* m = mustVerify(buf);
  ASSERT_NE(m, nullptr);
  const GraphRegistered* g = m->body_as_GraphRegistered();
  ASSERT_NE(g->graph_id(), nullptr);
  EXPECT_TRUE(*g->graph_id() == GraphId(0xaa, 0xbb));
  EXPECT_EQ(g->num_nodes(), 42u);
}

TEST(WireRoundTrip, RunGraph) {
  PayloadLayout layout;
  RunGraphArgs run;
  run.graph_id = GraphId(3, 4);
  run.inputs.push_back({0, handle(1), std::nullopt});
  TensorSlotArgs small;
  small.desc.dtype = DType::Int32;
  small.desc.shape = {2};
  small.payload_offset = layout.add(8);
  run.inputs.push_back({1, Handle(), small});
  run.scalars = {{0, int64_t{128}}, {1, 0.25}, {2, true}};
  run.outputs = {{5, OutputAction::Return, Handle(), Residency::EphemeralActivation},
                 {6, OutputAction::ReturnAndKeep, handle(9), Residency::StatefulKvCache},
                 {7, OutputAction::KeepAndDescribe, handle(10), Residency::EphemeralActivation}};
  run.free = {handle(11), handle(12)};
  auto buf = buildRunGraph(17, run);
  ASSERT_TRUE(buf.isOk());
  const Message* m = mustVerify(buf.value(), layout.size());
  ASSERT_NE(m, nullptr);
  const RunGraph* r = m->body_as_RunGraph();
  EXPECT_TRUE(*r->graph_id() == GraphId(3, 4));
  ASSERT_EQ(r->inputs()->size(), 2u);
  EXPECT_EQ(r->inputs()->Get(0)->input(), 0u);
  EXPECT_EQ(r->inputs()->Get(0)->kind(), BindingKind::Handle);
  expectHandle(r->inputs()->Get(0)->handle(), handle(1));
  EXPECT_EQ(r->inputs()->Get(1)->input(), 1u);
  EXPECT_EQ(r->inputs()->Get(1)->kind(), BindingKind::Inline);
  expectSlot(r->inputs()->Get(1)->inline_(), small, 8);
  ASSERT_EQ(r->scalars()->size(), 3u);
  EXPECT_EQ(r->scalars()->Get(0)->value_as_IntValue()->v(), 128);
  EXPECT_EQ(r->scalars()->Get(1)->slot(), 1u);
  EXPECT_EQ(r->scalars()->Get(1)->value_as_DoubleValue()->v(), 0.25);
  EXPECT_TRUE(r->scalars()->Get(2)->value_as_BoolValue()->v());
  ASSERT_EQ(r->outputs()->size(), 3u);
  EXPECT_EQ(r->outputs()->Get(0)->value(), 5u);
  EXPECT_EQ(r->outputs()->Get(0)->action(), OutputAction::Return);
  EXPECT_EQ(r->outputs()->Get(0)->handle(), nullptr);
  EXPECT_EQ(r->outputs()->Get(1)->action(), OutputAction::ReturnAndKeep);
  expectHandle(r->outputs()->Get(1)->handle(), handle(9));
  EXPECT_EQ(r->outputs()->Get(1)->residency(), Residency::StatefulKvCache);
  EXPECT_EQ(r->outputs()->Get(2)->action(), OutputAction::KeepAndDescribe);
  expectHandle(r->outputs()->Get(2)->handle(), handle(10));
  ASSERT_NE(r->free(), nullptr);
  ASSERT_EQ(r->free()->size(), 2u);
  expectHandle(r->free()->Get(0), handle(11));
  expectHandle(r->free()->Get(1), handle(12));
  // No frees: the field is absent.
  RunGraphArgs plain;
  plain.graph_id = GraphId(3, 4);
  auto plain_buf = buildRunGraph(18, plain);
  ASSERT_TRUE(plain_buf.isOk());
  const Message* p = mustVerify(plain_buf.value());
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(p->body_as_RunGraph()->free(), nullptr);
}

TEST(WireRoundTrip, RunGraphColocationIsSharedByItsSpecs) {
  // A decode step keeps every layer's cache in one co-location group: one Colocation table for
  // all of them, so each spec costs an offset, not a copy of the group's name.
  auto step = [](int specs, bool colocated) {
    RunGraphArgs run;
    run.graph_id = GraphId(3, 4);
    for (int i = 0; i < specs; ++i) {
      OutputSpecArgs spec{static_cast<uint32_t>(i), OutputAction::KeepResident, handle(100 + i), Residency::StatefulKvCache};
      if (colocated) spec.colocation = ColocationArgs{"GPT2LMHeadModel#7f3a2b1c4d50", 1u << 30};
      run.outputs.push_back(spec);
    }
    auto buf = buildRunGraph(20, run);
    EXPECT_TRUE(buf.isOk());
    return std::move(buf.value());
  };
  auto shared = step(24, true);
  const Message* m = mustVerify(shared);
  ASSERT_NE(m, nullptr);
  const auto* outputs = m->body_as_RunGraph()->outputs();
  ASSERT_EQ(outputs->size(), 24u);
  for (uint32_t i = 0; i < outputs->size(); ++i) {
    ASSERT_NE(outputs->Get(i)->colocation(), nullptr);
    EXPECT_EQ(stringOf(outputs->Get(i)->colocation()->group()), "GPT2LMHeadModel#7f3a2b1c4d50");
    EXPECT_EQ(outputs->Get(i)->colocation()->bytes(), 1u << 30);
    EXPECT_EQ(outputs->Get(i)->colocation(), outputs->Get(0)->colocation());  // one table
  }
  EXPECT_LE(shared.size(), step(24, false).size() + 24 * 8 + 64);
}

TEST(WireRoundTrip, NegativeZeroKeepsItsSign) {
  // FlatBuffers leaves out a field equal to its default, and -0.0 == 0.0: without
  // createDoubleValue a changed scalar of -0.0 arrived as +0.0 (1 / x then has the wrong sign).
  RunGraphArgs run;
  run.graph_id = GraphId(3, 4);
  run.scalars = {{0, -0.0}, {1, 0.0}};
  auto buf = buildRunGraph(19, run);
  ASSERT_TRUE(buf.isOk());
  const Message* m = mustVerify(buf.value());
  ASSERT_NE(m, nullptr);
  const auto* scalars = m->body_as_RunGraph()->scalars();
  ASSERT_EQ(scalars->size(), 2u);
  EXPECT_TRUE(std::signbit(scalars->Get(0)->value_as_DoubleValue()->v()));
  EXPECT_FALSE(std::signbit(scalars->Get(1)->value_as_DoubleValue()->v()));
  flatbuffers::FlatBufferBuilder fbb;
  fbb.Finish(createComplexValue(fbb, -0.0, -0.0));
  const auto* c = flatbuffers::GetRoot<ComplexValue>(fbb.GetBufferPointer());
  EXPECT_TRUE(std::signbit(c->re()) && std::signbit(c->im()));
}

TEST(WireRoundTrip, RunResult) {
  PayloadLayout layout;
  TensorSlotArgs out;
  out.desc.dtype = DType::Float64;
  out.desc.shape = {4, 4};
  out.payload_offset = layout.add(128);
  TensorSlotArgs kept = out;
  kept.handle = handle(9);
  kept.payload_offset = layout.add(128);
  const TensorSlotArgs outputs[] = {out, kept};
  auto buf = buildRunResult(18, outputs, 987);
  ASSERT_TRUE(buf.isOk());
  const Message* m = mustVerify(buf.value(), layout.size());
  ASSERT_NE(m, nullptr);
  const RunResult* r = m->body_as_RunResult();
  EXPECT_EQ(r->exec_us(), 987u);
  ASSERT_EQ(r->outputs()->size(), 2u);
  expectSlot(r->outputs()->Get(0), out, 128);
  expectSlot(r->outputs()->Get(1), kept, 128);
  EXPECT_EQ(r->described(), nullptr);  // no KeepAndDescribe outputs: absent
}

TEST(WireRoundTrip, RunResultDescribed) {
  // A KeepAndDescribe output: descriptor and handle, no bytes (the payload stays empty).
  TensorSlotArgs described;
  described.handle = handle(5);
  described.desc.dtype = DType::Int64;
  described.desc.shape = {3, 2};
  described.desc.strides = {1, 3};
  described.desc.storage_offset = 2;
  auto buf = buildRunResult(19, {}, 5, std::span(&described, 1));
  ASSERT_TRUE(buf.isOk());
  const Message* m = mustVerify(buf.value(), 0);
  ASSERT_NE(m, nullptr);
  const RunResult* r = m->body_as_RunResult();
  EXPECT_EQ(r->outputs()->size(), 0u);
  ASSERT_NE(r->described(), nullptr);
  ASSERT_EQ(r->described()->size(), 1u);
  const TensorSlot* s = r->described()->Get(0);
  expectHandle(s->handle(), handle(5));
  EXPECT_EQ(s->payload_offset(), 0u);
  EXPECT_EQ(s->desc()->storage_offset(), 2);
  EXPECT_EQ(s->desc()->nbytes(), (2 + 1 + 2 * 1 + 1 * 3) * 8u);
  EXPECT_EQ(std::vector<int64_t>(s->desc()->strides()->begin(), s->desc()->strides()->end()),
            (std::vector<int64_t>{1, 3}));
}

TEST(WireRoundTrip, Error) {
  auto buf = buildError(19, ErrorCode::UnknownOp, "no aten::frob", 3, "aten::frob.default");
  const Message* m = mustVerify(buf);
  ASSERT_NE(m, nullptr);
  const Error* e = m->body_as_Error();
  EXPECT_EQ(e->code(), ErrorCode::UnknownOp);
  EXPECT_EQ(stringOf(e->message()), "no aten::frob");
  EXPECT_EQ(e->op_index(), 3);
  EXPECT_EQ(stringOf(e->op_name()), "aten::frob.default");
  auto plain_buf = buildError(20, ErrorCode::Internal, "boom");
  const Message* plain = mustVerify(plain_buf);
  ASSERT_NE(plain, nullptr);
  EXPECT_EQ(plain->body_as_Error()->op_index(), -1);
  EXPECT_EQ(plain->body_as_Error()->op_name(), nullptr);
}

TEST(WireRoundTrip, Ack) {
  auto m_buf = buildAck(21, 17);
  const Message* m = mustVerify(m_buf);
  ASSERT_NE(m, nullptr);
  EXPECT_EQ(m->request_id(), 21u);
  EXPECT_EQ(m->body_as_Ack()->count(), 17u);
}

TEST(WireRoundTrip, StatsRequest) {
  auto m_buf = buildStatsRequest(22);
  const Message* m = mustVerify(m_buf);
  ASSERT_NE(m, nullptr);
  EXPECT_EQ(m->body_type(), Body::StatsRequest);
  EXPECT_NE(m->body_as_StatsRequest(), nullptr);
  EXPECT_EQ(m->body_as_StatsRequest()->parts(), nullptr);
  const GraphId parts[] = {GraphId(1, 2), GraphId(3, 4)};
  auto with_parts = buildStatsRequest(23, parts);
  const Message* w = mustVerify(with_parts);
  ASSERT_NE(w, nullptr);
  ASSERT_EQ(w->body_as_StatsRequest()->parts()->size(), 2u);
  EXPECT_TRUE(*w->body_as_StatsRequest()->parts()->Get(1) == GraphId(3, 4));
}

TEST(WireRoundTrip, Stats) {
  StatsArgs s;
  s.sessions = 3;
  s.resident = {{Residency::PersistentWeight, 1000}, {Residency::StatefulKvCache, 2000}};
  s.graphs_cached = 4;
  s.ops_executed = 5;
  s.bytes_in = 6;
  s.bytes_out = 7;
  s.memory_limit = 8;
  s.uptime_us = 9;
  s.peer_bytes_sent = 10;
  s.peer_bytes_received = 11;
  s.peer_transfers = 12;
  s.colocation = {{"GPT2LMHeadModel#1", 4096, 1024}};
  s.parts = {{GraphId(5, 6), "float32:2,4:4,1:0", "package", 13, 2, 31700000, false, ""},
             {GraphId(5, 6), "float32:3,4:4,1:0", "executor", 0, 14, 0, false, "the compile worker failed (exit 1): x"}};
  auto m_buf = buildStats(23, s);
  const Message* m = mustVerify(m_buf);
  ASSERT_NE(m, nullptr);
  const Stats* r = m->body_as_Stats();
  EXPECT_EQ(r->sessions(), 3u);
  ASSERT_EQ(r->resident()->size(), 2u);
  EXPECT_EQ(r->resident()->Get(1)->residency(), Residency::StatefulKvCache);
  EXPECT_EQ(r->resident()->Get(1)->bytes(), 2000u);
  EXPECT_EQ(r->graphs_cached(), 4u);
  EXPECT_EQ(r->ops_executed(), 5u);
  EXPECT_EQ(r->bytes_in(), 6u);
  EXPECT_EQ(r->bytes_out(), 7u);
  EXPECT_EQ(r->memory_limit(), 8u);
  EXPECT_EQ(r->uptime_us(), 9u);
  EXPECT_EQ(r->peer_bytes_sent(), 10u);
  EXPECT_EQ(r->peer_bytes_received(), 11u);
  EXPECT_EQ(r->peer_transfers(), 12u);
  ASSERT_EQ(r->colocation()->size(), 1u);
  EXPECT_EQ(stringOf(r->colocation()->Get(0)->group()), "GPT2LMHeadModel#1");
  EXPECT_EQ(r->colocation()->Get(0)->bytes(), 4096u);
  EXPECT_EQ(r->colocation()->Get(0)->resident(), 1024u);
  ASSERT_EQ(r->parts()->size(), 2u);
  EXPECT_TRUE(*r->parts()->Get(0)->graph_id() == GraphId(5, 6));
  EXPECT_EQ(stringOf(r->parts()->Get(0)->state()), "package");
  EXPECT_EQ(r->parts()->Get(0)->package_calls(), 13u);
  EXPECT_EQ(r->parts()->Get(0)->build_us(), 31700000u);
  EXPECT_EQ(stringOf(r->parts()->Get(1)->reason()), "the compile worker failed (exit 1): x");
  EXPECT_EQ(r->parts()->Get(1)->executor_calls(), 14u);
}

TEST(WireRoundTrip, SendTensors) {
  SendTensorsArgs send;
  send.peer = "10.1.2.3:7070";
  send.auth_token = "peer-token";
  send.peer_session = handle(9);
  send.handles = {handle(1), handle(2), handle(3)};
  send.peer_handles = {handle(4), handle(5), handle(6)};
  auto m_buf = buildSendTensors(27, send);
  const Message* m = mustVerify(m_buf);
  ASSERT_NE(m, nullptr);
  EXPECT_EQ(m->request_id(), 27u);
  ASSERT_EQ(m->body_type(), Body::SendTensors);
  const SendTensors* r = m->body_as_SendTensors();
  EXPECT_EQ(stringOf(r->peer()), "10.1.2.3:7070");
  EXPECT_EQ(stringOf(r->auth_token()), "peer-token");
  EXPECT_TRUE(*r->peer_session() == handle(9));
  ASSERT_EQ(r->handles()->size(), 3u);
  ASSERT_EQ(r->peer_handles()->size(), 3u);
  for (uint32_t i = 0; i < 3; ++i) {
    EXPECT_TRUE(*r->handles()->Get(i) == handle(1 + i));
    EXPECT_TRUE(*r->peer_handles()->Get(i) == handle(4 + i));
  }
  EXPECT_FALSE(verifyMessage(bytesOf(m_buf), 1).isOk()) << "SendTensors carries no payload";
}

TEST(WireRoundTrip, PingAndPong) {
  auto ping_buf = buildPing(24, 123456789);
  const Message* ping = mustVerify(ping_buf);
  ASSERT_NE(ping, nullptr);
  EXPECT_EQ(ping->body_as_Ping()->timestamp_ns(), 123456789u);
  auto pong_buf = buildPong(24, 987654321);
  const Message* pong = mustVerify(pong_buf);
  ASSERT_NE(pong, nullptr);
  EXPECT_EQ(pong->body_type(), Body::Pong);
  EXPECT_EQ(pong->body_as_Pong()->timestamp_ns(), 987654321u);
}

TEST(WireRoundTrip, Goodbye) {
  auto m_buf = buildGoodbye(25, "client exit");
  const Message* m = mustVerify(m_buf);
  ASSERT_NE(m, nullptr);
  EXPECT_EQ(stringOf(m->body_as_Goodbye()->reason()), "client exit");
}

// genie-bench's messages have no builder: they are built with the typed finishMessage.
TEST(WireRoundTrip, BenchDataEndAndReport) {
  flatbuffers::FlatBufferBuilder data_fbb;
  finishMessage(data_fbb, 30, CreateBenchData(data_fbb, 41));
  auto data = data_fbb.Release();
  const Message* d = mustVerify(data, 1 << 20);  // BenchData's payload is opaque bytes
  ASSERT_NE(d, nullptr);
  EXPECT_EQ(d->body_type(), Body::BenchData);
  EXPECT_EQ(d->body_as_BenchData()->sequence(), 41u);

  flatbuffers::FlatBufferBuilder end_fbb;
  finishMessage(end_fbb, 31, CreateBenchEnd(end_fbb, 42));
  auto end = end_fbb.Release();
  const Message* e = mustVerify(end);
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(e->body_as_BenchEnd()->messages(), 42u);
  EXPECT_FALSE(verifyMessage(bytesOf(end), 1).isOk());

  flatbuffers::FlatBufferBuilder report_fbb;
  finishMessage(report_fbb, 31, CreateBenchReport(report_fbb, 42, 1 << 30, 777));
  auto report = report_fbb.Release();
  const Message* r = mustVerify(report);
  ASSERT_NE(r, nullptr);
  EXPECT_EQ(r->body_as_BenchReport()->messages(), 42u);
  EXPECT_EQ(r->body_as_BenchReport()->bytes(), 1u << 30);
  EXPECT_EQ(r->body_as_BenchReport()->elapsed_ns(), 777u);
}

TEST(WireRoundTrip, FinishMessageWithHandBuiltBody) {
  flatbuffers::FlatBufferBuilder fbb;
  finishMessage(fbb, 26, CreatePing(fbb, 5));
  auto buf = fbb.Release();
  const Message* m = mustVerify(buf);
  ASSERT_NE(m, nullptr);
  EXPECT_EQ(m->request_id(), 26u);
  EXPECT_EQ(m->body_as_Ping()->timestamp_ns(), 5u);
}

}  // namespace
}  // namespace genie::wire
