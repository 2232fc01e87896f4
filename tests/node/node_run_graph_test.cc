// RunGraph's protocol additions, against a real genie-node process: bound graph inputs
// (GraphInput.handle), frees riding on a run (RunGraph.free), KeepAndDescribe outputs
// (RunResult.described), and the per-storage accounting of views kept and freed.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "genie/client/client.h"
#include "genie/node/executor.h"
#include "graph_builder.h"
#include "node_process.h"
#include "node_test_util.h"
#include "raw_session.h"

namespace genie::node {
namespace {

using namespace testing;
using client::Client;
using wire::DType;
using wire::OutputAction;
using wire::Residency;

wire::GraphId registerOrFail(Client& client, GraphBuilder& graph) {
  auto bytes = graph.finish();
  auto id = client.registerGraph(wire::bytesOf(bytes));
  EXPECT_TRUE(id.isOk()) << id.status().toString();
  return id.isOk() ? *id : wire::GraphId();
}

wire::Handle putOrFail(Client& client, const at::Tensor& t, Residency residency = Residency::PersistentWeight) {
  wire::Handle handle = Client::newHandle();
  Status put = client.putTensor(handle, descOf(t), residency, bytesOf(t));
  EXPECT_TRUE(put.isOk()) << put.toString();
  return handle;
}

wire::InputBindingArgs inlineInput(uint32_t input, const at::Tensor& t) {
  wire::TensorSlotArgs slot;
  slot.desc = descOf(t);
  return {input, {}, slot};
}

bool isResident(Client& client, const wire::Handle& handle) { return client.getTensor(handle).isOk(); }

TEST(NodeRunGraph, BoundInputsComeFromTheRunningSessionUnlessBoundExplicitly) {
  NodeProcess node;
  auto client = connectOrFail(node.port());
  ASSERT_NE(client, nullptr);
  at::manual_seed(0);
  at::Tensor x = at::randn({2, 3}), w = at::randn({3, 4}), b = at::randn({4}), w2 = at::randn({3, 4});
  wire::Handle hw = putOrFail(*client, w), hb = putOrFail(*client, b), hw2 = putOrFail(*client, w2);
  GraphBuilder g;
  uint32_t gx = g.input(DType::Float32, {2, 3});
  uint32_t gw = g.input(DType::Float32, {3, 4}, hw);
  uint32_t gb = g.input(DType::Float32, {4}, hb);
  uint32_t out = g.op("aten::add", "Tensor", {T(g.op("aten::mm", "", {T(gx), T(gw)})), T(gb)});
  wire::GraphId graph = registerOrFail(*client, g);

  // Only the changing input travels; the weights are the session's resident tensors.
  wire::RunGraphArgs run;
  run.graph_id = graph;
  run.inputs = {inlineInput(gx, x)};
  run.outputs = {{out, OutputAction::Return, {}, {}}};
  auto result = client->runGraph(run, bytesOf(x));
  ASSERT_TRUE(result.isOk()) << result.status().toString();
  ASSERT_EQ(result->size(), 1u);
  EXPECT_TRUE(at::equal(tensorOf((*result)[0]), at::mm(x, w) + b));

  // An explicit binding wins over the graph's handle.
  run.inputs.push_back({gw, hw2, std::nullopt});
  result = client->runGraph(run, bytesOf(x));
  ASSERT_TRUE(result.isOk()) << result.status().toString();
  EXPECT_TRUE(at::equal(tensorOf((*result)[0]), at::mm(x, w2) + b));

  // Graphs are node-wide, handles per session: another session runs the same graph id and is
  // told which input's handle it does not hold.
  auto other = connectOrFail(node.port());
  ASSERT_NE(other, nullptr);
  run.inputs = {inlineInput(gx, x)};
  result = other->runGraph(run, bytesOf(x));
  ASSERT_FALSE(result.isOk());
  EXPECT_EQ(codeOf(remoteOf(result)), wire::ErrorCode::UnknownHandle);
  const std::string& message = result.status().message();
  EXPECT_NE(message.find("input 1"), std::string::npos) << message;
  EXPECT_NE(message.find(wire::toString(hw)), std::string::npos) << message;
  // It can still run it by binding its own tensors.
  wire::Handle own_w = putOrFail(*other, w), own_b = putOrFail(*other, b);
  run.inputs = {inlineInput(gx, x), {gw, own_w, std::nullopt}, {gb, own_b, std::nullopt}};
  result = other->runGraph(run, bytesOf(x));
  ASSERT_TRUE(result.isOk()) << result.status().toString();
  EXPECT_TRUE(at::equal(tensorOf((*result)[0]), at::mm(x, w) + b));

  // A freed bound handle is unknown to the next run.
  ASSERT_TRUE(client->freeTensors(std::vector<wire::Handle>{hb}).isOk());
  run.inputs = {inlineInput(gx, x)};
  RemoteDetail unbound = remoteOf(client->runGraph(run, bytesOf(x)));
  EXPECT_EQ(codeOf(unbound), wire::ErrorCode::UnknownHandle);
  EXPECT_NE(unbound.message.find("input 2"), std::string::npos) << unbound.message;
}

TEST(NodeRunGraph, FreesRideOnARunAndComeBeforeTheInputsAreBound) {
  NodeProcess node;
  auto client = connectOrFail(node.port());
  ASSERT_NE(client, nullptr);
  at::Tensor a = at::randn({4, 4}), b = at::randn({4, 4}), c = at::randn({4, 4});
  wire::Handle ha = putOrFail(*client, a), hb = putOrFail(*client, b), hc = putOrFail(*client, c);
  EXPECT_EQ(residentBytes(*client), 3 * 64u);
  GraphBuilder g;
  uint32_t gx = g.input(DType::Float32, {4, 4});
  uint32_t relu = g.op("aten::relu", "", {T(gx)});
  wire::GraphId graph = registerOrFail(*client, g);

  // Unknown handles in `free` are ignored, like FreeTensors.
  wire::RunGraphArgs run;
  run.graph_id = graph;
  run.inputs = {{gx, hb, std::nullopt}};
  run.outputs = {{relu, OutputAction::Return, {}, {}}};
  run.free = {ha, Client::newHandle(), ha};
  auto result = client->runGraph(run);
  ASSERT_TRUE(result.isOk()) << result.status().toString();
  EXPECT_TRUE(at::equal(tensorOf((*result)[0]), at::relu(b)));
  EXPECT_FALSE(isResident(*client, ha));
  EXPECT_EQ(residentBytes(*client), 2 * 64u);

  // Freed before binding: freeing the input of the same run makes it unknown.
  run.free = {hb};
  EXPECT_EQ(codeOf(remoteOf(client->runGraph(run))), wire::ErrorCode::UnknownHandle);
  EXPECT_FALSE(isResident(*client, hb));
  EXPECT_EQ(residentBytes(*client), 64u);

  // The frees are applied even when the run then fails (here: an unknown graph).
  run.graph_id = wire::GraphId(1, 2);
  run.inputs = {};
  run.free = {hc};
  EXPECT_EQ(codeOf(remoteOf(client->runGraph(run))), wire::ErrorCode::UnknownGraph);
  EXPECT_EQ(residentBytes(*client), 0u);
}

/// The strides of a described slot, as torch would have them.
std::vector<int64_t> stridesOf(const wire::TensorDesc& desc) {
  return desc.strides() ? std::vector<int64_t>(desc.strides()->begin(), desc.strides()->end()) : std::vector<int64_t>{};
}
std::vector<int64_t> shapeOf(const wire::TensorDesc& desc) {
  return std::vector<int64_t>(desc.shape()->begin(), desc.shape()->end());
}

TEST(NodeRunGraph, KeepAndDescribeKeepsTheValueAndReportsItsDescriptorWithoutBytes) {
  NodeProcess node;
  RawSession session(node.port());
  ASSERT_TRUE(session.ok());
  at::Tensor x = at::tensor({0.f, 1.f, 2.f, 0.f, 3.f, 0.f, 0.f, 4.f}).reshape({4, 2});
  const at::Tensor nonzero = at::nonzero(x);  // data-dependent shape [4, 2], int64
  const wire::Handle hx(1, 1), hn(1, 2), ht(1, 3);
  {
    wire::TensorSlotArgs slot{hx, descOf(x)};
    auto put = wire::buildPutTensors(2, std::span(&slot, 1));
    ASSERT_TRUE(put.isOk());
    RawReply ack = session.call(*put, bytesOf(x));
    ASSERT_EQ(ack.message()->body_type(), wire::Body::Ack);
  }
  GraphBuilder g;
  uint32_t gx = g.input(DType::Float32, {4, 2}, hx);
  uint32_t nz = g.op("aten::nonzero", "", {T(gx)});
  uint32_t tr = g.op("aten::transpose", "int", {T(nz), I(0), I(1)});
  uint32_t relu = g.op("aten::relu", "", {T(gx)});
  auto graph_bytes = g.finish();
  RawReply registered = session.call(wire::buildRegisterGraph(3, wire::bytesOf(graph_bytes)));
  ASSERT_EQ(registered.message()->body_type(), wire::Body::GraphRegistered);

  wire::RunGraphArgs run;
  run.graph_id = *registered.message()->body_as_GraphRegistered()->graph_id();
  run.outputs = {{nz, OutputAction::KeepAndDescribe, hn, Residency::EphemeralActivation},
                 {relu, OutputAction::Return, {}, {}},
                 {tr, OutputAction::KeepAndDescribe, ht, Residency::EphemeralActivation}};
  auto request = wire::buildRunGraph(4, run);
  ASSERT_TRUE(request.isOk());
  RawReply reply = session.call(*request);
  ASSERT_EQ(reply.message()->body_type(), wire::Body::RunResult)
      << wire::stringOf(reply.message()->body_as_Error() ? reply.message()->body_as_Error()->message() : nullptr);
  const wire::RunResult* result = reply.message()->body_as_RunResult();
  // Only the returned output's bytes are in the payload.
  ASSERT_EQ(result->outputs()->size(), 1u);
  EXPECT_EQ(reply.payload.size(), uint64_t(x.nbytes()));
  ASSERT_NE(result->described(), nullptr);
  ASSERT_EQ(result->described()->size(), 2u);
  const wire::TensorSlot* d0 = result->described()->Get(0);
  ASSERT_NE(d0->handle(), nullptr);
  EXPECT_TRUE(*d0->handle() == hn);
  EXPECT_EQ(d0->payload_offset(), 0u);
  EXPECT_EQ(d0->desc()->dtype(), DType::Int64);
  EXPECT_EQ(shapeOf(*d0->desc()), (std::vector<int64_t>{4, 2}));
  EXPECT_EQ(stridesOf(*d0->desc()), nonzero.strides().vec());  // as it lives: CPU nonzero is column-major
  EXPECT_EQ(d0->desc()->storage_offset(), 0);
  EXPECT_EQ(d0->desc()->nbytes(), uint64_t(nonzero.nbytes()));
  const wire::TensorSlot* d1 = result->described()->Get(1);  // a view of the same storage
  EXPECT_TRUE(*d1->handle() == ht);
  EXPECT_EQ(shapeOf(*d1->desc()), (std::vector<int64_t>{2, 4}));
  EXPECT_EQ(stridesOf(*d1->desc()), nonzero.t().strides().vec());
  EXPECT_EQ(d1->desc()->nbytes(), uint64_t(nonzero.nbytes()));

  // The described values are resident: their bytes come back on request.
  const wire::Handle both[] = {hn, ht};
  RawReply data = session.call(wire::buildGetTensors(5, both));
  ASSERT_EQ(data.message()->body_type(), wire::Body::TensorData);
  const auto* tensors = data.message()->body_as_TensorData()->tensors();
  ASSERT_EQ(tensors->size(), 2u);
  at::Tensor got_n = at::empty({4, 2}, at::kLong), got_t = at::empty({2, 4}, at::kLong);
  std::memcpy(got_n.data_ptr(), data.payload.data() + tensors->Get(0)->payload_offset(), got_n.nbytes());
  std::memcpy(got_t.data_ptr(), data.payload.data() + tensors->Get(1)->payload_offset(), got_t.nbytes());
  EXPECT_TRUE(at::equal(got_n, nonzero));
  EXPECT_TRUE(at::equal(got_t, nonzero.t()));

  // Accounting: x, and the nonzero storage once for its two handles.
  RawReply stats = session.call(wire::buildStatsRequest(6));
  uint64_t resident = 0;
  for (const auto* r : *stats.message()->body_as_Stats()->resident()) resident += r->bytes();
  EXPECT_EQ(resident, uint64_t(x.nbytes() + nonzero.nbytes()));
}

TEST(NodeRunGraph, ViewsOfOneStorageAreCountedOnceUntilTheLastIsFreed) {
  NodeProcess node;
  auto client = connectOrFail(node.port());
  ASSERT_NE(client, nullptr);
  at::Tensor x = at::randn({4, 4});
  wire::Handle hx = putOrFail(*client, x);
  GraphBuilder g;
  uint32_t gx = g.input(DType::Float32, {4, 4}, hx);
  uint32_t transposed = g.op("aten::transpose", "int", {T(gx), I(0), I(1)});
  uint32_t row = g.op("aten::select", "int", {T(gx), I(0), I(2)});
  uint32_t fresh = g.op("aten::relu", "", {T(gx)});
  wire::GraphId graph = registerOrFail(*client, g);
  wire::Handle ht = Client::newHandle(), hr = Client::newHandle(), hf = Client::newHandle();
  wire::RunGraphArgs run;
  run.graph_id = graph;
  run.outputs = {{transposed, OutputAction::KeepResident, ht, Residency::PersistentWeight},
                 {row, OutputAction::KeepAndDescribe, hr, Residency::PersistentWeight}};
  {
    auto kept = client->runGraph(run);
    ASSERT_TRUE(kept.isOk()) << kept.status().message();
  }
  EXPECT_EQ(residentBytes(*client), 64u);  // three handles, one storage

  // Freeing the tensor the views came from keeps the storage (and its bytes) alive.
  run.outputs = {{fresh, OutputAction::KeepResident, hf, Residency::EphemeralActivation}};
  run.inputs = {{gx, ht, std::nullopt}};  // the graph's bound hx is about to go
  run.free = {hx};
  {
    auto kept = client->runGraph(run);
    ASSERT_TRUE(kept.isOk()) << kept.status().message();
  }
  EXPECT_FALSE(isResident(*client, hx));
  EXPECT_EQ(residentBytes(*client), 128u);  // the shared storage + relu's own
  auto row_back = client->getTensor(hr);
  ASSERT_TRUE(row_back.isOk());
  EXPECT_TRUE(at::equal(tensorOf(*row_back), x.select(0, 2)));
  ASSERT_TRUE(client->freeTensors(std::vector<wire::Handle>{ht}).isOk());
  EXPECT_EQ(residentBytes(*client), 128u);
  ASSERT_TRUE(client->freeTensors(std::vector<wire::Handle>{hr}).isOk());
  EXPECT_EQ(residentBytes(*client), 64u);
  ASSERT_TRUE(client->freeTensors(std::vector<wire::Handle>{hf}).isOk());
  EXPECT_EQ(residentBytes(*client), 0u);
}

TEST(NodeRunGraph, KeptOutputsAreAllOrNothing) {
  NodeProcess node;
  auto client = connectOrFail(node.port());
  ASSERT_NE(client, nullptr);
  at::Tensor x = at::randn({4, 4});
  wire::Handle hx = putOrFail(*client, x);
  GraphBuilder g;
  uint32_t gx = g.input(DType::Float32, {4, 4}, hx);
  uint32_t relu = g.op("aten::relu", "", {T(gx)});
  uint32_t neg = g.op("aten::neg", "", {T(gx)});
  wire::GraphId graph = registerOrFail(*client, g);
  wire::Handle first = Client::newHandle();
  wire::RunGraphArgs run;
  run.graph_id = graph;
  // The second output reuses a handle in use: the run fails and the first is not kept either.
  run.outputs = {{relu, OutputAction::KeepAndDescribe, first, Residency::EphemeralActivation},
                 {neg, OutputAction::KeepResident, hx, Residency::EphemeralActivation}};
  RemoteDetail duplicate = remoteOf(client->runGraph(run));
  EXPECT_EQ(codeOf(duplicate), wire::ErrorCode::DuplicateHandle);
  EXPECT_NE(duplicate.message.find("RunGraph.outputs[1]"), std::string::npos) << duplicate.message;
  EXPECT_FALSE(isResident(*client, first));
  EXPECT_EQ(residentBytes(*client), 64u);
}

}  // namespace
}  // namespace genie::node
