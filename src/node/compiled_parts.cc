// CompiledParts (compiled_parts.h): genie::call_graph's parts, their packages, the compile thread.
//
// Over 600 lines: the call side (partFor, call, runWithGraph: session threads) and the compile
// thread (compileLoop, build: worker process, disk cache, eviction) share the Part table and each
// Part's state under mutex_: a call queues a part, the compile thread makes it ready or failed.
#include "compiled_parts.h"

#include <ATen/ATen.h>
#include <ATen/Context.h>
#include <ATen/Version.h>
#include <c10/util/Exception.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <fcntl.h>
#include <torch/csrc/inductor/aoti_package/model_package_loader.h>
#include <torch/library.h>

#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "compiled_cuda.h"
#include "genie/log.h"
#include "genie/wire/torch_dtype.h"

extern char** environ;

namespace genie::node {

namespace fs = std::filesystem;

namespace {

std::atomic<CompiledParts*> g_current{nullptr};

/// Bumped when the worker's output changes meaning (part of every key).
constexpr int kWorkerFormat = 1;
/// Bounds on what clients can make the node keep: parts (graph and input geometries) tracked,
/// and builds waiting for the compile thread. Past them a part runs by the executor, untracked.
constexpr size_t kMaxParts = 4096;
constexpr size_t kMaxQueuedBuilds = 64;
/// CUDA graphs (mode "reduce-overhead"): package runs before the first capture (the first
/// loads the kernels and cuBLAS's handles; the two tell which inputs change address); a
/// capture replayed fewer times than kMinReplaysPerCapture before a fixed input moved is short,
/// and after kMaxShortCaptures short ones the part runs without a graph.
constexpr int kGraphWarmups = 2;
constexpr uint64_t kMinReplaysPerCapture = 8;
constexpr int kMaxShortCaptures = 8;

std::string hexOf(std::string_view bytes) {
  const auto id = wire::hashGraph({reinterpret_cast<const std::byte*>(bytes.data()), bytes.size()});
  return wire::toString(id);
}

std::optional<wire::GraphId> parseGraphId(const std::string& hex) {
  if (hex.size() != 32 || hex.find_first_not_of("0123456789abcdef") != std::string::npos) return std::nullopt;
  return wire::GraphId(std::stoull(hex.substr(0, 16), nullptr, 16), std::stoull(hex.substr(16), nullptr, 16));
}

/// torch's Python name of a dtype ("float32"), as the worker's spec takes it.
std::string dtypeName(c10::ScalarType type) {
  switch (type) {
    case c10::kFloat: return "float32";
    case c10::kDouble: return "float64";
    case c10::kHalf: return "float16";
    case c10::kBFloat16: return "bfloat16";
    case c10::kLong: return "int64";
    case c10::kInt: return "int32";
    case c10::kShort: return "int16";
    case c10::kChar: return "int8";
    case c10::kByte: return "uint8";
    case c10::kBool: return "bool";
    case c10::kComplexFloat: return "complex64";
    case c10::kComplexDouble: return "complex128";
    default: return c10::toString(type);  // the worker refuses it, naming it
  }
}

/// "float32:2,3:3,1:0" per tensor: dtype, sizes, strides, storage offset (what the key and the
/// worker's spec hold of an input).
std::string describe(const at::Tensor& t) {
  return fmt::format("{}:{}:{}:{}", dtypeName(t.scalar_type()), fmt::join(t.sizes(), ","),
                     fmt::join(t.strides(), ","), t.storage_offset());
}

std::string defaultCacheDir() {
  if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg != nullptr && *xdg != '\0') {
    return std::string(xdg) + "/genie-node/packages";
  }
  const char* home = std::getenv("HOME");
  return std::string(home != nullptr && *home != '\0' ? home : "/tmp") + "/.cache/genie-node/packages";
}

/// Creates `dir` (and its parents) and makes it mode 0700 and ours; an error message otherwise.
std::optional<std::string> makePrivateDir(const std::string& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return fmt::format("cannot create {}: {}", dir, ec.message());
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) return fmt::format("{} is not a directory", dir);
  if (st.st_uid != ::geteuid()) return fmt::format("{} belongs to another user", dir);
  if ((st.st_mode & 0777) != 0700 && ::chmod(dir.c_str(), 0700) != 0) {
    return fmt::format("cannot make {} mode 0700", dir);
  }
  return std::nullopt;
}

