// node_client_peer: a genie-node client in its own process, to be killed by a test.
//   node_client_peer PORT BYTES   connects, stores BYTES bytes resident, prints "ready", waits
#include <unistd.h>

#include <cstdio>
#include <string>
#include <vector>

#include "genie/client/client.h"
#include "genie/log.h"

int main(int argc, char** argv) {
  if (argc != 3) return 2;
  genie::logToStderr("node_client_peer");  // stdout carries "ready" to the test
  uint16_t port = static_cast<uint16_t>(std::stoi(argv[1]));
  size_t bytes = std::stoull(argv[2]);
  genie::client::ClientOptions options;
  options.name = "node_client_peer";
  auto client = genie::client::Client::connect("127.0.0.1", port, options);
  if (!client) {
    std::fprintf(stderr, "%s\n", client.status().toString().c_str());
    return 1;
  }
  std::vector<std::byte> data(bytes, std::byte{1});
  genie::wire::TensorDescArgs desc;
  desc.dtype = genie::wire::DType::UInt8;
  desc.shape = {static_cast<int64_t>(bytes)};
  auto put = (*client)->putTensor(genie::client::Client::newHandle(), desc, genie::wire::Residency::StatefulKvCache, data);
  if (!put) {
    std::fprintf(stderr, "%s\n", put.toString().c_str());
    return 1;
  }
  std::printf("ready\n");
  std::fflush(stdout);
  for (;;) pause();
}
