// The executor against libtorch eager, in-process: the same ops called directly must give
// the same tensors (exactly, on CPU, for the same kernels; attention within a tolerance).
#include <ATen/ATen.h>
#include <algorithm>
#include <gtest/gtest.h>

#include "genie/node/executor.h"
#include "graph_builder.h"
#include "sample_models.h"

namespace genie::node {
namespace {

using namespace testing;
using wire::DType;

struct Compiled {
  flatbuffers::DetachedBuffer bytes;
  std::shared_ptr<const CompiledGraph> graph;
};

/// Verifies, checks and compiles; fails the test on any error.
Compiled compileOrFail(const Executor& executor, GraphBuilder& builder) {
  Compiled out{builder.finish(), nullptr};
  auto verified = wire::verifyGraph(wire::bytesOf(out.bytes));
  EXPECT_TRUE(verified.isOk()) << verified.status().toString();
  if (!verified) return out;
  auto compiled = executor.compile(**verified);
  if (!compiled) {
    ADD_FAILURE() << compiled.status().toString();
    return out;
  }
  out.graph = *compiled;
  return out;
}

std::vector<at::Tensor> runOrFail(const Executor& executor, const CompiledGraph& graph,
                                  std::vector<at::Tensor> inputs, std::vector<ScalarSlotValue> scalars = {}) {
  auto result = executor.run(graph, inputs, scalars);
  if (!result) {
    ADD_FAILURE() << result.status().toString();
    return {};
  }
  return *std::move(result);
}

/// The compile error's detail (code, op index and name, message); the test fails if it compiled.
RemoteDetail compileError(const Executor& executor, GraphBuilder& builder) {
  auto bytes = builder.finish();
  auto verified = wire::verifyGraph(wire::bytesOf(bytes));
  EXPECT_TRUE(verified.isOk()) << verified.status().toString();
  auto compiled = executor.compile(**verified);
  EXPECT_FALSE(compiled.isOk()) << "compiled although it should not";
  EXPECT_TRUE(compiled.isOk() || compiled.status().remote() != nullptr) << compiled.status().toString();
  return compiled.isOk() || !compiled.status().remote() ? RemoteDetail{} : *compiled.status().remote();
}

wire::ErrorCode codeOf(const RemoteDetail& detail) { return static_cast<wire::ErrorCode>(detail.code); }

class ExecutorTest : public ::testing::Test {
 protected:
  void SetUp() override { at::manual_seed(0); }
  Executor executor{c10::Device(c10::kCPU)};
};

/// Compiles and runs a sample model; the value of its output.
at::Tensor runModel(const Executor& executor, SampleModel& model) {
  auto compiled = compileOrFail(executor, model.graph);
  if (!compiled.graph) return {};
  auto values = runOrFail(executor, *compiled.graph, model.inputs);
  return values.empty() ? at::Tensor() : values[model.output];
}

TEST_F(ExecutorTest, MatmulAddReluChainEqualsEager) {
  SampleModel model = chainModel();
  at::Tensor result = runModel(executor, model);
  ASSERT_TRUE(result.defined());
  EXPECT_TRUE(at::equal(result, model.expected));
}

TEST_F(ExecutorTest, TwoLayerMlpEqualsEager) {
  SampleModel model = mlpModel();
  at::Tensor result = runModel(executor, model);
  ASSERT_TRUE(result.defined());
  EXPECT_TRUE(at::equal(result, model.expected));
}

TEST_F(ExecutorTest, ConvBatchNormPoolEqualsEager) {
  SampleModel model = convBnPoolModel();
  at::Tensor result = runModel(executor, model);
  ASSERT_TRUE(result.defined());
  EXPECT_EQ(result.sizes(), at::IntArrayRef({2, 8, 8, 8}));
  EXPECT_TRUE(at::equal(result, model.expected));
}

TEST_F(ExecutorTest, AttentionBlockMatchesEagerWithinTolerance) {
  SampleModel model = attentionModel();
  at::Tensor result = runModel(executor, model);
  ASSERT_TRUE(result.defined());
  EXPECT_TRUE(at::allclose(result, model.expected, /*rtol=*/1e-5, /*atol=*/1e-6));
}

TEST_F(ExecutorTest, GenieManualSeedSeedsTheDevicesGenerator) {
  // genie::manual_seed (registered by the executor's translation unit) runs through the
  // dispatcher like an aten op; its Device argument is rewritten to the executor's device.
  GraphBuilder g;
  g.op("genie::manual_seed", "", {Device("cuda", 3), I(42)}, 0);
  uint32_t first = g.op("aten::randn", "", {Ints({3, 4})});
  uint32_t second = g.op("aten::rand", "", {Ints({5})});
  auto compiled = compileOrFail(executor, g);
  ASSERT_NE(compiled.graph, nullptr);
  at::manual_seed(7);  // moved away from the graph's seed: the run must reseed it
  auto values = runOrFail(executor, *compiled.graph, {});
  ASSERT_EQ(values.size(), 2u);
  at::manual_seed(42);
  at::Tensor expected_first = at::randn({3, 4});
  at::Tensor expected_second = at::rand({5});
  EXPECT_TRUE(at::equal(values[first], expected_first));
  EXPECT_TRUE(at::equal(values[second], expected_second));
  auto again = runOrFail(executor, *compiled.graph, {});  // the same draws: reseeded each run
  ASSERT_EQ(again.size(), 2u);
  EXPECT_TRUE(at::equal(again[first], expected_first));
}

TEST_F(ExecutorTest, OpsWithSeveralOutputs) {
  GraphBuilder g;
  uint32_t x = g.input(DType::Float32, {6, 5});
  uint32_t max = g.op("aten::max", "dim", {T(x), I(1), B(false)}, 2);  // (values, indices)
  uint32_t parts = g.op("aten::split", "Tensor", {T(x), I(2)}, 3);     // Tensor[] of 3
  auto compiled = compileOrFail(executor, g);
  ASSERT_NE(compiled.graph, nullptr);
  at::Tensor tx = at::randn({6, 5});
  auto values = runOrFail(executor, *compiled.graph, {tx});
  ASSERT_EQ(values.size(), 1u + 2u + 3u);
  auto [expected_values, expected_indices] = at::max(tx, 1);
  EXPECT_TRUE(at::equal(values[max], expected_values));
  EXPECT_TRUE(at::equal(values[max + 1], expected_indices));
  auto expected_parts = at::split(tx, 2);
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(at::equal(values[parts + i], expected_parts[i]));
}

TEST_F(ExecutorTest, InPlaceOpUpdatesTheResidentTensor) {
  GraphBuilder g;
  uint32_t cache = g.input(DType::Float32, {4, 4});
  uint32_t update = g.input(DType::Float32, {4, 4});
  uint32_t added = g.op("aten::add_", "Tensor", {T(cache), T(update), Named("alpha", D(2.0))});
  uint32_t row = g.op("aten::select", "int", {T(cache), I(0), I(1)});
  uint32_t filled = g.op("aten::fill_", "Scalar", {T(row), D(7.0)});
  auto compiled = compileOrFail(executor, g);
  ASSERT_NE(compiled.graph, nullptr);
  at::Tensor resident = at::ones({4, 4});
  at::Tensor before = resident.clone();
  at::Tensor tu = at::randn({4, 4});
  auto values = runOrFail(executor, *compiled.graph, {resident, tu});
  ASSERT_FALSE(values.empty());
  at::Tensor expected = before.add(tu, 2.0);
  expected.select(0, 1).fill_(7.0);
  EXPECT_TRUE(at::equal(resident, expected));  // the input itself changed
  EXPECT_TRUE(values[added].is_same(resident));
  EXPECT_TRUE(values[filled].is_alias_of(resident));
}

TEST_F(ExecutorTest, ValuesNoOneNeedsAreDroppedAfterTheirLastUse) {
  GraphBuilder g;
  uint32_t x = g.input(DType::Float32, {64, 64});
  uint32_t a = g.op("aten::mul", "Scalar", {T(x), D(2.0)});
  uint32_t b = g.op("aten::add", "Scalar", {T(a), D(1.0), Named("alpha", I(1))});
  uint32_t unused = g.op("aten::neg", "", {T(a)});
  uint32_t c = g.op("aten::relu", "", {T(b)});
  auto compiled = compileOrFail(executor, g);
  ASSERT_NE(compiled.graph, nullptr);
  at::Tensor input = at::randn({64, 64});
  // a's last reader is the neg (node 2); b's the relu (node 3); the neg's result is read by none.
  std::vector<uint32_t> dead = compiled.graph->deadAfter(2);
  std::sort(dead.begin(), dead.end());
  EXPECT_EQ(dead, (std::vector<uint32_t>{a, unused}));
  std::vector<uint64_t> needed{c};
  auto values = executor.run(*compiled.graph, std::vector<at::Tensor>{input}, {}, nullptr,
                             std::span<const uint64_t>(needed));
  ASSERT_TRUE(values.isOk()) << values.status().toString();
  EXPECT_TRUE(at::equal((*values)[c], (input * 2 + 1).relu()));
  EXPECT_FALSE((*values)[a].defined());
  EXPECT_FALSE((*values)[b].defined());
  EXPECT_FALSE((*values)[unused].defined());
  auto all = runOrFail(executor, *compiled.graph, {input});  // without `needed`: every value
  ASSERT_EQ(all.size(), 5u);
  EXPECT_TRUE(all[a].defined() && all[b].defined() && all[unused].defined());
}

TEST_F(ExecutorTest, ScalarSlotsChangeBetweenRuns) {
  GraphBuilder g;
  uint32_t x = g.input(DType::Float32, {2, 12});
  uint32_t length = g.scalarSlot();
  uint32_t scale = g.scalarSlot();
  uint32_t view = g.op("aten::view", "", {T(x), Ints({2, -1, 0}, {-1, -1, static_cast<int32_t>(length)})});
  uint32_t mul = g.op("aten::mul", "Scalar", {T(view), Slot(scale)});
  auto compiled = compileOrFail(executor, g);
  ASSERT_NE(compiled.graph, nullptr);
  at::Tensor tx = at::arange(24, at::kFloat).reshape({2, 12});
  auto a = runOrFail(executor, *compiled.graph, {tx}, {int64_t{3}, 2.0});
  ASSERT_FALSE(a.empty());
  EXPECT_EQ(a[mul].sizes(), at::IntArrayRef({2, 4, 3}));
  EXPECT_TRUE(at::equal(a[mul], tx.view({2, -1, 3}) * 2.0));
  auto b = runOrFail(executor, *compiled.graph, {tx}, {int64_t{6}, 0.5});
  ASSERT_FALSE(b.empty());
  EXPECT_EQ(b[mul].sizes(), at::IntArrayRef({2, 2, 6}));
  EXPECT_TRUE(at::equal(b[mul], tx.view({2, -1, 6}) * 0.5));
}

TEST_F(ExecutorTest, ScalarSlotsInsideAScalarListChangeBetweenRuns) {
  // A per-tensor step size (aten::_foreach_mul.ScalarList, as a foreach optimizer step sends
  // one): element 1 of the Scalar[] comes from scalar input 0 each run, element 0 stays 2.0.
  GraphBuilder g;
  uint32_t x = g.input(DType::Float32, {3});
  uint32_t y = g.input(DType::Float32, {2});
  uint32_t step = g.scalarSlot();
  uint32_t first = g.op("aten::_foreach_mul", "ScalarList",
                        {Tensors({x, y}), Doubles({2.0, 0.0}, {-1, static_cast<int32_t>(step)})}, 2);
  auto compiled = compileOrFail(executor, g);
  ASSERT_NE(compiled.graph, nullptr);
  at::Tensor tx = at::arange(3, at::kFloat), ty = at::ones({2}, at::kFloat);
  for (double scale : {0.5, -3.0}) {
    auto values = runOrFail(executor, *compiled.graph, {tx, ty}, {scale});
    ASSERT_FALSE(values.empty());
    EXPECT_TRUE(at::equal(values[first], tx * 2.0));
    EXPECT_TRUE(at::equal(values[first + 1], ty * scale));
  }
}

TEST_F(ExecutorTest, DeviceArgumentsAreRewrittenToTheNodesDevice) {
  GraphBuilder g;
  uint32_t ones = g.op("aten::ones", "", {Ints({3}), Named("dtype", Dtype(DType::Int64)), Named("device", Device("cuda", 3))});
  auto compiled = compileOrFail(executor, g);
  ASSERT_NE(compiled.graph, nullptr);
  auto values = runOrFail(executor, *compiled.graph, {});
  ASSERT_FALSE(values.empty());
  EXPECT_EQ(values[ones].device(), c10::Device(c10::kCPU));
  EXPECT_EQ(values[ones].scalar_type(), at::kLong);
  EXPECT_TRUE(at::equal(values[ones], at::ones({3}, at::kLong)));
}

TEST_F(ExecutorTest, NodesRunWithTheDefaultDtypeTheyWereRecordedUnder) {
  GraphBuilder g;  // integer true division gives the default dtype: float64 for the first op
  uint32_t x = g.input(DType::Int64, {3});
  uint32_t wide = g.op("aten::div", "Tensor", {T(x), I(3)});
  g.defaultDtype(DType::Float64);
  uint32_t narrow = g.op("aten::div", "Tensor", {T(x), I(3)});
  auto compiled = compileOrFail(executor, g);
  ASSERT_NE(compiled.graph, nullptr);
  at::Tensor tx = at::arange(1, 4, at::kLong);
  auto values = runOrFail(executor, *compiled.graph, {tx});
  ASSERT_FALSE(values.empty());
  EXPECT_EQ(values[wide].scalar_type(), at::kDouble);
  EXPECT_TRUE(at::equal(values[wide], at::arange(1, 4, at::kDouble) / 3));
  EXPECT_EQ(values[narrow].scalar_type(), at::kFloat);
  EXPECT_EQ(c10::typeMetaToScalarType(c10::get_default_dtype()), at::kFloat);  // restored after the run

  GraphBuilder bad;  // an integer default dtype is refused
  uint32_t y = bad.input(DType::Int64, {3});
  bad.op("aten::div", "Tensor", {T(y), I(3)});
  bad.defaultDtype(DType::Int64);
  EXPECT_EQ(codeOf(compileError(executor, bad)), wire::ErrorCode::SchemaMismatch);
}

TEST_F(ExecutorTest, UnknownOpIsNamedWithItsIndex) {
  GraphBuilder g;
  uint32_t x = g.input(DType::Float32, {2});
  uint32_t r = g.op("aten::relu", "", {T(x)});
  g.op("aten::frobnicate", "", {T(r)});
  RemoteDetail error = compileError(executor, g);
  EXPECT_EQ(codeOf(error), wire::ErrorCode::UnknownOp);
  EXPECT_EQ(error.op_index, 1);
  EXPECT_EQ(error.op_name, "aten::frobnicate.default");
  GraphBuilder overload;
  uint32_t y = overload.input(DType::Float32, {2});
  overload.op("aten::add", "NoSuchOverload", {T(y), T(y)});
  EXPECT_EQ(codeOf(compileError(executor, overload)), wire::ErrorCode::UnknownOp);
}

TEST_F(ExecutorTest, ArgumentsThatDoNotFitTheSchemaAreRefused) {
  {
    GraphBuilder g;  // an int list where a tensor is expected (numbers become wrapped numbers)
    uint32_t x = g.input(DType::Float32, {2});
    g.op("aten::mm", "", {T(x), Ints({1, 2})});
    RemoteDetail error = compileError(executor, g);
    EXPECT_EQ(codeOf(error), wire::ErrorCode::SchemaMismatch);
    EXPECT_EQ(error.op_name, "aten::mm.default");
    EXPECT_NE(error.message.find("argument 'mat2'"), std::string::npos) << error.message;
  }
  {
    GraphBuilder g;  // a missing argument
    uint32_t x = g.input(DType::Float32, {2});
    g.op("aten::mm", "", {T(x)});
    RemoteDetail error = compileError(executor, g);
    EXPECT_EQ(codeOf(error), wire::ErrorCode::SchemaMismatch);
    EXPECT_NE(error.message.find("missing argument 'mat2'"), std::string::npos) << error.message;
  }
  {
    GraphBuilder g;  // an unknown keyword
    uint32_t x = g.input(DType::Float32, {2});
    g.op("aten::relu", "", {T(x), Named("inplace", B(true))});
    RemoteDetail error = compileError(executor, g);
    EXPECT_NE(error.message.find("no argument 'inplace'"), std::string::npos) << error.message;
  }
}

TEST_F(ExecutorTest, TorchErrorsNameTheOpAndKeepTorchsMessage) {
  GraphBuilder g;
  uint32_t a = g.input(DType::Float32, {2, 3});
  uint32_t b = g.input(DType::Float32, {4, 5});
  uint32_t r = g.op("aten::relu", "", {T(a)});
  g.op("aten::mm", "", {T(r), T(b)});
  auto compiled = compileOrFail(executor, g);
  ASSERT_NE(compiled.graph, nullptr);
  std::vector<at::Tensor> inputs = {at::randn({2, 3}), at::randn({4, 5})};
  auto result = executor.run(*compiled.graph, inputs, {});
  ASSERT_FALSE(result.isOk());
  ASSERT_NE(result.status().remote(), nullptr);
  const RemoteDetail& error = *result.status().remote();
  EXPECT_EQ(codeOf(error), wire::ErrorCode::TorchError);
  EXPECT_EQ(error.op_index, 1);
  EXPECT_EQ(error.op_name, "aten::mm.default");
  EXPECT_NE(error.message.find("cannot be multiplied"), std::string::npos) << error.message;
  EXPECT_EQ(result.status().code(), StatusCode::kInvalidArgument);
  // The executor is stateless between runs: a good run after a failed one works.
  std::vector<at::Tensor> good = {at::randn({2, 3}), at::randn({3, 5})};
  auto values = runOrFail(executor, *compiled.graph, good);
  ASSERT_FALSE(values.empty());
  EXPECT_TRUE(at::equal(values.back(), at::mm(at::relu(good[0]), good[1])));
}

TEST_F(ExecutorTest, TorchErrorsKeepTheExceptionClassEagerRaises) {
  GraphBuilder g;  // select past the end: eager raises IndexError (c10::IndexError)
  uint32_t x = g.input(DType::Float32, {2, 3});
  g.op("aten::select", "int", {T(x), I(0), I(5)});
  auto compiled = compileOrFail(executor, g);
  ASSERT_NE(compiled.graph, nullptr);
  std::vector<at::Tensor> inputs = {at::randn({2, 3})};
  auto result = executor.run(*compiled.graph, inputs, {});
  ASSERT_FALSE(result.isOk());
  ASSERT_NE(result.status().remote(), nullptr);
  EXPECT_EQ(result.status().remote()->error_class, "c10::IndexError");
  std::string eager;
  try {
    (void)at::select(inputs[0], 0, 5);
  } catch (const c10::Error& e) {
    eager = e.what_without_backtrace();
  }
  EXPECT_EQ(result.status().remote()->message, eager);  // eager's own text
  GraphBuilder mm;  // a shape mismatch is a plain c10::Error (RuntimeError in Python)
  uint32_t a = mm.input(DType::Float32, {2, 3});
  mm.op("aten::mm", "", {T(a), T(a)});
  auto mm_compiled = compileOrFail(executor, mm);
  ASSERT_NE(mm_compiled.graph, nullptr);
  std::vector<at::Tensor> mm_inputs = {at::randn({2, 3})};
  auto mm_result = executor.run(*mm_compiled.graph, mm_inputs, {});
  ASSERT_FALSE(mm_result.isOk());
  EXPECT_EQ(mm_result.status().remote()->error_class, "c10::Error");
}

TEST_F(ExecutorTest, AQuantizedTensorViewedAsAnotherDtypeIsRefusedNotRun) {
  // q.view(torch.uint8) keeps the quantized key set on a plain TensorImpl; as_strided of it would
  // read it as a QTensorImpl and crash the node. The view is refused where it is made.
  GraphBuilder g;
  uint32_t q = g.input(DType::QUInt8, {3});
  uint32_t v = g.op("aten::view", "dtype", {T(q), Dtype(DType::UInt8)});
  g.op("aten::as_strided", "", {T(v), Ints({3}), Ints({1}), I(0)});
  auto compiled = compileOrFail(executor, g);
  ASSERT_NE(compiled.graph, nullptr);
  std::vector<at::Tensor> inputs = {at::quantize_per_tensor(at::randn({3}), 0.1, 5, at::kQUInt8)};
  auto result = executor.run(*compiled.graph, inputs, {});
  ASSERT_FALSE(result.isOk());
  ASSERT_NE(result.status().remote(), nullptr);
  EXPECT_EQ(codeOf(*result.status().remote()), wire::ErrorCode::TorchError);
  EXPECT_EQ(result.status().remote()->op_index, 0);
  EXPECT_NE(result.status().remote()->message.find("viewing a quantized tensor as a tensor of another dtype"),
            std::string::npos)
      << result.status().remote()->message;
  // A quantized tensor's own ops run: int_repr.
  GraphBuilder ok;
  uint32_t q2 = ok.input(DType::QUInt8, {3});
  ok.op("aten::int_repr", "", {T(q2)});
  auto ok_compiled = compileOrFail(executor, ok);
  ASSERT_NE(ok_compiled.graph, nullptr);
  auto values = runOrFail(executor, *ok_compiled.graph, inputs);
  ASSERT_FALSE(values.empty());
  EXPECT_TRUE(at::equal(values.back(), inputs[0].int_repr()));
}

TEST_F(ExecutorTest, WrongInputCountsAreRefused) {
  GraphBuilder g;
  uint32_t x = g.input(DType::Float32, {2});
  g.op("aten::relu", "", {T(x)});
  auto compiled = compileOrFail(executor, g);
  ASSERT_NE(compiled.graph, nullptr);
  auto result = executor.run(*compiled.graph, {}, {});
  ASSERT_FALSE(result.isOk());
  EXPECT_NE(result.status().message().find("takes 1 tensor inputs, 0 given"), std::string::npos);
}

TEST_F(ExecutorTest, AnEmptyIntListFitsEveryListArgument) {
  // A client that does not know a list's element type writes [] as an empty IntListValue.
  GraphBuilder g;
  uint32_t x = g.input(DType::Float32, {2, 3});
  uint32_t sum = g.op("aten::sum", "dim_IntList", {T(x), Ints({})});             // int[1]?: all dims
  uint32_t none = g.op("aten::broadcast_tensors", "", {Ints({})}, 0);            // Tensor[]: no outputs
  auto compiled = compileOrFail(executor, g);
  ASSERT_NE(compiled.graph, nullptr);
  EXPECT_EQ(none, sum + 1);
  at::Tensor tx = at::randn({2, 3});
  auto values = runOrFail(executor, *compiled.graph, {tx});
  ASSERT_EQ(values.size(), 2u);
  EXPECT_TRUE(at::allclose(values[sum], tx.sum()));

  // Compiles for Tensor?[], bool[N], Scalar[] (with an empty Tensor[] beside it) and float[]?.
  GraphBuilder lists;
  uint32_t y = lists.input(DType::Float32, {2, 3});
  uint32_t mean = lists.input(DType::Float32, {2, 1});
  lists.op("aten::index", "Tensor", {T(y), Ints({})});
  lists.op("aten::native_layer_norm_backward", "",
           {T(y), T(y), Ints({3}), T(mean), T(mean), None(), None(), Ints({})}, 3);
  lists.op("aten::_foreach_add", "ScalarList", {Ints({}), Ints({})}, 0);
  lists.op("aten::upsample_nearest2d", "vec", {T(y), None(), Ints({})});
  EXPECT_NE(compileOrFail(executor, lists).graph, nullptr);

  // A non-empty IntListValue is still only an int list.
  GraphBuilder bad;
  uint32_t z = bad.input(DType::Float32, {2, 3});
  bad.op("aten::index", "Tensor", {T(z), Ints({0})});
  RemoteDetail error = compileError(executor, bad);
  EXPECT_EQ(codeOf(error), wire::ErrorCode::SchemaMismatch);
  EXPECT_NE(error.message.find("argument 'indices': expects Tensor?[], got IntListValue"), std::string::npos)
      << error.message;
}

TEST_F(ExecutorTest, IntListsFillFloatListsAndIntsOrBoolsFillScalars) {
  GraphBuilder g;
  uint32_t x = g.input(DType::Float32, {1, 1, 2, 3});
  uint32_t up = g.op("aten::upsample_nearest2d", "vec", {T(x), None(), Ints({2, 3})});  // float[]? scale_factors
  uint32_t times = g.op("aten::mul", "Scalar", {T(x), I(3)});                           // Scalar other
  uint32_t plus = g.op("aten::add", "Scalar", {T(x), B(true)});
  auto compiled = compileOrFail(executor, g);
  ASSERT_NE(compiled.graph, nullptr);
  at::Tensor tx = at::randn({1, 1, 2, 3});
  auto values = runOrFail(executor, *compiled.graph, {tx});
  ASSERT_FALSE(values.empty());
  EXPECT_TRUE(at::equal(values[up], at::upsample_nearest2d(tx, std::nullopt, std::vector<double>{2.0, 3.0})));
  EXPECT_EQ(values[up].sizes(), (std::vector<int64_t>{1, 1, 4, 9}));
  EXPECT_TRUE(at::equal(values[times], tx * 3));
  EXPECT_TRUE(at::equal(values[plus], tx + 1));

  // Scalar slots stay int-only in an IntListValue for float[].
  GraphBuilder slots;
  uint32_t y = slots.input(DType::Float32, {1, 1, 2, 3});
  slots.scalarSlot();
  slots.op("aten::upsample_nearest2d", "vec", {T(y), None(), Ints({2, 2}, {0, -1})});
  RemoteDetail error = compileError(executor, slots);
  EXPECT_NE(error.message.find("scalar slots"), std::string::npos) << error.message;
}

TEST_F(ExecutorTest, ScalarListsBindFromDoubleAndIntLists) {
  // Scalar[] (Adam's foreach step divides by one number per tensor): an op returning nothing
  // that updates its inputs in place.
  GraphBuilder g;
  uint32_t a = g.input(DType::Float32, {3});
  uint32_t b = g.input(DType::Float32, {2});
  g.op("aten::_foreach_div_", "ScalarList", {Tensors({a, b}), Doubles({2.0, 4.0})}, 0);
  g.op("aten::_foreach_mul_", "ScalarList", {Tensors({a, b}), Ints({3, 5})}, 0);
  auto compiled = compileOrFail(executor, g);
  ASSERT_NE(compiled.graph, nullptr);
  at::Tensor ta = at::full({3}, 8.0), tb = at::full({2}, 8.0);
  runOrFail(executor, *compiled.graph, {ta, tb});
  EXPECT_TRUE(at::equal(ta, at::full({3}, 12.0)));  // 8 / 2 * 3
  EXPECT_TRUE(at::equal(tb, at::full({2}, 10.0)));  // 8 / 4 * 5

  GraphBuilder wrong;
  uint32_t c = wrong.input(DType::Float32, {3});
  wrong.op("aten::_foreach_div_", "ScalarList", {Tensors({c}), D(2.0)}, 0);
  RemoteDetail error = compileError(executor, wrong);
  EXPECT_NE(error.message.find("expects Scalar[]"), std::string::npos) << error.message;
}

TEST_F(ExecutorTest, NumbersForTensorArgumentsAreWrappedNumbers) {
  // `x + 2` reaches __torch_dispatch__ as aten::add.Tensor(x, 2): the number is a 0-dim
  // wrapped-number tensor, so type promotion keeps x's dtype.
  GraphBuilder g;
  uint32_t x = g.input(DType::Float16, {3});
  uint32_t plus = g.op("aten::add", "Tensor", {T(x), D(2.5)});
  uint32_t times = g.op("aten::mul", "Tensor", {T(x), I(3)});
  auto compiled = compileOrFail(executor, g);
  ASSERT_NE(compiled.graph, nullptr);
  at::Tensor tx = at::randn({3}).to(at::kHalf);
  auto values = runOrFail(executor, *compiled.graph, {tx});
  ASSERT_FALSE(values.empty());
  EXPECT_EQ(values[plus].scalar_type(), at::kHalf);
  EXPECT_TRUE(at::equal(values[plus], tx + 2.5));
  EXPECT_TRUE(at::equal(values[times], tx * 3));
}

TEST_F(ExecutorTest, CompiledGraphsRememberBoundInputHandles) {
  const wire::Handle weight(7, 42);
  GraphBuilder g;
  uint32_t x = g.input(DType::Float32, {2, 3});
  uint32_t w = g.input(DType::Float32, {3, 4}, weight);
  g.op("aten::mm", "", {T(x), T(w)});
  auto compiled = compileOrFail(executor, g);
  ASSERT_NE(compiled.graph, nullptr);
  ASSERT_EQ(compiled.graph->inputHandles().size(), 2u);
  EXPECT_TRUE(wire::isNull(compiled.graph->inputHandles()[0]));
  EXPECT_TRUE(compiled.graph->inputHandles()[1] == weight);
}

}  // namespace
}  // namespace genie::node
