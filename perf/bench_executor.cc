// Google Benchmark: the executor's overhead per op. A registered (compiled) graph of N small
// ops run through Executor::run, against the same ops called directly through libtorch in
// C++, in the same run. Report: time per op of each; their ratio is the executor overhead.
#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>
#include <benchmark/benchmark.h>

#include "genie/node/executor.h"
#include "genie/wire/codec.h"

namespace {

using namespace genie;

constexpr int kOps = 1000;

/// x -> add(x, y) -> mul(., y) -> add ... (kOps ops on [16, 16] float tensors).
flatbuffers::DetachedBuffer chainGraph() {
  flatbuffers::FlatBufferBuilder fbb;
  auto desc = wire::createTensorDesc(fbb, wire::DType::Float32, std::vector<int64_t>{16, 16});
  std::vector<flatbuffers::Offset<wire::GraphInput>> inputs = {
      wire::CreateGraphInput(fbb, wire::InputKind::Tensor, *desc),
      wire::CreateGraphInput(fbb, wire::InputKind::Tensor, *desc)};
  std::vector<flatbuffers::Offset<wire::Node>> nodes;
  uint32_t last = 0;
  for (int i = 0; i < kOps; ++i) {
    auto arg = [&](uint32_t value) {
      return wire::CreateArgument(fbb, 0, wire::Value::TensorValue, wire::CreateTensorValue(fbb, value).Union());
    };
    std::vector<flatbuffers::Offset<wire::Argument>> args = {arg(last), arg(1)};
    bool add = i % 2 == 0;
    nodes.push_back(wire::CreateNode(fbb, fbb.CreateString(add ? "aten::add" : "aten::mul"),
                                     fbb.CreateString("Tensor"), fbb.CreateVector(args), 1));
    last = 2 + i;
  }
  auto graph = wire::CreateGraph(fbb, fbb.CreateString("chain"), fbb.CreateVector(inputs), 0, fbb.CreateVector(nodes));
  wire::finishGraph(fbb, graph);
  return fbb.Release();
}

void BM_ExecutorChain(benchmark::State& state) {
  node::Executor executor(c10::Device(c10::kCPU));
  auto bytes = chainGraph();
  auto graph = wire::verifyGraph(wire::bytesOf(bytes));
  auto compiled = *executor.compile(**graph);
  std::vector<at::Tensor> inputs = {at::randn({16, 16}), at::full({16, 16}, 0.999f)};
  for (auto _ : state) {
    auto values = executor.run(*compiled, inputs, {});
    benchmark::DoNotOptimize(values);
  }
  state.counters["us_per_op"] = benchmark::Counter(kOps * 1e-6, benchmark::Counter::kIsIterationInvariantRate |
                                                                   benchmark::Counter::kInvert);
}
BENCHMARK(BM_ExecutorChain)->Unit(benchmark::kMicrosecond);

void BM_DirectLibtorchChain(benchmark::State& state) {
  at::Tensor x = at::randn({16, 16}), y = at::full({16, 16}, 0.999f);
  for (auto _ : state) {
    std::vector<at::Tensor> values;
    values.reserve(kOps);
    at::Tensor last = x;
    for (int i = 0; i < kOps; ++i) {
      last = i % 2 == 0 ? at::add(last, y) : at::mul(last, y);
      values.push_back(last);
    }
    benchmark::DoNotOptimize(values);
  }
  state.counters["us_per_op"] = benchmark::Counter(kOps * 1e-6, benchmark::Counter::kIsIterationInvariantRate |
                                                                   benchmark::Counter::kInvert);
}
BENCHMARK(BM_DirectLibtorchChain)->Unit(benchmark::kMicrosecond);

/// The same direct calls below autograd, as the executor runs them (c10::InferenceMode).
void BM_DirectLibtorchChainInferenceMode(benchmark::State& state) {
  c10::InferenceMode no_autograd;
  BM_DirectLibtorchChain(state);
}
BENCHMARK(BM_DirectLibtorchChainInferenceMode)->Unit(benchmark::kMicrosecond);

}  // namespace

BENCHMARK_MAIN();
