// genie_consumer HOST PORT: connects to a genie-node with Genie's installed C++ client, puts a
// tensor, reads it back and checks the bytes; prints the node's device and "ok". Exit 1 with
// the failing step's error otherwise.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "genie/client/client.h"

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s HOST PORT\n", argv[0]);
    return 2;
  }
  using namespace genie;
  auto client = client::Client::connect(argv[1], static_cast<uint16_t>(std::atoi(argv[2])), client::ClientOptions{});
  if (!client) {
    std::fprintf(stderr, "connect: %s\n", client.status().toString().c_str());
    return 1;
  }
  const std::vector<float> values = {1.5f, -2.0f, 3.25f, 4.0f};
  wire::TensorDescArgs desc;
  desc.dtype = wire::DType::Float32;
  desc.shape = {4};
  const wire::Handle handle = client::Client::newHandle();
  const auto* bytes = reinterpret_cast<const std::byte*>(values.data());
  if (Status put = (*client)->putTensor(handle, desc, wire::Residency::EphemeralActivation,
                                        {bytes, values.size() * sizeof(float)});
      !put.isOk()) {
    std::fprintf(stderr, "put: %s\n", put.toString().c_str());
    return 1;
  }
  auto got = (*client)->getTensor(handle);
  if (!got) {
    std::fprintf(stderr, "get: %s\n", got.status().toString().c_str());
    return 1;
  }
  if (got->bytes.size() != values.size() * sizeof(float) || std::memcmp(got->bytes.data(), bytes, got->bytes.size()) != 0) {
    std::fprintf(stderr, "get: the bytes differ\n");
    return 1;
  }
  std::printf("device %s: ok\n", (*client)->welcome().device.c_str());
  return 0;
}
