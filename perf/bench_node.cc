// Google Benchmark: the round trip of a registered 1-op graph through a real genie-node on
// loopback, against an empty request/response (Ping/Pong) to the same node through the same
// client, in the same run. Both use the C++ client (progress thread + waiting caller); the
// difference is what the node does for RunGraph (session thread, executor, reply payload).
//
//   build/bin/bench_node   (starts build/bin/genie-node itself; UCX_TLS honoured)
#include <benchmark/benchmark.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <string>

#include "genie/client/client.h"
#include "genie/wire/codec.h"

namespace {

using namespace genie;

/// genie-node on loopback for the whole benchmark run.
struct Node {
  Node() {
    char self[4096] = {};
    ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
    std::string dir = std::string(self, n > 0 ? n : 0);
    std::string path = dir.substr(0, dir.rfind('/')) + "/genie-node";
    int fds[2];
    if (pipe(fds) != 0) return;
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, fds[1], STDOUT_FILENO);
    std::string a0 = path, a1 = "--listen", a2 = "127.0.0.1:0", a3 = "--log-level", a4 = "warn";
    char* argv[] = {a0.data(), a1.data(), a2.data(), a3.data(), a4.data(), nullptr};
    posix_spawn(&pid, path.c_str(), &actions, nullptr, argv, environ);
    close(fds[1]);
    FILE* out = fdopen(fds[0], "r");
    char line[512] = {};
    if (fgets(line, sizeof(line), out)) {
      std::string text(line);
      auto at = text.find("127.0.0.1:");
      if (at != std::string::npos) port = static_cast<uint16_t>(std::stoi(text.substr(at + 10)));
    }
    fclose(out);
  }
  ~Node() {
    if (pid > 0) {
      kill(pid, SIGTERM);
      waitpid(pid, nullptr, 0);
    }
  }
  pid_t pid = -1;
  uint16_t port = 0;
};

Node& node() {
  static Node instance;
  return instance;
}

std::unique_ptr<client::Client> connect() {
  auto c = client::Client::connect("127.0.0.1", node().port, {});
  return c ? std::move(c.value()) : nullptr;
}

void BM_PingRoundTrip(benchmark::State& state) {
  auto client = connect();
  if (!client) return state.SkipWithError("no genie-node");
  for (auto _ : state) {
    if (!client->ping()) return state.SkipWithError("ping failed");
  }
}
BENCHMARK(BM_PingRoundTrip)->Unit(benchmark::kMicrosecond)->UseRealTime();

void BM_RunGraphOneOpRoundTrip(benchmark::State& state) {
  auto client = connect();
  if (!client) return state.SkipWithError("no genie-node");
  // relu of a resident 16-float tensor; the 64-byte result comes back.
  flatbuffers::FlatBufferBuilder fbb;
  auto desc = wire::createTensorDesc(fbb, wire::DType::Float32, std::vector<int64_t>{16});
  std::vector<flatbuffers::Offset<wire::GraphInput>> inputs = {wire::CreateGraphInput(fbb, wire::InputKind::Tensor, *desc)};
  std::vector<flatbuffers::Offset<wire::Argument>> args = {
      wire::CreateArgument(fbb, 0, wire::Value::TensorValue, wire::CreateTensorValue(fbb, 0).Union())};
  std::vector<flatbuffers::Offset<wire::Node>> nodes = {
      wire::CreateNode(fbb, fbb.CreateString("aten::relu"), fbb.CreateString(""), fbb.CreateVector(args), 1)};
  wire::finishGraph(fbb, wire::CreateGraph(fbb, 0, fbb.CreateVector(inputs), 0, fbb.CreateVector(nodes)));
  auto graph = fbb.Release();
  auto id = client->registerGraph(wire::bytesOf(graph));
  if (!id) return state.SkipWithError(id.status().toString().c_str());
  std::vector<float> data(16, -1.0f);
  wire::TensorDescArgs tensor;
  tensor.dtype = wire::DType::Float32;
  tensor.shape = {16};
  wire::Handle handle = client::Client::newHandle();
  if (!client->putTensor(handle, tensor, wire::Residency::PersistentWeight,
                         {reinterpret_cast<const std::byte*>(data.data()), data.size() * sizeof(float)})) {
    return state.SkipWithError("put failed");
  }
  wire::RunGraphArgs run;
  run.graph_id = *id;
  run.inputs = {{0, handle, std::nullopt}};
  run.outputs = {{1, wire::OutputAction::Return, {}, {}}};
  for (auto _ : state) {
    auto out = client->runGraph(run);
    if (!out) return state.SkipWithError(out.status().toString().c_str());
    benchmark::DoNotOptimize(out);
  }
}
BENCHMARK(BM_RunGraphOneOpRoundTrip)->Unit(benchmark::kMicrosecond)->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