/// The ISA level the CPU kernels dispatch to (AVX2, AVX512, ...) or the CUDA device's
/// architecture: what a compiled package is specific to besides torch.
std::string deviceFingerprint(c10::Device device) {
  if (device.is_cpu()) return "cpu-" + at::get_cpu_capability();
  if (device.is_cuda()) {
    const std::string arch = cudaArchitecture(device.has_index() ? device.index() : 0);
    return fmt::format("{} {}", device.str(), arch.empty() ? "(architecture unknown: a build without CUDA)" : arch);
  }
  return device.str();
}

std::string environmentFingerprint() {
  std::vector<std::string> vars;
  for (char** e = environ; *e != nullptr; ++e) {
    if (std::string_view(*e).starts_with("TORCHINDUCTOR_")) vars.emplace_back(*e);
  }
  std::sort(vars.begin(), vars.end());
  return fmt::format("{}", fmt::join(vars, "\n"));
}

/// Parses the package's "genie.outputs" metadata: "dtype:sizes:strides:offset" per output, ';'-separated.
struct OutputLayout {
  std::vector<int64_t> sizes, strides;
};
std::vector<OutputLayout> parseOutputs(const std::string& text) {
  std::vector<OutputLayout> out;
  std::stringstream outputs(text);
  std::string one;
  auto ints = [](const std::string& list) {
    std::vector<int64_t> v;
    std::stringstream items(list);
    std::string item;
    while (std::getline(items, item, ',')) {
      if (!item.empty()) v.push_back(std::stoll(item));
    }
    return v;
  };
  while (std::getline(outputs, one, ';')) {
    std::vector<std::string> fields;
    std::stringstream parts(one);
    std::string field;
    while (std::getline(parts, field, ':')) fields.push_back(field);
    while (fields.size() < 3) fields.emplace_back();
    out.push_back({ints(fields[1]), ints(fields[2])});
  }
  return out;
}

/// `t` as an output a client may hold: its own storage, from offset 0 (a view of an input or
/// of a temporary would keep more alive, and the client describes it as a fresh tensor).
at::Tensor standalone(const at::Tensor& t, const std::vector<at::Tensor>& inputs) {
  bool aliases = t.storage_offset() != 0;
  for (const at::Tensor& in : inputs) aliases = aliases || (in.defined() && t.defined() && t.is_alias_of(in));
  if (!aliases) return t;
  at::Tensor copy = at::empty_strided(t.sizes(), t.strides(), t.options());
  copy.copy_(t);
  return copy;
}

}  // namespace

struct CompiledParts::Part {
  std::string graph_hex;
  wire::GraphId graph_id;
  std::string key;                     // hex of everything the package depends on
  std::vector<std::string> input_descs;
  std::vector<int64_t> output_ids;
  enum class State { kQueued, kReady, kFailed } state = State::kQueued;  // under CompiledParts::mutex_
  std::string reason;                  // kFailed: why the executor runs it; under mutex_
  double build_s = 0;                  // the worker's build; under mutex_
  bool from_cache = false;             // the package was in the cache; under mutex_
  std::atomic<uint64_t> package_calls{0}, executor_calls{0};
  std::unique_ptr<torch::inductor::AOTIModelPackageLoader> loader;      // set once, before kReady
  std::vector<OutputLayout> layouts;
  std::mutex run_mutex;
  // CUDA graphs: set with the loader (mode "reduce-overhead" on a CUDA node); the rest under run_mutex.
  bool wants_graph = false;
  std::unique_ptr<PackageGraph> graph;
  int package_runs = 0;                 // warm-up runs (without a graph)
  int short_captures = 0;               // captures replayed fewer than kMinReplaysPerCapture times
  uint64_t replays_since_capture = 0;
  bool graph_off = false;               // a capture failed, or too many short ones: runs without a graph
  std::vector<bool> moving;             // inputs given static buffers (compiled_cuda.h)
  std::vector<const void*> last_addresses;  // each input's address at the previous call
  std::atomic<uint64_t> graph_replays{0};
};

