// Test helper: a real genie-node (or helper) process, started with posix_spawn; its port is
// read from the "listening on HOST:PORT" line it prints.
#pragma once

#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

namespace genie::node::testing {

inline std::string binDir() {
  char self[4096] = {};
  ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
  std::string path(self, n > 0 ? n : 0);
  return path.substr(0, path.rfind('/'));
}

class Process {
 public:
  /// Runs bin/<program> <args>; stdout is readable line by line.
  Process(const std::string& program, std::vector<std::string> args) {
    std::string path = binDir() + "/" + program;
    int fds[2];
    EXPECT_EQ(pipe(fds), 0);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, fds[1], STDOUT_FILENO);
    posix_spawn_file_actions_addclose(&actions, fds[0]);
    std::vector<char*> argv{path.data()};
    for (auto& arg : args) argv.push_back(arg.data());
    argv.push_back(nullptr);
    EXPECT_EQ(posix_spawn(&pid_, path.c_str(), &actions, nullptr, argv.data(), environ), 0) << path;
    posix_spawn_file_actions_destroy(&actions);
    close(fds[1]);
    out_ = fdopen(fds[0], "r");
  }
  ~Process() {
    kill(SIGKILL);
    if (out_) fclose(out_);
  }
  /// The next line of its stdout ("" at end of file).
  std::string readLine() {
    char line[1024];
    if (!out_ || !fgets(line, sizeof(line), out_)) return "";
    return line;
  }
  void kill(int signal) {
    if (pid_ > 0) ::kill(pid_, signal);
  }
  /// Waits for it to exit; returns its exit status, or -1 if still running after `timeout`.
  int wait(std::chrono::milliseconds timeout) {
    auto deadline = std::chrono::steady_clock::now() + timeout;
    while (pid_ > 0 && std::chrono::steady_clock::now() < deadline) {
      int status = 0;
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return -1;
  }

 private:
  pid_t pid_ = -1;
  FILE* out_ = nullptr;
};

/// A genie-node on loopback with `extra` flags; port() is where it listens.
class NodeProcess {
 public:
  explicit NodeProcess(std::vector<std::string> extra = {}) {
    std::vector<std::string> args{"--listen", "127.0.0.1:0", "--log-level", "warn"};
    args.insert(args.end(), extra.begin(), extra.end());
    process_ = std::make_unique<Process>("genie-node", args);
    std::string line = process_->readLine();
    auto colon = line.find("127.0.0.1:");
    EXPECT_NE(colon, std::string::npos) << "genie-node said: " << line;
    if (colon != std::string::npos) port_ = static_cast<uint16_t>(std::stoi(line.substr(colon + 10)));
  }
  uint16_t port() const { return port_; }
  Process& process() { return *process_; }

 private:
  std::unique_ptr<Process> process_;
  uint16_t port_ = 0;
};

}  // namespace genie::node::testing
