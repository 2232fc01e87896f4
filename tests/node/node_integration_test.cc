// A real genie-node process on loopback, driven by the C++ client; results compared with
// libtorch eager run in the test.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>

#include "genie/client/client.h"
#include "genie/node/executor.h"
#include "graph_builder.h"
#include "node_test_util.h"
#include "node_process.h"
#include "sample_models.h"

namespace genie::node {
namespace {

using namespace std::chrono_literals;
using namespace testing;
using client::Client;
using client::ClientOptions;
using wire::DType;

/// Puts `inputs` resident, registers `graph`, runs it returning `outputs`; the results.
std::vector<at::Tensor> runThroughNode(Client& client, GraphBuilder& graph, const std::vector<at::Tensor>& inputs,
                                       const std::vector<uint32_t>& outputs) {
  std::vector<at::Tensor> results;
  auto bytes = graph.finish();
  auto id = client.registerGraph(wire::bytesOf(bytes));
  EXPECT_TRUE(id.isOk()) << id.status().toString();
  if (!id) return results;
  wire::RunGraphArgs run;
  run.graph_id = *id;
  std::vector<wire::Handle> handles;
  for (uint32_t i = 0; i < inputs.size(); ++i) {
    handles.push_back(Client::newHandle());
    Status put = client.putTensor(handles.back(), descOf(inputs[i]), wire::Residency::PersistentWeight,
                                  bytesOf(inputs[i]));
    EXPECT_TRUE(put.isOk()) << put.toString();
    run.inputs.push_back({i, handles.back(), std::nullopt});
  }
  for (uint32_t value : outputs) run.outputs.push_back({value, wire::OutputAction::Return, {}, {}});
  auto returned = client.runGraph(run);
  EXPECT_TRUE(returned.isOk()) << returned.status().toString();
  if (returned) for (const auto& r : *returned) results.push_back(tensorOf(r));
  EXPECT_TRUE(client.freeTensors(handles).isOk());
  return results;
}

/// Registers the chain relu(mm(x, w) + b) (chainModel) and returns its id and output value id.
std::pair<wire::GraphId, uint32_t> registerChain(Client& client) {
  SampleModel chain = chainModel();
  auto bytes = chain.graph.finish();
  auto id = client.registerGraph(wire::bytesOf(bytes));
  EXPECT_TRUE(id.isOk()) << id.status().toString();
  if (id) {
    EXPECT_TRUE(*id == wire::hashGraph(wire::bytesOf(bytes)));
  }
  return {id.isOk() ? *id : wire::GraphId(), chain.output};
}

/// A RunGraph of the chain: `input` inline, the weight and bias resident under hw and hb, one
/// output spec (its value is the chain's relu).
wire::RunGraphArgs chainRun(const wire::GraphId& graph, const at::Tensor& input, const wire::Handle& hw,
                            const wire::Handle& hb, wire::OutputSpecArgs output) {
  wire::RunGraphArgs run;
  run.graph_id = graph;
  wire::TensorSlotArgs inline_x;
  inline_x.desc = descOf(input);
  run.inputs = {{0, {}, inline_x}, {1, hw, std::nullopt}, {2, hb, std::nullopt}};
  run.outputs = {output};
  return run;
}

TEST(NodeIntegration, ResidentWeightsAndAChainEqualEager) {
  NodeProcess node;
  auto client = connectOrFail(node.port());
  ASSERT_NE(client, nullptr);
  at::manual_seed(0);
  at::Tensor x = at::randn({4, 8}), w = at::randn({8, 16}), b = at::randn({16});
  wire::Handle hw = Client::newHandle(), hb = Client::newHandle(), hy = Client::newHandle();
  ASSERT_TRUE(client->putTensor(hw, descOf(w), wire::Residency::PersistentWeight, bytesOf(w)).isOk());
  ASSERT_TRUE(client->putTensor(hb, descOf(b), wire::Residency::PersistentWeight, bytesOf(b)).isOk());
  EXPECT_EQ(residentBytes(*client), uint64_t(w.nbytes() + b.nbytes()));
  auto [graph, relu] = registerChain(*client);

  // x travels inline; the output comes back and also stays resident under hy.
  wire::RunGraphArgs run =
      chainRun(graph, x, hw, hb, {relu, wire::OutputAction::ReturnAndKeep, hy, wire::Residency::EphemeralActivation});
  auto outputs = client->runGraph(run, bytesOf(x));
  ASSERT_TRUE(outputs.isOk()) << outputs.status().toString();
  ASSERT_EQ(outputs->size(), 1u);
  at::Tensor expected = at::relu(at::mm(x, w) + b);
  EXPECT_TRUE(at::equal(tensorOf((*outputs)[0]), expected));

  auto kept = client->getTensor(hy);
  ASSERT_TRUE(kept.isOk()) << kept.status().toString();
  EXPECT_TRUE(at::equal(tensorOf(*kept), expected));
  // Registering the same graph again answers the same id (cached by content hash).
  auto again = registerChain(*client);
  EXPECT_TRUE(again.first == graph);
  auto stats = client->stats();
  ASSERT_TRUE(stats.isOk());
  EXPECT_EQ(stats->graphs_cached, 1u);
  EXPECT_EQ(stats->ops_executed, 3u);
  ASSERT_TRUE(client->freeTensors(std::vector<wire::Handle>{hw, hb, hy}).isOk());
  EXPECT_EQ(residentBytes(*client), 0u);
}


struct ModelCase {
  const char* name;
  SampleModel (*make)();
  bool exact;  // same kernels, same CPU: equal; attention only within a thread-split tolerance
};

class NodeModelTest : public ::testing::TestWithParam<ModelCase> {};

TEST_P(NodeModelTest, EqualsEager) {
  NodeProcess node;
  auto client = connectOrFail(node.port());
  ASSERT_NE(client, nullptr);
  at::manual_seed(1);
  SampleModel model = GetParam().make();
  auto out = runThroughNode(*client, model.graph, model.inputs, {model.output});
  ASSERT_EQ(out.size(), 1u);
  if (GetParam().exact) {
    EXPECT_TRUE(at::equal(out[0], model.expected));
  } else {
    EXPECT_TRUE(at::allclose(out[0], model.expected, 1e-5, 1e-6));
  }
}

INSTANTIATE_TEST_SUITE_P(NodeIntegration, NodeModelTest,
                         ::testing::Values(ModelCase{"TwoLayerMlp", &mlpModel, true},
                                           ModelCase{"ConvBatchNormPool", &convBnPoolModel, true},
                                           ModelCase{"AttentionBlock", &attentionModel, false}),
                         [](const ::testing::TestParamInfo<ModelCase>& info) { return info.param.name; });

TEST(NodeIntegration, SeveralOutputsAndInPlaceOnAResidentTensor) {
  NodeProcess node;
  auto client = connectOrFail(node.port());
  ASSERT_NE(client, nullptr);
  at::Tensor x = at::randn({6, 5}), cache = at::zeros({6, 5});
  // A resident "KV cache" updated in place by a graph, then read back.
  wire::Handle hcache = Client::newHandle();
  ASSERT_TRUE(client->putTensor(hcache, descOf(cache), wire::Residency::StatefulKvCache, bytesOf(cache)).isOk());
  GraphBuilder g;
  uint32_t gx = g.input(DType::Float32, {6, 5}), gc = g.input(DType::Float32, {6, 5});
  uint32_t max = g.op("aten::max", "dim", {T(gx), I(1), B(false)}, 2);
  g.op("aten::add_", "Tensor", {T(gc), T(gx)});
  auto bytes = g.finish();
  auto id = client->registerGraph(wire::bytesOf(bytes));
  ASSERT_TRUE(id.isOk()) << id.status().toString();
  wire::RunGraphArgs run;
  run.graph_id = *id;
  wire::TensorSlotArgs inline_x;
  inline_x.desc = descOf(x);
  run.inputs = {{gx, {}, inline_x}, {gc, hcache, std::nullopt}};
  run.outputs = {{max, wire::OutputAction::Return, {}, {}}, {max + 1, wire::OutputAction::Return, {}, {}}};
  for (int step = 1; step <= 2; ++step) {
    auto out = client->runGraph(run, bytesOf(x));
    ASSERT_TRUE(out.isOk()) << out.status().toString();
    ASSERT_EQ(out->size(), 2u);
    auto [values, indices] = at::max(x, 1);
    EXPECT_TRUE(at::equal(tensorOf((*out)[0]), values));
    EXPECT_TRUE(at::equal(tensorOf((*out)[1]), indices));
    auto resident = client->getTensor(hcache);
    ASSERT_TRUE(resident.isOk());
    EXPECT_TRUE(at::equal(tensorOf(*resident), x * step));  // the cache itself grew, in place
  }
}

TEST(NodeIntegration, ArgumentsOfTheWrongTypeAreRefusedNamingTheArgument) {
  NodeProcess node;
  auto client = connectOrFail(node.port());
  ASSERT_NE(client, nullptr);
  GraphBuilder g;
  uint32_t x = g.input(DType::Float32, {2, 2});
  g.op("aten::mm", "", {T(x), Ints({2, 2})});
  auto bytes = g.finish();
  RemoteDetail mismatch = remoteOf(client->registerGraph(wire::bytesOf(bytes)));
  EXPECT_EQ(codeOf(mismatch), wire::ErrorCode::SchemaMismatch);
  EXPECT_EQ(mismatch.op_index, 0);
  EXPECT_NE(mismatch.message.find("argument 'mat2'"), std::string::npos) << mismatch.message;
  EXPECT_TRUE(client->ping().isOk());
}

TEST(NodeIntegration, WrongTokenAndWrongVersionAreRefused) {
  char path[] = "/tmp/genie-token-XXXXXX";
  int fd = mkstemp(path);
  ASSERT_GE(fd, 0);
  std::ofstream(path) << "s3cret\n";
  close(fd);
  NodeProcess node({"--auth-token-file", path});
  ClientOptions options;
  options.auth_token = "guess";
  auto refused = Client::connect("127.0.0.1", node.port(), options);
  ASSERT_FALSE(refused.isOk());
  EXPECT_EQ(refused.status().code(), StatusCode::kRemote);
  EXPECT_NE(refused.status().message().find("Unauthenticated"), std::string::npos) << refused.status().toString();
  options.auth_token = "s3cret";
  options.protocol_version = wire::kProtocolVersion + 1;
  auto old = Client::connect("127.0.0.1", node.port(), options);
  ASSERT_FALSE(old.isOk());
  EXPECT_NE(old.status().message().find("UnsupportedVersion"), std::string::npos) << old.status().toString();
  // The right token and version get a session.
  auto good = connectOrFail(node.port(), "s3cret");
  ASSERT_NE(good, nullptr);
  EXPECT_TRUE(good->ping().isOk());
  std::remove(path);
}

TEST(NodeIntegration, BadRequestsGetClearErrorsAndTheNodeKeepsServing) {
  NodeProcess node;
  auto client = connectOrFail(node.port());
  ASSERT_NE(client, nullptr);
  // An unknown op: refused at registration, naming it and its index.
  GraphBuilder g;
  uint32_t input = g.input(DType::Float32, {2});
  uint32_t r = g.op("aten::relu", "", {T(input)});
  g.op("aten::frobnicate", "", {T(r)});
  auto bytes = g.finish();
  auto unknown = client->registerGraph(wire::bytesOf(bytes));
  ASSERT_FALSE(unknown.isOk());
  EXPECT_EQ(codeOf(remoteOf(unknown)), wire::ErrorCode::UnknownOp);
  EXPECT_EQ(remoteOf(unknown).op_index, 1);
  EXPECT_EQ(remoteOf(unknown).op_name, "aten::frobnicate.default");

  // Wrong shapes: torch's error, naming the op.
  auto [graph, relu] = registerChain(*client);
  at::Tensor x_bad = at::randn({4, 7}), w = at::randn({8, 16}), b = at::randn({16});
  wire::Handle hw = Client::newHandle(), hb = Client::newHandle();
  ASSERT_TRUE(client->putTensor(hw, descOf(w), wire::Residency::PersistentWeight, bytesOf(w)).isOk());
  ASSERT_TRUE(client->putTensor(hb, descOf(b), wire::Residency::PersistentWeight, bytesOf(b)).isOk());
  wire::RunGraphArgs run;
  run.graph_id = graph;
  wire::TensorSlotArgs inline_x;
  inline_x.desc = descOf(x_bad);
  run.inputs = {{0, {}, inline_x}, {1, hw, std::nullopt}, {2, hb, std::nullopt}};
  run.outputs = {{relu, wire::OutputAction::Return, {}, wire::Residency::EphemeralActivation}};
  auto shapes = client->runGraph(run, bytesOf(x_bad));
  ASSERT_FALSE(shapes.isOk());
  EXPECT_EQ(codeOf(remoteOf(shapes)), wire::ErrorCode::TorchError);
  EXPECT_EQ(remoteOf(shapes).op_name, "aten::mm.default");
  EXPECT_EQ(remoteOf(shapes).error_class, "c10::Error");
  EXPECT_NE(remoteOf(shapes).message.find("cannot be multiplied"), std::string::npos);

  // A handle this session never had (freed, or another session's).
  ASSERT_TRUE(client->freeTensors(std::vector<wire::Handle>{hb}).isOk());
  auto freed = client->runGraph(run, bytesOf(x_bad));
  ASSERT_FALSE(freed.isOk());
  EXPECT_EQ(codeOf(remoteOf(freed)), wire::ErrorCode::UnknownHandle);
  EXPECT_NE(remoteOf(freed).message.find(wire::toString(hb)), std::string::npos);

  // An unregistered graph.
  run.graph_id = wire::GraphId(1, 2);
  EXPECT_EQ(codeOf(remoteOf(client->runGraph(run, bytesOf(x_bad)))), wire::ErrorCode::UnknownGraph);

  // And then a good request is served.
  at::Tensor x = at::randn({4, 8});
  ASSERT_TRUE(client->putTensor(hb, descOf(b), wire::Residency::PersistentWeight, bytesOf(b)).isOk());
  run.graph_id = graph;
  inline_x.desc = descOf(x);
  run.inputs = {{0, {}, inline_x}, {1, hw, std::nullopt}, {2, hb, std::nullopt}};
  auto good = client->runGraph(run, bytesOf(x));
  ASSERT_TRUE(good.isOk()) << good.status().toString();
  EXPECT_TRUE(at::equal(tensorOf((*good)[0]), at::relu(at::mm(x, w) + b)));
}

TEST(NodeIntegration, AQuantizedTensorIsNotReadAsBytesAndTheNodeKeepsServing) {
  // The wire has no bytes for a quantized tensor (it travels as int_repr with its quantizer):
  // reading one resident by handle gets a clear error, not a reply the client must refuse.
  NodeProcess node;
  auto client = connectOrFail(node.port());
  ASSERT_NE(client, nullptr);
  at::Tensor x = at::randn({4});
  GraphBuilder g;
  uint32_t gx = g.input(DType::Float32, {4});
  uint32_t q = g.op("aten::quantize_per_tensor", "", {T(gx), D(0.1), I(3), Dtype(DType::QUInt8)});
  auto bytes = g.finish();
  auto id = client->registerGraph(wire::bytesOf(bytes));
  ASSERT_TRUE(id.isOk()) << id.status().toString();
  wire::RunGraphArgs run;
  run.graph_id = *id;
  wire::TensorSlotArgs inline_x;
  inline_x.desc = descOf(x);
  run.inputs = {{gx, {}, inline_x}};
  const wire::Handle hq = Client::newHandle();
  run.outputs = {{q, wire::OutputAction::KeepResident, hq, {}}};
  ASSERT_TRUE(client->runGraph(run, bytesOf(x)).isOk());
  auto read = client->getTensor(hq);
  ASSERT_FALSE(read.isOk());
  EXPECT_EQ(codeOf(remoteOf(read)), wire::ErrorCode::SchemaMismatch);
  EXPECT_NE(remoteOf(read).message.find("int_repr"), std::string::npos) << remoteOf(read).message;
  at::Tensor w = at::randn({3});
  wire::Handle hw = Client::newHandle();
  ASSERT_TRUE(client->putTensor(hw, descOf(w), wire::Residency::PersistentWeight, bytesOf(w)).isOk());
  auto back = client->getTensor(hw);
  ASSERT_TRUE(back.isOk()) << back.status().toString();
  EXPECT_TRUE(at::equal(tensorOf(*back), w));
}

TEST(NodeIntegration, AsynchronousRunsKeepTheirOutputsAndReportFailuresLater) {
  NodeProcess node;
  auto client = connectOrFail(node.port());
  ASSERT_NE(client, nullptr);
  auto [graph, relu] = registerChain(*client);
  at::manual_seed(1);
  at::Tensor x = at::randn({4, 8}), w = at::randn({8, 16}), b = at::randn({16}), x_bad = at::randn({4, 7});
  wire::Handle hw = Client::newHandle(), hb = Client::newHandle();
  ASSERT_TRUE(client->putTensor(hw, descOf(w), wire::Residency::PersistentWeight, bytesOf(w)).isOk());
  ASSERT_TRUE(client->putTensor(hb, descOf(b), wire::Residency::PersistentWeight, bytesOf(b)).isOk());
  auto runOf = [&, graph = graph, relu = relu](const at::Tensor& input, wire::Handle keep_as) {
    return chainRun(graph, input, hw, hb, {relu, wire::OutputAction::KeepResident, keep_as, wire::Residency::EphemeralActivation});
  };
  const auto before = client->counters();
  wire::Handle good = Client::newHandle(), bad = Client::newHandle(), after = Client::newHandle();
  auto first = client->runGraphAsync(runOf(x, good), bytesOf(x));
  auto failing = client->runGraphAsync(runOf(x_bad, bad), bytesOf(x_bad));  // mm of [4,7] and [8,16]
  auto third = client->runGraphAsync(runOf(x * 2, after), bytesOf(at::Tensor(x * 2)));
  ASSERT_TRUE(first.isOk() && failing.isOk() && third.isOk()) << failing.status().toString();
  EXPECT_EQ(client->counters().round_trips, before.round_trips);  // nothing waited
  EXPECT_EQ(client->counters().async_runs, before.async_runs + 3);

  // A request that waits is answered after the runs sent before it (one session runs in order).
  auto kept = client->getTensor(good);
  ASSERT_TRUE(kept.isOk()) << kept.status().toString();
  EXPECT_TRUE(at::equal(tensorOf(*kept), at::relu(at::mm(x, w) + b)));
  auto failures = client->takeAsyncFailures(/*wait=*/true);
  ASSERT_EQ(failures.size(), 1u);
  EXPECT_EQ(failures[0].request_id, *failing);
  EXPECT_EQ(failures[0].status.code(), StatusCode::kRemote);
  EXPECT_EQ(codeOf(remoteOf(failures[0].status)), wire::ErrorCode::TorchError);
  EXPECT_EQ(remoteOf(failures[0].status).op_name, "aten::mm.default");
  EXPECT_NE(failures[0].status.message().find("aten::mm"), std::string::npos);
  EXPECT_EQ(client->asyncInFlight(), 0u);
  EXPECT_GT(client->counters().node_exec_us, before.node_exec_us);  // the answered runs' RunResult.exec_us
  EXPECT_TRUE(client->takeAsyncFailures(true).empty());  // reported once
  EXPECT_FALSE(client->getTensor(bad).isOk());  // a failed run keeps nothing
  auto third_kept = client->getTensor(after);
  ASSERT_TRUE(third_kept.isOk()) << third_kept.status().toString();
  EXPECT_TRUE(at::equal(tensorOf(*third_kept), at::relu(at::mm(x * 2, w) + b)));

  // Only KeepResident: an output that would come back needs a waiting request.
  wire::RunGraphArgs returning = runOf(x, Client::newHandle());
  returning.outputs[0].action = wire::OutputAction::ReturnAndKeep;
  auto refused = client->runGraphAsync(returning, bytesOf(x));
  ASSERT_FALSE(refused.isOk());
  EXPECT_EQ(refused.status().code(), StatusCode::kInvalidArgument);
}

TEST(NodeIntegration, AsynchronousRunsFailWhenTheNodeDies) {
  auto node = std::make_unique<NodeProcess>();
  auto client = connectOrFail(node->port());
  // (the node is killed below, before the runs are sent)
  ASSERT_NE(client, nullptr);
  auto [graph, relu] = registerChain(*client);
  at::Tensor x = at::randn({4, 8}), w = at::randn({8, 16}), b = at::randn({16});
  wire::Handle hw = Client::newHandle(), hb = Client::newHandle();
  ASSERT_TRUE(client->putTensor(hw, descOf(w), wire::Residency::PersistentWeight, bytesOf(w)).isOk());
  ASSERT_TRUE(client->putTensor(hb, descOf(b), wire::Residency::PersistentWeight, bytesOf(b)).isOk());
  node->process().kill(SIGKILL);
  node->process().wait(5s);
  wire::RunGraphArgs run = chainRun(
      graph, x, hw, hb, {relu, wire::OutputAction::KeepResident, Client::newHandle(), wire::Residency::EphemeralActivation});
  auto start = std::chrono::steady_clock::now();
  size_t sent = 0;
  for (int i = 0; i < 3; ++i) sent += client->runGraphAsync(run, bytesOf(x)).isOk();
  auto failures = client->takeAsyncFailures(/*wait=*/true);
  EXPECT_LT(std::chrono::steady_clock::now() - start, 5s);
  EXPECT_EQ(failures.size(), sent);  // every run that went out failed; none hangs
  for (const auto& failure : failures) EXPECT_EQ(failure.status.code(), StatusCode::kPeerUnreachable);
  EXPECT_EQ(client->asyncInFlight(), 0u);
}

TEST(NodeIntegration, SessionsCannotSeeEachOthersHandles) {
  NodeProcess node;
  auto alice = connectOrFail(node.port());
  auto bob = connectOrFail(node.port());
  ASSERT_TRUE(alice && bob);
  EXPECT_FALSE(alice->sessionId() == bob->sessionId());
  at::Tensor secret = at::randn({8});
  wire::Handle handle = Client::newHandle();
  ASSERT_TRUE(alice->putTensor(handle, descOf(secret), wire::Residency::PersistentWeight, bytesOf(secret)).isOk());
  auto stolen = bob->getTensor(handle);
  ASSERT_FALSE(stolen.isOk());
  EXPECT_EQ(codeOf(remoteOf(stolen)), wire::ErrorCode::UnknownHandle);
  auto own = alice->getTensor(handle);
  ASSERT_TRUE(own.isOk());
  EXPECT_TRUE(at::equal(tensorOf(*own), secret));
}

TEST(NodeIntegration, MemoryLimitRefusesTheRequestNotTheNode) {
  NodeProcess node({"--memory-limit", "1M"});
  auto client = connectOrFail(node.port());
  ASSERT_NE(client, nullptr);
  at::Tensor big = at::zeros({512 * 1024}, at::kFloat);  // 2 MiB
  auto refused = client->putTensor(Client::newHandle(), descOf(big), wire::Residency::PersistentWeight, bytesOf(big));
  ASSERT_FALSE(refused.isOk());
  EXPECT_EQ(codeOf(remoteOf(refused)), wire::ErrorCode::OutOfMemory);
  EXPECT_NE(refused.message().find("2097152 bytes requested"), std::string::npos) << refused.message();
  at::Tensor small = at::ones({1024});
  EXPECT_TRUE(client->putTensor(Client::newHandle(), descOf(small), wire::Residency::PersistentWeight, bytesOf(small)).isOk());
  EXPECT_EQ(residentBytes(*client), 4096u);
}

TEST(NodeIntegration, AKilledClientLeavesNoResidentBytes) {
  NodeProcess node;
  auto observer = connectOrFail(node.port());
  ASSERT_NE(observer, nullptr);
  Process peer("node_client_peer", {std::to_string(node.port()), std::to_string(4 << 20)});
  ASSERT_EQ(peer.readLine(), "ready\n");
  EXPECT_EQ(residentBytes(*observer), uint64_t{4} << 20);
  peer.kill(SIGKILL);
  auto deadline = std::chrono::steady_clock::now() + 5s;
  while (residentBytes(*observer) != 0 && std::chrono::steady_clock::now() < deadline) std::this_thread::sleep_for(50ms);
  EXPECT_EQ(residentBytes(*observer), 0u);
  auto stats = observer->stats();
  ASSERT_TRUE(stats.isOk());
  EXPECT_EQ(stats->sessions, 1u);
}

TEST(NodeIntegration, SigtermWithActiveSessionsExitsCleanly) {
  NodeProcess node;
  auto client = connectOrFail(node.port());
  ASSERT_NE(client, nullptr);
  at::Tensor t = at::randn({1024});
  ASSERT_TRUE(client->putTensor(Client::newHandle(), descOf(t), wire::Residency::StatefulKvCache, bytesOf(t)).isOk());
  node.process().kill(SIGTERM);
  EXPECT_EQ(node.process().wait(10s), 0);
  // The client sees the node gone: an error, not a hang.
  auto start = std::chrono::steady_clock::now();
  EXPECT_FALSE(client->ping().isOk());
  EXPECT_LT(std::chrono::steady_clock::now() - start, 5s);
}

}  // namespace
}  // namespace genie::node
