// Google Benchmark: the per-message costs on Genie's hot path that do not need a peer:
// verifying a received header, building one, and finding a registered region.
#include <benchmark/benchmark.h>

#include "genie/wire/codec.h"

namespace {

using namespace genie::wire;

void BM_VerifyPing(benchmark::State& state) {
  auto ping = buildPing(7, 123);
  for (auto _ : state) {
    auto verified = verifyMessage(bytesOf(ping), 8);
    benchmark::DoNotOptimize(verified);
  }
}
BENCHMARK(BM_VerifyPing);

void BM_BuildPing(benchmark::State& state) {
  for (auto _ : state) {
    auto ping = buildPing(7, 123);
    benchmark::DoNotOptimize(ping.data());
  }
}
BENCHMARK(BM_BuildPing);

void BM_VerifyPutTensors(benchmark::State& state) {
  std::vector<TensorSlotArgs> slots(state.range(0));
  PayloadLayout layout;
  for (size_t i = 0; i < slots.size(); ++i) {
    slots[i].handle = Handle(i + 1, 42);
    slots[i].desc.dtype = DType::Float32;
    slots[i].desc.shape = {12, 64, 64};
    slots[i].payload_offset = layout.add(12 * 64 * 64 * 4);
  }
  auto put = buildPutTensors(1, slots);
  for (auto _ : state) {
    auto verified = verifyMessage(bytesOf(*put), layout.size());
    benchmark::DoNotOptimize(verified);
  }
  state.SetItemsProcessed(state.iterations() * state.range(0));
}
BENCHMARK(BM_VerifyPutTensors)->Arg(1)->Arg(16)->Arg(256);

}  // namespace

BENCHMARK_MAIN();