CompiledParts* CompiledParts::current() { return g_current.load(); }

CompiledParts::CompiledParts(const Executor& executor, const GraphRegistry& graphs, CompileConfig config)
    : executor_(executor), graphs_(graphs), config_(std::move(config)) {
  if (config_.engine == "aoti") {
    const std::string dir = config_.cache_dir.empty() ? defaultCacheDir() : config_.cache_dir;
    if (auto error = makePrivateDir(dir)) {
      GENIE_LOG_WARN("compiled parts: {}; every part runs by the executor", *error);
    } else {
      cache_dir_ = dir;
    }
  }
  fingerprint_ = fmt::format("genie-aoti-{}\n{}\n{}\n{}", kWorkerFormat, at::show_config(),
                             deviceFingerprint(executor_.device()), environmentFingerprint());
  if (!cache_dir_.empty()) compile_thread_ = std::thread([this] { compileLoop(); });
  g_current.store(this);
}

CompiledParts::~CompiledParts() {
  CompiledParts* self = this;
  g_current.compare_exchange_strong(self, nullptr);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  queue_cv_.notify_all();
  if (const int pid = worker_pid_.load(); pid > 0) ::kill(pid, SIGKILL);
  if (compile_thread_.joinable()) compile_thread_.join();
}

CompiledParts::Counts CompiledParts::counts() const {
  return {package_calls_.load(), executor_calls_.load(), packages_built_.load(), packages_loaded_.load(),
          failures_.load(), graph_replays_.load()};
}

std::shared_ptr<CompiledParts::Part> CompiledParts::partFor(const std::string& graph,
                                                            const std::vector<at::Tensor>& inputs,
                                                            const std::vector<int64_t>& output_ids) {
  // The lookup key, per call: the graph and each input's dtype, sizes, strides and offset as
  // raw words (no formatting on the hot path); the readable form is made for a new part only.
  std::string lookup = graph;
  auto word = [&lookup](int64_t w) { lookup.append(reinterpret_cast<const char*>(&w), sizeof w); };
  for (const at::Tensor& t : inputs) {
    word(static_cast<int64_t>(t.scalar_type()));
    word(t.dim());
    for (int64_t d : t.sizes()) word(d);
    for (int64_t d : t.strides()) word(d);
    word(t.storage_offset());
  }
  word(-1);
  for (int64_t v : output_ids) word(v);
  std::lock_guard<std::mutex> lock(mutex_);
  auto found = parts_.find(lookup);
  if (found != parts_.end()) return found->second;
  auto part = std::make_shared<Part>();
  if (parts_.size() >= kMaxParts || queue_.size() >= kMaxQueuedBuilds) {
    part->state = Part::State::kFailed;  // the executor runs it; nothing is kept
    return part;
  }
  if (cache_dir_.empty()) part->reason = "compiling is off (--compile-engine executor, or no cache directory)";
  std::string signature = graph;
  for (const at::Tensor& t : inputs) {
    part->input_descs.push_back(describe(t));
    signature += '|' + part->input_descs.back();
  }
  signature += fmt::format("|{}", fmt::join(output_ids, ","));
  part->graph_hex = graph;
  part->graph_id = *parseGraphId(graph);
  part->output_ids = output_ids;
  part->key = hexOf(fingerprint_ + "\n" + signature);
  if (cache_dir_.empty()) {
    part->state = Part::State::kFailed;
  } else {
    queue_.push_back(part);
    queue_cv_.notify_one();
  }
  parts_.emplace(std::move(lookup), part);
  return part;
}

