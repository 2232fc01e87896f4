// Helpers for the transport conformance suite: a worker with an inbox, and a peer process.
#pragma once

#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "genie/transport/endpoint.h"
#include "genie/transport/message.h"
#include "genie/transport/worker.h"

namespace genie::transport::testing {

using namespace std::chrono_literals;

/// A value set once from the progress thread and awaited from the test thread.
template <typename T>
class Awaitable {
 public:
  void set(T value) {
    std::lock_guard<std::mutex> lock(mutex_);
    value_ = std::move(value);
    cv_.notify_all();
  }
  std::optional<T> wait(std::chrono::milliseconds timeout) {
    std::unique_lock<std::mutex> lock(mutex_);
    cv_.wait_for(lock, timeout, [&] { return value_.has_value(); });
    return value_;
  }

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  std::optional<T> value_;
};

/// A worker with a progress thread whose received messages queue up in an inbox.
class Node {
 public:
  explicit Node(const std::string& tls, const std::string& name) {
    WorkerConfig config;
    config.tls = tls;
    config.name = name;
    config.net_devices = "lo";  // tests talk over loopback only
    auto created = Worker::create(config);
    EXPECT_TRUE(created.isOk()) << created.status().toString();
    worker = created.value();
    worker->setMessageHandler([this](InboundMessage message) {
      std::lock_guard<std::mutex> lock(mutex_);
      inbox_.push_back(std::move(message));
      cv_.notify_all();
    });
    worker->setEndpointErrorHandler([this](std::shared_ptr<Endpoint>, Status status) {
      std::lock_guard<std::mutex> lock(mutex_);
      errors_.push_back(status);
      error_times_.push_back(std::chrono::steady_clock::now());
      cv_.notify_all();
    });
    EXPECT_TRUE(worker->startProgressThread().isOk());
  }
  ~Node() {
    listener.reset();
    accepted.clear();
    {
      std::lock_guard<std::mutex> lock(mutex_);
      inbox_.clear();
    }
    worker->shutdown();
  }

  /// Listens on loopback, any port; accepted endpoints are kept in `accepted`.
  uint16_t listen() {
    auto listening = worker->listen("127.0.0.1", 0, [this](std::shared_ptr<Endpoint> endpoint) {
      std::lock_guard<std::mutex> lock(mutex_);
      accepted.push_back(std::move(endpoint));
      cv_.notify_all();
    });
    EXPECT_TRUE(listening.isOk()) << listening.status().toString();
    listener = std::move(listening.value());
    return listener->port();
  }

  std::optional<InboundMessage> nextMessage(std::chrono::milliseconds timeout = 10s) {
    std::unique_lock<std::mutex> lock(mutex_);
    if (!cv_.wait_for(lock, timeout, [&] { return !inbox_.empty(); })) return std::nullopt;
    InboundMessage message = std::move(inbox_.front());
    inbox_.pop_front();
    return message;
  }

  std::optional<Status> nextError(std::chrono::milliseconds timeout) {
    std::unique_lock<std::mutex> lock(mutex_);
    if (!cv_.wait_for(lock, timeout, [&] { return !errors_.empty(); })) return std::nullopt;
    return errors_.front();
  }

  std::shared_ptr<Endpoint> waitAccepted(std::chrono::milliseconds timeout = 10s) {
    std::unique_lock<std::mutex> lock(mutex_);
    if (!cv_.wait_for(lock, timeout, [&] { return !accepted.empty(); })) return nullptr;
    return accepted.back();
  }

  std::shared_ptr<Worker> worker;
  std::unique_ptr<Listener> listener;
  std::vector<std::shared_ptr<Endpoint>> accepted;

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<InboundMessage> inbox_;
  std::vector<Status> errors_;
  std::vector<std::chrono::steady_clock::time_point> error_times_;
};

/// Sends and waits for local completion.
inline Status sendAndWait(Endpoint& endpoint, std::span<const std::byte> header, ConstBuffer payload,
                          std::chrono::milliseconds timeout = 30s) {
  auto done = std::make_shared<Awaitable<Status>>();
  endpoint.send(header, payload, [done](Status s) { done->set(s); });
  auto status = done->wait(timeout);
  if (!status) return GENIE_ERROR(kTimeout, "send did not complete in {} ms", timeout.count());
  return *status;
}

inline Status receiveAndWait(InboundMessage& message, Buffer dst, std::chrono::milliseconds timeout = 30s) {
  auto done = std::make_shared<Awaitable<Status>>();
  message.receivePayload(dst, [done](Status s) { done->set(s); });
  auto status = done->wait(timeout);
  if (!status) return GENIE_ERROR(kTimeout, "receive did not complete in {} ms", timeout.count());
  return *status;
}

inline std::span<const std::byte> bytesOf(const std::string& text) {
  return {reinterpret_cast<const std::byte*>(text.data()), text.size()};
}

inline std::string textOf(std::span<const std::byte> bytes) {
  return {reinterpret_cast<const char*>(bytes.data()), bytes.size()};
}

/// A child process running build/bin/transport_peer with `args`; SIGKILLed on destruction.
class PeerProcess {
 public:
  explicit PeerProcess(std::vector<std::string> args) {
    std::string path = peerPath();
    std::vector<char*> argv;
    argv.push_back(path.data());
    for (auto& arg : args) argv.push_back(arg.data());
    argv.push_back(nullptr);
    int rc = posix_spawn(&pid_, path.c_str(), nullptr, nullptr, argv.data(), environ);
    EXPECT_EQ(rc, 0) << "posix_spawn " << path;
  }
  ~PeerProcess() { kill(SIGKILL); }
  void kill(int signal) {
    if (pid_ <= 0) return;
    ::kill(pid_, signal);
    if (signal == SIGKILL) {
      waitpid(pid_, nullptr, 0);
      pid_ = -1;
    }
  }
  static std::string peerPath() {
    char self[4096] = {};
    ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
    std::string dir = std::string(self, n > 0 ? n : 0);
    return dir.substr(0, dir.rfind('/')) + "/transport_peer";
  }

 private:
  pid_t pid_ = -1;
};

}  // namespace genie::transport::testing
