#include "sample_messages.h"

#include <cstdlib>
#include <utility>

namespace genie::wire::samples {

namespace {

/// Samples are built from constants, so a failure here is a bug in the samples.
flatbuffers::DetachedBuffer orDie(Result<flatbuffers::DetachedBuffer> r) {
  if (!r) {
    fmt::print(stderr, "sample message: {}\n", r.status().toString());
    std::abort();
  }
  return std::move(r).value();
}

/// PutTensors payload: a contiguous Float32 [2,3] and a strided Int64 view.
std::vector<TensorSlotArgs> putSlots(PayloadLayout& layout) {
  TensorSlotArgs a;
  a.handle = handle(1);
  a.desc = {.dtype = DType::Float32, .shape = {2, 3}};
  a.residency = Residency::PersistentWeight;
  a.payload_offset = layout.add(tensorSpanBytes(a.desc.dtype, a.desc.shape).value());

  TensorSlotArgs b;
  b.handle = handle(2);
  b.desc = {.dtype = DType::Int64,
            .shape = {4},
            .strides = {2},
            .storage_offset = 1};  // elements 1,3,5,7 of an 8-element storage
  b.payload_offset =
      layout.add(tensorSpanBytes(b.desc.dtype, b.desc.shape, b.desc.strides, 1).value());

  TensorSlotArgs c;  // moved by RMA: no payload bytes
  c.handle = handle(3);
  c.desc = {
      .dtype = DType::BFloat16, .shape = {8, 8}, .memory = MemoryKind::Cuda, .device_index = 1};
  c.remote = RemoteBufferArgs{0x7f0000001000, 128, {1, 2, 3, 4}, MemoryKind::Cuda};
  return {a, b, c};
}

}  // namespace

Handle handle(uint64_t n) { return Handle(0x6e6965 + n, n); }

std::vector<SampleMessage> sampleMessages() {
  std::vector<SampleMessage> out;
  auto add = [&](Body body, flatbuffers::DetachedBuffer header, size_t payload = 0) {
    out.push_back({body, std::move(header), payload});
  };
  add(Body::Hello, buildHello(1, "pytest", "token", 4242, kProtocolVersion, handle(100)));
  add(Body::Welcome, buildWelcome(1, {handle(100), "node-a", "cuda:0", 1ull << 34, 1u << 20}));
  {
    PayloadLayout layout;
    auto slots = putSlots(layout);
    add(Body::PutTensors, orDie(buildPutTensors(2, slots)), layout.size());
  }
  {
    const Handle handles[] = {handle(1), handle(2)};
    const RemoteBufferArgs remote[] = {{0x1000, 24, {9, 9}, MemoryKind::Host},
                                       {0x2000, 64, {8}, MemoryKind::Host}};
    add(Body::GetTensors, buildGetTensors(3, handles, remote));
  }
  {
    PayloadLayout layout;
    auto slots = putSlots(layout);
    slots.pop_back();
    add(Body::TensorData, orDie(buildTensorData(3, slots)), layout.size());
  }
  {
    const Handle handles[] = {handle(1), handle(2), handle(3)};
    add(Body::FreeTensors, buildFreeTensors(4, handles, false));
  }
  auto graph = sampleGraph();
  add(Body::RegisterGraph, buildRegisterGraph(5, bytesOf(graph)));
  add(Body::GraphRegistered, buildGraphRegistered(5, hashGraph(bytesOf(graph)), 7));
  {
    PayloadLayout layout;
    RunGraphArgs run;
    run.graph_id = hashGraph(bytesOf(graph));
    run.inputs.push_back({0, handle(1), std::nullopt});
    TensorSlotArgs inline_tensor;
    inline_tensor.desc = {.dtype = DType::Float32, .shape = {3}};
    inline_tensor.payload_offset = layout.add(12);
    run.inputs.push_back({1, Handle(), inline_tensor});
    run.scalars = {{0, int64_t{7}}};
    run.outputs = {{8, OutputAction::Return, Handle(), Residency::EphemeralActivation},
                   {9, OutputAction::KeepResident, handle(10), Residency::StatefulKvCache},
                   {10, OutputAction::KeepAndDescribe, handle(11), Residency::EphemeralActivation}};
    run.free = {handle(4), handle(5)};
    add(Body::RunGraph, orDie(buildRunGraph(6, run)), layout.size());
  }
  {
    PayloadLayout layout;
    TensorSlotArgs out_slot;
    out_slot.desc = {.dtype = DType::Float16, .shape = {2, 3}};
    out_slot.payload_offset = layout.add(12);
    const TensorSlotArgs outputs[] = {out_slot};
    TensorSlotArgs described_slot;
    described_slot.handle = handle(11);
    described_slot.desc = {.dtype = DType::Int64, .shape = {5, 1}, .strides = {1, 5}};
    const TensorSlotArgs described[] = {described_slot};
    add(Body::RunResult, orDie(buildRunResult(6, outputs, 1234, described)), layout.size());
  }
  add(Body::Error, buildError(7, ErrorCode::TorchError, "shape mismatch", 2, "aten::add.Tensor"));
  add(Body::Ack, buildAck(8, 3));
  add(Body::StatsRequest, buildStatsRequest(9));
  add(Body::Stats, buildStats(9, {2, {{Residency::PersistentWeight, 1 << 20}}, 3, 4, 5, 6, 7, 8}));
  add(Body::Ping, buildPing(10, 111));
  add(Body::Pong, buildPong(10, 222));
  add(Body::Goodbye, buildGoodbye(11, "done"));
  {
    flatbuffers::FlatBufferBuilder fbb;
    finishMessage(fbb, 12, CreateBenchData(fbb, 1));
    add(Body::BenchData, fbb.Release(), 1000);  // an opaque payload
  }
  {
    flatbuffers::FlatBufferBuilder fbb;
    finishMessage(fbb, 13, CreateBenchEnd(fbb, 100));
    add(Body::BenchEnd, fbb.Release());
  }
  {
    flatbuffers::FlatBufferBuilder fbb;
    finishMessage(fbb, 13, CreateBenchReport(fbb, 100, 100000, 5000000));
    add(Body::BenchReport, fbb.Release());
  }
  add(Body::SendTensors, buildSendTensors(14, {"10.0.0.2:7070", "token", handle(101), {handle(1), handle(2)},
                                               {handle(21), handle(22)}}));
  return out;
}

flatbuffers::DetachedBuffer sampleGraph() {
  GraphMaker g;
  auto& fbb = g.fbb();
  g.tensorInput(DType::Float32, {2, 3});  // id 0
  g.tensorInput(DType::Float32, {3}, handle(12));  // id 1: bound to a resident tensor
  g.setNumScalarInputs(1);
  // id 2 = add(x, y, alpha=1)
  g.node("aten::add", "Tensor", {g.tensor(0), g.tensor(1), g.integer(1, "alpha")});
  // id 3 = mul(id2, 0.5)
  g.node("aten::mul", "Scalar",
         {g.tensor(2), g.arg("", Value::DoubleValue, CreateDoubleValue(fbb, 0.5).Union())});
  // id 4 = view(id3, [scalar 0, 2])
  {
    const int64_t v[] = {0, 2};
    const int32_t slots[] = {0, -1};
    auto list = CreateIntListValue(fbb, fbb.CreateVector(v, 2), fbb.CreateVector(slots, 2));
    g.node("aten::view", "", {g.tensor(3), g.arg("size", Value::IntListValue, list.Union())});
  }
  // id 5 = cat([id3, id4], dim=0)
  {
    const uint32_t ids[] = {3, 4};
    auto list = CreateTensorListValue(fbb, fbb.CreateVector(ids, 2));
    g.node("aten::cat", "", {g.arg("", Value::TensorListValue, list.Union()), g.integer(0, "dim")});
  }
  // id 6 = to(id5, dtype, layout, device, pin_memory, copy=None, memory_format)
  g.node(
      "aten::to", "dtype_layout",
      {g.tensor(5),
       g.arg("dtype", Value::DTypeValue, CreateDTypeValue(fbb, DType::Float16).Union()),
       g.arg("layout", Value::LayoutValue, CreateLayoutValue(fbb, 0).Union()),
       g.arg("device", Value::DeviceValue,
             CreateDeviceValue(fbb, fbb.CreateString("cuda"), 0).Union()),
       g.arg("pin_memory", Value::BoolValue, CreateBoolValue(fbb, false).Union()),
       g.arg("copy", Value::NoneValue, CreateNoneValue(fbb).Union()),
       g.arg("memory_format", Value::MemoryFormatValue, CreateMemoryFormatValue(fbb, 1).Union())});
  // id 7 = index(id6, [None, x])
  {
    const int64_t ids[] = {-1, 0};
    auto list = CreateOptionalTensorListValue(fbb, fbb.CreateVector(ids, 2));
    g.node("aten::index", "Tensor",
           {g.tensor(6), g.arg("", Value::OptionalTensorListValue, list.Union())});
  }
  // ids 8, 9 = a two-output op taking the remaining literal kinds
  {
    const double d[] = {1.5, 2.5};
    const uint8_t b[] = {1, 0};
    g.node(
        "genie::test_literals", "",
        {g.tensor(7), g.arg("c", Value::ComplexValue, CreateComplexValue(fbb, 1.0, -1.0).Union()),
         g.arg("d", Value::DoubleListValue,
               CreateDoubleListValue(fbb, fbb.CreateVector(d, 2)).Union()),
         g.arg("b", Value::BoolListValue, CreateBoolListValue(fbb, fbb.CreateVector(b, 2)).Union()),
         g.arg("s", Value::StringValue, CreateStringValue(fbb, fbb.CreateString("mean")).Union()),
         g.scalarInput(0, "n")},
        2);
  }
  return g.finish("sample");
}

void GraphMaker::tensorInput(DType dtype, std::vector<int64_t> shape, Handle bound) {
  auto desc = createTensorDesc(fbb_, dtype, shape);
  inputs_.push_back(
      CreateGraphInput(fbb_, InputKind::Tensor, desc ? *desc : 0, isNull(bound) ? nullptr : &bound));
}

flatbuffers::Offset<Argument> GraphMaker::arg(std::string_view name, Value type,
                                              flatbuffers::Offset<void> value) {
  auto name_off = name.empty() ? 0 : fbb_.CreateString(name);
  return CreateArgument(fbb_, name_off, type, value);
}

flatbuffers::Offset<Argument> GraphMaker::tensor(uint32_t id, std::string_view name) {
  return arg(name, Value::TensorValue, CreateTensorValue(fbb_, id).Union());
}

flatbuffers::Offset<Argument> GraphMaker::integer(int64_t v, std::string_view name) {
  return arg(name, Value::IntValue, CreateIntValue(fbb_, v).Union());
}

flatbuffers::Offset<Argument> GraphMaker::scalarInput(uint32_t slot, std::string_view name) {
  return arg(name, Value::ScalarInputValue, CreateScalarInputValue(fbb_, slot).Union());
}

void GraphMaker::node(std::string_view op, std::string_view overload,
                      const std::vector<flatbuffers::Offset<Argument>>& args,
                      uint32_t num_outputs) {
  auto op_off = fbb_.CreateString(op);
  auto overload_off = overload.empty() ? 0 : fbb_.CreateString(overload);
  nodes_.push_back(CreateNode(fbb_, op_off, overload_off, fbb_.CreateVector(args), num_outputs));
}

flatbuffers::DetachedBuffer GraphMaker::finish(std::string_view name) {
  auto graph = CreateGraph(fbb_, fbb_.CreateString(name), fbb_.CreateVector(inputs_),
                           num_scalar_inputs_, fbb_.CreateVector(nodes_));
  finishGraph(fbb_, graph);
  return fbb_.Release();
}

}  // namespace genie::wire::samples