std::vector<at::Tensor> CompiledParts::call(const std::string& graph, const std::vector<int64_t>& output_ids,
                                            const std::vector<at::Tensor>& inputs,
                                            const std::vector<at::Tensor>& written) {
  const auto id = parseGraphId(graph);
  TORCH_CHECK(id.has_value(), "genie::call_graph: '", graph, "' is not a graph id (32 lowercase hex digits)");
  auto compiled = graphs_.find(*id);
  TORCH_CHECK(compiled != nullptr, "genie::call_graph: graph ", graph, " is not registered on this node");
  TORCH_CHECK(inputs.size() == compiled->numInputs(), "genie::call_graph: graph ", graph, " takes ",
              compiled->numInputs(), " inputs, got ", inputs.size());
  for (int64_t v : output_ids) {
    TORCH_CHECK(v >= 0 && static_cast<uint64_t>(v) < compiled->numValues(), "genie::call_graph: graph ", graph,
                " has no value ", v);
  }
  for (size_t i = 0; i < written.size(); ++i) {
    const bool is_input = std::any_of(inputs.begin(), inputs.end(), [&](const at::Tensor& t) {
      return t.defined() && written[i].defined() && t.is_alias_of(written[i]);
    });
    TORCH_CHECK(is_input, "genie::call_graph: graph ", graph, ": written[", i, "] is not one of its inputs");
  }
  auto part = partFor(graph, inputs, output_ids);
  bool ready;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    ready = part->state == Part::State::kReady;
  }
  if (ready) {
    try {
      std::vector<at::Tensor> out;
      {
        std::lock_guard<std::mutex> run_lock(part->run_mutex);
        out = part->wants_graph ? runWithGraph(*part, inputs, written) : part->loader->run(inputs);
      }
      TORCH_CHECK(out.size() == output_ids.size(), "the package returned ", out.size(), " outputs, not ",
                  output_ids.size());
      for (size_t i = 0; i < out.size() && i < part->layouts.size(); ++i) {
        const OutputLayout& want = part->layouts[i];
        if (out[i].sizes() == c10::IntArrayRef(want.sizes) && out[i].strides() != c10::IntArrayRef(want.strides)) {
          at::Tensor restrided = at::empty_strided(want.sizes, want.strides, out[i].options());
          restrided.copy_(out[i]);
          out[i] = restrided;
        }
      }
      package_calls_.fetch_add(1, std::memory_order_relaxed);
      part->package_calls.fetch_add(1, std::memory_order_relaxed);
      return out;
    } catch (const std::exception& e) {
      failures_.fetch_add(1, std::memory_order_relaxed);
      GENIE_LOG_WARN("compiled part {} (package {}): the package failed ({}); it runs by the executor from now on",
                     graph, part->key, e.what());
      {
        std::lock_guard<std::mutex> lock(mutex_);
        part->state = Part::State::kFailed;
        const std::string what = e.what();
        part->reason = fmt::format("its package failed to run: {}", what.substr(0, what.find('\n')));
      }
      // A part that writes its inputs may have written some: running it again would apply
      // the writes twice. This call fails; the next one runs by the executor.
      TORCH_CHECK(written.empty(), "genie::call_graph: graph ", graph, ": its package failed after it may have "
                  "written its inputs (", e.what(), "); the part runs by the executor from the next call");
    }
  }
  std::vector<uint64_t> needed(output_ids.begin(), output_ids.end());
  auto values = executor_.run(*compiled, inputs, {}, nullptr, std::span<const uint64_t>(needed));
  if (!values) TORCH_CHECK(false, "genie::call_graph: graph ", graph, ": ", values.status().message());
  std::vector<at::Tensor> out;
  out.reserve(output_ids.size());
  for (int64_t v : output_ids) out.push_back(standalone((*values)[static_cast<size_t>(v)], inputs));
  executor_calls_.fetch_add(1, std::memory_order_relaxed);
  part->executor_calls.fetch_add(1, std::memory_order_relaxed);
  return out;
}

