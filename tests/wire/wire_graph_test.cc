// checkGraph / verifyGraph: value-id rules, scalar slots, names and caps.
#include <gtest/gtest.h>

#include "genie/wire/codec.h"
#include "sample_messages.h"

namespace genie::wire {
namespace {

using Args = std::vector<flatbuffers::Offset<Argument>>;

Status graphStatus(const flatbuffers::DetachedBuffer& bytes) {
  auto r = verifyGraph(bytesOf(bytes));
  return r.isOk() ? Status::ok() : r.status();
}

void expectGraphError(const flatbuffers::DetachedBuffer& bytes, std::string_view want) {
  const Status st = graphStatus(bytes);
  ASSERT_FALSE(st.isOk()) << "accepted; wanted: " << want;
  EXPECT_EQ(st.code(), StatusCode::kInvalidMessage);
  EXPECT_NE(st.message().find(want), std::string::npos)
      << "message: " << st.message() << "\nwanted: " << want;
}

/// Two tensor inputs (ids 0, 1) and `scalars` scalar inputs.
samples::GraphMaker twoInputs(uint32_t scalars = 0) {
  samples::GraphMaker g;
  g.tensorInput(DType::Float32, {4});
  g.tensorInput(DType::Float32, {4});
  g.setNumScalarInputs(scalars);
  return g;
}

TEST(WireGraph, SampleGraphIsValid) {
  auto bytes = samples::sampleGraph();
  auto r = verifyGraph(bytesOf(bytes));
  ASSERT_TRUE(r.isOk()) << r.status().toString();
  EXPECT_TRUE(checkGraph(*r.value()).isOk());
  EXPECT_EQ(graphNumValues(*r.value()), 10u);
}

TEST(WireGraph, EmptyGraphIsValid) {
  samples::GraphMaker g;
  auto bytes = g.finish();
  auto r = verifyGraph(bytesOf(bytes));
  ASSERT_TRUE(r.isOk()) << r.status().toString();
  EXPECT_EQ(graphNumValues(*r.value()), 0u);
}

TEST(WireGraph, NodesSeeOnlyEarlierValues) {
  {
    auto g = twoInputs();
    g.node("aten::add", "Tensor", {g.tensor(0), g.tensor(1)});  // id 2
    g.node("aten::mul", "Tensor", {g.tensor(2), g.tensor(3)});  // id 3: itself
    expectGraphError(g.finish(),
                     "Graph.nodes[1].args[1].value: TensorValue 3 is not defined "
                     "before this node (ids 0..2 are)");
  }
  {
    auto g = twoInputs();
    g.node("aten::relu", "", {g.tensor(4)});  // forward reference
    g.node("aten::relu", "", {g.tensor(0)}, 3);
    expectGraphError(g.finish(), "Graph.nodes[0].args[0].value: TensorValue 4");
  }
  {
    samples::GraphMaker g;  // no inputs at all
    g.node("aten::relu", "", {g.tensor(0)});
    expectGraphError(g.finish(), "TensorValue 0 is not defined before this node (no value is)");
  }
  {
    auto g = twoInputs();
    g.node("aten::split", "Tensor", {g.tensor(0), g.integer(2)}, 2);  // ids 2, 3
    g.node("aten::add", "Tensor", {g.tensor(3), g.tensor(2)});        // id 4
    g.node("aten::relu", "", {g.tensor(4)});
    EXPECT_TRUE(graphStatus(g.finish()).isOk());
  }
}

TEST(WireGraph, TensorListsSeeOnlyEarlierValues) {
  {
    auto g = twoInputs();
    const uint32_t ids[] = {0, 1, 2};
    auto list = CreateTensorListValue(g.fbb(), g.fbb().CreateVector(ids, 3)).Union();
    g.node("aten::cat", "", {g.arg("tensors", Value::TensorListValue, list)});
    expectGraphError(g.finish(), "Graph.nodes[0].args[0].value.values[2]: id 2 is not defined");
  }
  {
    auto g = twoInputs();
    const int64_t ids[] = {-1, 1, 5};
    auto list = CreateOptionalTensorListValue(g.fbb(), g.fbb().CreateVector(ids, 3)).Union();
    g.node("aten::index", "Tensor",
           {g.tensor(0), g.arg("indices", Value::OptionalTensorListValue, list)});
    expectGraphError(g.finish(), "Graph.nodes[0].args[1].value.values[2]: id 5 is not defined");
  }
  {
    auto g = twoInputs();
    const int64_t ids[] = {-2};
    auto list = CreateOptionalTensorListValue(g.fbb(), g.fbb().CreateVector(ids, 1)).Union();
    g.node("aten::index", "Tensor", {g.tensor(0), g.arg("", Value::OptionalTensorListValue, list)});
    expectGraphError(g.finish(),
                     "Graph.nodes[0].args[1].value.values[0]: -2 is negative (-1 is None)");
  }
}

TEST(WireGraph, ScalarSlotsInRange) {
  {
    auto g = twoInputs(1);
    g.node("aten::add", "Scalar", {g.tensor(0), g.scalarInput(1, "other")});
    expectGraphError(g.finish(),
                     "Graph.nodes[0].args[1].value.slot: scalar slot 1 is out of "
                     "range (num_scalar_inputs 1)");
  }
  {
    auto g = twoInputs(2);
    g.node("aten::add", "Scalar", {g.tensor(0), g.scalarInput(1, "other")});
    EXPECT_TRUE(graphStatus(g.finish()).isOk());
  }
  {
    auto g = twoInputs(2);
    const int64_t v[] = {0, 0, 4};
    const int32_t slots[] = {-1, 1, 2};
    auto list =
        CreateIntListValue(g.fbb(), g.fbb().CreateVector(v, 3), g.fbb().CreateVector(slots, 3));
    g.node("aten::view", "", {g.tensor(0), g.arg("size", Value::IntListValue, list.Union())});
    expectGraphError(g.finish(),
                     "Graph.nodes[0].args[1].value.scalar_slots[2]: scalar slot 2 is "
                     "out of range (num_scalar_inputs 2)");
  }
  {
    auto g = twoInputs(2);
    const int64_t v[] = {0, 4};
    const int32_t slots[] = {-3, -1};
    auto list =
        CreateIntListValue(g.fbb(), g.fbb().CreateVector(v, 2), g.fbb().CreateVector(slots, 2));
    g.node("aten::view", "", {g.tensor(0), g.arg("size", Value::IntListValue, list.Union())});
    expectGraphError(g.finish(), "value.scalar_slots[0]: scalar slot -3 is out of range");
  }
  {
    auto g = twoInputs(2);
    const int64_t v[] = {0, 4};
    const int32_t slots[] = {1};
    auto list =
        CreateIntListValue(g.fbb(), g.fbb().CreateVector(v, 2), g.fbb().CreateVector(slots, 1));
    g.node("aten::view", "", {g.tensor(0), g.arg("size", Value::IntListValue, list.Union())});
    expectGraphError(g.finish(),
                     "Graph.nodes[0].args[1].value.scalar_slots: has 1 entries but v has 2");
  }
  {
    auto g = twoInputs(2);
    const double v[] = {0.5, 0.0};
    const int32_t slots[] = {-1, 2};
    auto list = CreateDoubleListValue(g.fbb(), g.fbb().CreateVector(v, 2), g.fbb().CreateVector(slots, 2));
    g.node("aten::_foreach_mul", "ScalarList", {g.tensor(0), g.arg("scalars", Value::DoubleListValue, list.Union())});
    expectGraphError(g.finish(),
                     "Graph.nodes[0].args[1].value.scalar_slots[1]: scalar slot 2 is "
                     "out of range (num_scalar_inputs 2)");
  }
  {
    auto g = twoInputs(2);
    const double v[] = {0.5, 0.0};
    const int32_t slots[] = {-1};
    auto list = CreateDoubleListValue(g.fbb(), g.fbb().CreateVector(v, 2), g.fbb().CreateVector(slots, 1));
    g.node("aten::_foreach_mul", "ScalarList", {g.tensor(0), g.arg("scalars", Value::DoubleListValue, list.Union())});
    expectGraphError(g.finish(),
                     "Graph.nodes[0].args[1].value.scalar_slots: has 1 entries but v has 2");
  }
}

TEST(WireGraph, ArgumentsNeedValues) {
  {
    auto g = twoInputs();
    g.node("aten::relu", "", {g.arg("x", Value::NONE, 0)});
    expectGraphError(g.finish(), "Graph.nodes[0].args[0].value: NONE (use NoneValue for None)");
  }
  {
    auto g = twoInputs();
    g.node("aten::relu", "", {g.arg("x", Value::TensorValue, 0)});
    expectGraphError(g.finish(), "Graph.nodes[0].args[0].value: missing TensorValue table");
  }
  {
    auto g = twoInputs();
    auto v = CreateIntValue(g.fbb(), 1).Union();
    g.node("aten::relu", "", {g.arg("x", static_cast<Value>(99), v)});
    expectGraphError(g.finish(), "Graph.nodes[0].args[0].value: type 99 is not a known Value");
  }
  {
    auto g = twoInputs();
    auto v = CreateDTypeValue(g.fbb(), DType::Undefined).Union();
    g.node("aten::to", "dtype", {g.tensor(0), g.arg("dtype", Value::DTypeValue, v)});
    expectGraphError(g.finish(),
                     "Graph.nodes[0].args[1].value.v: Undefined is not a defined DType");
  }
}

TEST(WireGraph, NamesAndCaps) {
  {
    auto g = twoInputs();
    g.node("", "", {g.tensor(0)});
    expectGraphError(g.finish(), "Graph.nodes[0].op: empty");
  }
  {
    auto g = twoInputs();
    g.node(std::string(257, 'a'), "", {g.tensor(0)});
    expectGraphError(g.finish(), "Graph.nodes[0].op: is 257 chars (at most 256)");
  }
  {
    auto g = twoInputs();
    g.node(std::string(256, 'a'), std::string(256, 'b'), {g.tensor(0)});
    EXPECT_TRUE(graphStatus(g.finish()).isOk());
  }
  {
    auto g = twoInputs();
    g.node("aten::relu", std::string(300, 'o'), {g.tensor(0)});
    expectGraphError(g.finish(), "Graph.nodes[0].overload: is 300 chars");
  }
  {
    auto g = twoInputs();
    g.node("aten::relu", "", {g.tensor(0, std::string(257, 'n'))});
    expectGraphError(g.finish(), "Graph.nodes[0].args[0].name: is 257 chars");
  }
  {
    auto g = twoInputs();
    Args args;
    for (int i = 0; i < 1025; ++i) args.push_back(g.tensor(0));
    g.node("genie::many", "", args);
    expectGraphError(g.finish(), "Graph.nodes[0].args: has 1025 entries (at most 1024)");
  }
  {
    auto g = twoInputs();
    g.node("aten::unbind", "int", {g.tensor(0)}, kMaxNodeOutputs + 1);
    expectGraphError(g.finish(), "Graph.nodes[0].num_outputs: 65537 is over 65536");
  }
  {
    auto g = twoInputs();
    g.node("aten::relu", "", {g.tensor(0)}, 0);  // ops returning nothing are fine
    EXPECT_TRUE(graphStatus(g.finish()).isOk());
  }
}

TEST(WireGraph, TotalValuesCapped) {
  auto g = twoInputs();
  const uint32_t per_node = kMaxNodeOutputs;
  const uint32_t nodes = static_cast<uint32_t>(kMaxGraphValues / per_node);  // the last crosses
  for (uint32_t i = 0; i < nodes; ++i) g.node("aten::unbind", "int", {g.tensor(0)}, per_node);
  auto bytes = g.finish();
  expectGraphError(bytes, fmt::format("Graph.nodes[{}]: the graph has more than {} values",
                                      nodes - 1, kMaxGraphValues));
  auto root = flatbuffers::GetRoot<Graph>(bytes.data());
  EXPECT_EQ(graphNumValues(*root), 2 + uint64_t{nodes} * per_node);
}

TEST(WireGraph, InputDescsChecked) {
  const int64_t shape[] = {2, 2};
  flatbuffers::FlatBufferBuilder b;
  auto bad_desc = CreateTensorDesc(b, DType::Float32, b.CreateVector(shape, 2), 0, 0, 15);
  std::vector<flatbuffers::Offset<GraphInput>> inputs = {
      CreateGraphInput(b, InputKind::Scalar), CreateGraphInput(b, InputKind::Tensor, bad_desc)};
  finishGraph(b, CreateGraph(b, 0, b.CreateVector(inputs)));
  expectGraphError(b.Release(),
                   "Graph.inputs[1].desc: nbytes 15 does not match shape [2,2] of "
                   "Float32 (16 bytes)");
  flatbuffers::FlatBufferBuilder k;
  std::vector<flatbuffers::Offset<GraphInput>> kinds = {
      CreateGraphInput(k, static_cast<InputKind>(5))};
  finishGraph(k, CreateGraph(k, 0, k.CreateVector(kinds)));
  expectGraphError(k.Release(), "Graph.inputs[0].kind: 5 is not an InputKind");
}

TEST(WireGraph, VerifyGraphRejectsJunkAndUnalignedBytes) {
  std::vector<uint64_t> junk(4, 0xffffffffffffffffull);
  auto st = verifyGraph(std::as_bytes(std::span(junk)));
  ASSERT_FALSE(st.isOk());
  EXPECT_NE(st.status().message().find("Graph: failed FlatBuffers verification"),
            std::string::npos);
  auto graph = samples::sampleGraph();
  std::vector<uint64_t> storage(graph.size() / 8 + 2);
  auto* shifted = reinterpret_cast<uint8_t*>(storage.data()) + 4;
  std::memcpy(shifted, graph.data(), graph.size());
  auto unaligned = verifyGraph(std::as_bytes(std::span(shifted, graph.size())));
  EXPECT_EQ(unaligned.status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace genie::wire
