// transport_peer: the other process of the transport tests (a real peer to kill or stop).
//
//   transport_peer --connect HOST:PORT --tls TLS --mode send-large --bytes N
//       connects, sends one message "large" with an N-byte payload, then waits to be killed.
//   transport_peer --connect HOST:PORT --tls TLS --mode hold
//       connects, sends "hello", keeps every message it gets without receiving its payload.
#include <unistd.h>

#include <cstdio>
#include <deque>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>

#include "genie/transport/endpoint.h"
#include "genie/transport/message.h"
#include "genie/transport/worker.h"

using namespace genie::transport;

int main(int argc, char** argv) {
  CLI::App app{"Genie transport test peer"};
  std::string connect, tls, mode;
  size_t bytes = 0;
  app.add_option("--connect", connect, "HOST:PORT")->required();
  app.add_option("--tls", tls, "UCX_TLS");
  app.add_option("--mode", mode, "send-large | hold")->required();
  app.add_option("--bytes", bytes, "payload bytes for send-large");
  CLI11_PARSE(app, argc, argv);

  WorkerConfig config;
  config.tls = tls;
  config.name = "transport-peer";
  auto worker = Worker::create(config);
  if (!worker) {
    std::fprintf(stderr, "transport_peer: %s\n", worker.status().toString().c_str());
    return 2;
  }
  std::deque<InboundMessage> held;  // progress thread only
  (*worker)->setMessageHandler([&](InboundMessage message) { held.push_back(std::move(message)); });
  if (!(*worker)->startProgressThread()) return 2;
  auto colon = connect.rfind(':');
  auto endpoint = (*worker)->connect(connect.substr(0, colon), std::stoi(connect.substr(colon + 1)));
  if (!endpoint) {
    std::fprintf(stderr, "transport_peer: %s\n", endpoint.status().toString().c_str());
    return 3;
  }
  std::vector<std::byte> payload(bytes);
  for (size_t i = 0; i < payload.size(); i += 4096) payload[i] = std::byte(i / 4096);
  std::string header = mode == "send-large" ? "large" : "hello";
  (*endpoint)->send({reinterpret_cast<const std::byte*>(header.data()), header.size()},
                    {payload.data(), payload.size()}, [](genie::Status) {});
  for (;;) pause();  // until killed
}