std::vector<at::Tensor> CompiledParts::runWithGraph(Part& part, const std::vector<at::Tensor>& inputs,
                                                     const std::vector<at::Tensor>& written) {
  // Which inputs changed address since the previous call. Those that change during the
  // warm-up runs, or that make a graph fail its replay soon after its capture, move (a token, a
  // position: a new tensor each call) and get static buffers; the others are fixed (weights, a
  // KV cache), and a graph is captured again when one of them is elsewhere (a new cache).
  const size_t n = inputs.size();
  if (part.moving.size() != n) part.moving.assign(n, false);
  std::vector<size_t> changed;
  for (size_t i = 0; i < n && part.last_addresses.size() == n; ++i) {
    if (inputs[i].data_ptr() != part.last_addresses[i]) changed.push_back(i);
  }
  part.last_addresses.resize(n);
  for (size_t i = 0; i < n; ++i) part.last_addresses[i] = inputs[i].data_ptr();
  auto* loader = part.loader.get();
  auto replayed = [&](std::vector<at::Tensor>& out) {
    graph_replays_.fetch_add(1, std::memory_order_relaxed);
    part.graph_replays.fetch_add(1, std::memory_order_relaxed);
    return std::move(out);
  };
  if (part.graph != nullptr) {
    size_t moved = 0;
    if (auto out = part.graph->replay(inputs, &moved)) {
      ++part.replays_since_capture;
      return replayed(*out);
    }
    part.graph.reset();
    if (part.replays_since_capture < kMinReplaysPerCapture) {  // captured for little: these move often
      for (size_t i : changed) part.moving[i] = true;
      part.moving[moved] = true;
      ++part.short_captures;
    }
    GENIE_LOG_INFO("compiled part {}: input {} changed address after {} replays; its CUDA graph is captured again",
                   part.graph_hex, moved, part.replays_since_capture);
  } else if (part.graph_off) {
    return loader->run(inputs);
  } else {  // warm-up runs, then the first capture
    for (size_t i : changed) part.moving[i] = true;
    if (++part.package_runs <= kGraphWarmups) return loader->run(inputs);
  }
  std::string why;
  if (part.short_captures >= kMaxShortCaptures) {
    why = fmt::format("its inputs changed address soon after each of {} CUDA graph captures", part.short_captures);
  } else {
    std::vector<bool> writes(n, false);
    for (size_t i = 0; i < n; ++i) {
      writes[i] = std::any_of(written.begin(), written.end(),
                              [&](const at::Tensor& w) { return inputs[i].is_alias_of(w); });
    }
    try {
      part.graph = PackageGraph::capture(
          [loader](const std::vector<at::Tensor>& in, void* stream) { return loader->run(in, stream); }, inputs,
          part.moving, writes);
      part.replays_since_capture = 0;
      size_t moved = 0;
      // The capture ran nothing: this replay is the call's run.
      if (auto out = part.graph->replay(inputs, &moved)) return replayed(*out);
      why = "its replay found an input moved during the capture";
    } catch (const std::exception& e) {
      const std::string what = e.what();
      why = fmt::format("its CUDA graph capture failed: {}", what.substr(0, what.find('\n')));
    }
  }
  part.graph.reset();
  part.graph_off = true;
  GENIE_LOG_WARN("compiled part {} (package {}): runs without a CUDA graph: {}", part.graph_hex, part.key, why);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    part.reason = "runs its package without a CUDA graph: " + why;
  }
  return loader->run(inputs);
}

std::vector<wire::StatsArgs::Part> CompiledParts::facts(std::span<const wire::GraphId> graphs) const {
  std::vector<wire::StatsArgs::Part> out;
  if (graphs.empty()) return out;
  std::lock_guard<std::mutex> lock(mutex_);
  for (const auto& [lookup, part] : parts_) {
    if (std::none_of(graphs.begin(), graphs.end(), [&](const wire::GraphId& g) { return g == part->graph_id; })) continue;
    wire::StatsArgs::Part f;
    f.graph_id = part->graph_id;
    f.inputs = fmt::format("{}", fmt::join(part->input_descs, "|"));
    f.state = part->state == Part::State::kReady ? "package" : part->state == Part::State::kQueued ? "building" : "executor";
    f.package_calls = part->package_calls.load(std::memory_order_relaxed);
    f.executor_calls = part->executor_calls.load(std::memory_order_relaxed);
    f.build_us = static_cast<uint64_t>(part->build_s * 1e6);
    f.from_cache = part->from_cache;
    f.reason = part->reason;
    f.cuda_graph_replays = part->graph_replays.load(std::memory_order_relaxed);
    out.push_back(std::move(f));
  }
  return out;
}

// ---- the compile thread -----------------------------------------------------------------

