// Test helpers shared by the tests that drive a real genie-node with the C++ client.
#pragma once

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <memory>
#include <span>
#include <string>

#include "genie/client/client.h"
#include "genie/node/executor.h"

namespace genie::node::testing {

using namespace std::chrono_literals;

inline std::unique_ptr<client::Client> connectOrFail(uint16_t port, const std::string& token = "") {
  client::ClientOptions options;
  options.auth_token = token;
  options.timeout = 30s;
  auto client = client::Client::connect("127.0.0.1", port, options);
  EXPECT_TRUE(client.isOk()) << client.status().toString();
  return client ? std::move(client.value()) : nullptr;
}

/// The node's detail of a failed request (an empty one, and a test failure, if it has none).
inline RemoteDetail remoteOf(const Status& status) {
  EXPECT_FALSE(status.isOk()) << "the request succeeded";
  EXPECT_NE(status.remote(), nullptr) << "no detail from the node: " << status.toString();
  return status.remote() ? *status.remote() : RemoteDetail{};
}
template <typename T>
RemoteDetail remoteOf(const Result<T>& result) {
  return remoteOf(result.status());
}
/// The wire ErrorCode of a node's detail.
inline wire::ErrorCode codeOf(const RemoteDetail& detail) { return static_cast<wire::ErrorCode>(detail.code); }

inline std::span<const std::byte> bytesOf(const at::Tensor& t) {
  return {static_cast<const std::byte*>(t.data_ptr()), static_cast<size_t>(t.nbytes())};
}

inline wire::TensorDescArgs descOf(const at::Tensor& t) {
  wire::TensorDescArgs desc;
  desc.dtype = Executor::wireDType(t.scalar_type());
  desc.shape = t.sizes().vec();
  return desc;
}

inline at::Tensor tensorOf(const client::ReturnedTensor& r) {
  auto dtype = *Executor::scalarType(r.dtype);
  at::Tensor t = at::empty(r.shape, at::TensorOptions().dtype(dtype));
  std::memcpy(t.data_ptr(), r.bytes.data(), r.bytes.size());
  return t;
}

inline uint64_t residentBytes(client::Client& client) {
  auto stats = client.stats();
  EXPECT_TRUE(stats.isOk()) << stats.status().toString();
  uint64_t total = 0;
  if (stats) for (auto [residency, bytes] : stats->resident) total += bytes;
  return total;
}

}  // namespace genie::node::testing
