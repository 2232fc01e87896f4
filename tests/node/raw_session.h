// Test helper: a genie-node session spoken in raw wire messages over the transport, for the
// parts of a reply the C++ client does not hand out (RunResult.described, the payload size).
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <thread>

#include "genie/transport/endpoint.h"
#include "genie/transport/message.h"
#include "genie/transport/worker.h"
#include "genie/wire/codec.h"

namespace genie::node::testing {

/// One reply: its verified header and the payload that came beside it.
struct RawReply {
  std::vector<std::byte> header;  // 16-byte aligned by the allocator: verifiable in place
  std::vector<std::byte> payload;
  const wire::Message* message() const { return flatbuffers::GetRoot<wire::Message>(header.data()); }
};

class RawSession {
 public:
  /// Connects to 127.0.0.1:port and, with `say_hello`, says Hello; check ok() afterwards.
  explicit RawSession(uint16_t port, bool say_hello = true) {
    transport::WorkerConfig config;
    config.name = "raw-session";
    auto worker = transport::Worker::create(config);
    if (!worker) {
      ADD_FAILURE() << worker.status().toString();
      return;
    }
    worker_ = *worker;
    worker_->setMessageHandler([this](transport::InboundMessage m) { onMessage(std::move(m)); });
    EXPECT_TRUE(worker_->startProgressThread().isOk());
    auto endpoint = worker_->connect("127.0.0.1", port);
    if (!endpoint) {
      ADD_FAILURE() << endpoint.status().toString();
      return;
    }
    endpoint_ = *endpoint;
    if (!say_hello) {
      ok_ = true;
      return;
    }
    auto welcome = call(wire::buildHello(1, "raw-session", "", getpid()));
    ok_ = !welcome.header.empty() && welcome.message()->body_type() == wire::Body::Welcome;
  }
  ~RawSession() {
    if (connected()) call(wire::buildGoodbye(0, "test done"), {}, /*expect_reply=*/false);
    endpoint_.reset();
    if (worker_) worker_->shutdown();
  }
  bool ok() const { return ok_; }
  /// True while the connection to the node is up.
  bool connected() const { return endpoint_ && endpoint_->isConnected(); }
  /// Waits until the node closed the connection (true) or `timeout` passed (false).
  bool waitUntilDisconnected(std::chrono::milliseconds timeout) {
    auto deadline = std::chrono::steady_clock::now() + timeout;
    while (connected() && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return !connected();
  }

  /// Sends one request and waits (10 s) for the next message the node sends back. With
  /// `expect_reply` false it returns once the send completed, successfully or not.
  RawReply call(const flatbuffers::DetachedBuffer& header, std::span<const std::byte> payload = {},
                bool expect_reply = true) {
    std::promise<Status> sent;
    endpoint_->send(wire::bytesOf(header), {payload.data(), payload.size()},
                    [&sent](Status s) { sent.set_value(std::move(s)); });
    Status send_status = sent.get_future().get();
    // A request the node refuses by closing the connection may fail to send (reset by peer).
    if (!expect_reply) return {};
    EXPECT_TRUE(send_status.isOk()) << send_status.message();
    std::unique_lock<std::mutex> lock(mutex_);
    if (!cv_.wait_for(lock, std::chrono::seconds(10), [&] { return !replies_.empty(); })) {
      ADD_FAILURE() << "no reply in 10 s";
      return {};
    }
    RawReply reply = std::move(replies_.front());
    replies_.pop_front();
    return reply;
  }

 private:
  void onMessage(transport::InboundMessage message) {  // progress thread
    auto verified = wire::verifyMessage(message.header(), message.payloadSize());
    EXPECT_TRUE(verified.isOk()) << verified.status().toString();
    if (!verified) return;
    auto reply = std::make_shared<RawReply>();
    reply->header.assign(message.header().begin(), message.header().end());
    auto deliver = [this, reply](Status s) {
      EXPECT_TRUE(s.isOk()) << s.toString();
      std::lock_guard<std::mutex> lock(mutex_);
      replies_.push_back(std::move(*reply));
      cv_.notify_all();
    };
    if (message.payloadSize() == 0) return deliver(Status::ok());
    reply->payload.resize(message.payloadSize());
    message.receivePayload({reply->payload.data(), reply->payload.size()}, deliver);
  }

  std::shared_ptr<transport::Worker> worker_;
  std::shared_ptr<transport::Endpoint> endpoint_;
  bool ok_ = false;
  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<RawReply> replies_;
};

}  // namespace genie::node::testing