void CompiledParts::compileLoop() {
  while (true) {
    std::shared_ptr<Part> part;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      queue_cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (stopping_) return;
      part = queue_.front();
      queue_.pop_front();
    }
    build(*part);
  }
}

namespace {

/// Runs argv (stdout and stderr to `log`), recording the child's pid in `pid_slot` while it runs.
/// Returns the exit status (-1: could not start; 128 + signal when killed).
int runProcess(const std::vector<std::string>& argv, const std::string& log, std::atomic<int>& pid_slot) {
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 1, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  posix_spawn_file_actions_adddup2(&actions, 1, 2);
  posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t pid = 0;
  const int rc = posix_spawnp(&pid, args[0], &actions, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (rc != 0) return -1;
  pid_slot.store(pid);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  pid_slot.store(0);
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  return 128 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
}

std::string lastLine(const std::string& path) {
  std::ifstream in(path);
  std::string line, last;
  while (std::getline(in, line)) {
    if (!line.empty()) last = line;
  }
  return last.empty() ? "(no output)" : last;
}

/// Deletes the least recently used packages (by modification time, which a load refreshes)
/// but `keep` (the one just built) until the *.pt2 files of `dir` take at most `limit` bytes.
void evict(const std::string& dir, uint64_t limit, const fs::path& keep) {
  std::vector<std::pair<fs::file_time_type, fs::path>> packages;
  uint64_t total = 0;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    if (entry.path().extension() != ".pt2") continue;
    total += entry.file_size(ec);
    packages.emplace_back(entry.last_write_time(ec), entry.path());
  }
  std::sort(packages.begin(), packages.end());
  for (const auto& [when, path] : packages) {
    if (total <= limit) break;
    if (path == keep) continue;
    const uint64_t size = fs::file_size(path, ec);
    if (fs::remove(path, ec)) {
      fs::path sidecar = path;
      fs::remove(sidecar.replace_extension(".graph"), ec);
      fs::remove(sidecar.replace_extension(".json"), ec);
      total -= std::min(total, size);
      GENIE_LOG_INFO("compiled parts: evicted {} ({} bytes; cache limit {} bytes)", path.string(), size, limit);
    }
  }
}

}  // namespace

void CompiledParts::build(Part& part) {
  const std::string package = cache_dir_ + "/" + part.key + ".pt2";
  auto bytes = graphs_.bytesOf(part.graph_id);
  // The compile mode travels as the graph's name (genie.compile).
  std::string mode = "default";
  if (bytes != nullptr) {
    auto graph = wire::verifyGraph({reinterpret_cast<const std::byte*>(bytes->data()), bytes->size()});
    const std::string name = graph && (*graph)->name() != nullptr ? (*graph)->name()->str() : "";
    if (name == "reduce-overhead" || name == "max-autotune" || name == "max-autotune-no-cudagraphs") mode = name;
  }
  const bool wants_graph = mode == "reduce-overhead" && executor_.device().is_cuda();
  std::error_code ec;
  if (!fs::exists(package, ec)) {
    if (bytes == nullptr) return;
    const std::string stem = cache_dir_ + "/" + part.key;
    {
      std::ofstream graph_file(stem + ".graph", std::ios::binary);
      graph_file.write(bytes->data(), static_cast<std::streamsize>(bytes->size()));
      std::ofstream spec(stem + ".json");
      std::vector<std::string> inputs;
      for (const std::string& d : part.input_descs) {
        // "float32:2,3:3,1:0" -> {"dtype": ..., "sizes": [...], "strides": [...], "storage_offset": ...}
        std::vector<std::string> f;
        std::stringstream ss(d);
        std::string x;
        while (std::getline(ss, x, ':')) f.push_back(x);
        while (f.size() < 4) f.emplace_back("0");
        inputs.push_back(fmt::format(R"({{"dtype": "{}", "sizes": [{}], "strides": [{}], "storage_offset": {}}})",
                                     f[0], f[1], f[2], f[3]));
      }
      spec << fmt::format(R"({{"device": "{}", "inputs": [{}], "outputs": [{}], "mode": "{}"}})",
                          executor_.device().str(), fmt::join(inputs, ", "), fmt::join(part.output_ids, ", "), mode)
           << "\n";
    }
    const auto started = std::chrono::steady_clock::now();
    const int rc = runProcess({config_.python, "-m", "genie.compile.worker", "--graph", stem + ".graph", "--spec",
                               stem + ".json", "--out", package},
                              stem + ".log", worker_pid_);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    bool shutting_down = false;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      shutting_down = stopping_;
    }
    if (rc != 0 && shutting_down) {  // the destructor killed the worker: no failure of the part's
      GENIE_LOG_INFO("compiled part {}: its package build was stopped after {:.1f} s: the node is shutting down",
                     part.graph_hex, seconds);
      return;
    }
    if (rc != 0) {
      failures_.fetch_add(1, std::memory_order_relaxed);
      GENIE_LOG_WARN("compiled part {}: the compile worker failed (exit {}, {:.1f} s): {}; it runs by the executor",
                     part.graph_hex, rc, seconds, rc < 0 ? "could not start " + config_.python : lastLine(stem + ".log"));
      std::lock_guard<std::mutex> lock(mutex_);
      part.state = Part::State::kFailed;
      part.reason = fmt::format("the compile worker failed (exit {}): {}", rc,
                                rc < 0 ? "could not start " + config_.python : lastLine(stem + ".log"));
      return;
    }
    {
      std::lock_guard<std::mutex> lock(mutex_);
      part.build_s = seconds;
    }
    packages_built_.fetch_add(1, std::memory_order_relaxed);
    GENIE_LOG_INFO("compiled part {}: package {} built in {:.1f} s", part.graph_hex, part.key, seconds);
    fs::remove(stem + ".log", ec);  // the graph and the spec stay beside the package (what it was built from)
    evict(cache_dir_, config_.cache_bytes, package);
  }
  try {
    // A part captured as a CUDA graph runs single-threaded (under its run mutex): the
    // container then records no completion event, which a capture would refuse.
    auto loader = std::make_unique<torch::inductor::AOTIModelPackageLoader>(package, "model", wants_graph);
    auto metadata = loader->get_metadata();
    auto layouts = parseOutputs(metadata.count("genie.outputs") ? metadata["genie.outputs"] : "");
    fs::last_write_time(package, fs::file_time_type::clock::now(), ec);  // recently used
    packages_loaded_.fetch_add(1, std::memory_order_relaxed);
    std::lock_guard<std::mutex> lock(mutex_);
    part.loader = std::move(loader);
    part.layouts = std::move(layouts);
    part.wants_graph = wants_graph;
    part.from_cache = part.build_s == 0;
    part.state = Part::State::kReady;
  } catch (const std::exception& e) {
    failures_.fetch_add(1, std::memory_order_relaxed);
    const std::string what = e.what();
    GENIE_LOG_WARN("compiled part {}: package {} failed to load ({}); deleted, the part runs by the executor",
                   part.graph_hex, package, what.substr(0, what.find('\n')));
    fs::remove(package, ec);
    std::lock_guard<std::mutex> lock(mutex_);
    part.state = Part::State::kFailed;
    part.reason = fmt::format("its package failed to load: {}", what.substr(0, what.find('\n')));
  }
}

}  // namespace genie::node

// genie::call_graph(str graph, int[] outputs, Tensor[] inputs, Tensor(a!)[] written) -> Tensor[]
//   Runs registered part `graph` (32 hex digits) on `inputs`; returns its values `outputs`.
//   `written`: the inputs the part writes in place (each also in `inputs`), declared so that
//   the recorder and autograd see the writes.
TORCH_LIBRARY_FRAGMENT(genie, m) {
  m.def("call_graph(str graph, int[] outputs, Tensor[] inputs, Tensor(a!)[] written) -> Tensor[]",
        [](const std::string& graph, const std::vector<int64_t>& outputs, const std::vector<at::Tensor>& inputs,
           const std::vector<at::Tensor>& written) {
          auto* parts = genie::node::CompiledParts::current();
          TORCH_CHECK(parts != nullptr, "genie::call_graph: this process runs no genie-node service");
          return parts->call(graph, outputs, inputs, written);
        });
}
