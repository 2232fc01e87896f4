// GraphRegistry: the compiled graphs of genie-node, shared by every session.
//
// A graph is kept under its GraphId, the hash of its FlatBuffers bytes (wire::hashGraph), so a
// graph that many sessions register is compiled once; graphs hold no data, only ops and
// shapes, so sharing them crosses no session's boundary. Graphs stay until the node stops.
// Thread-safe: sessions register and look up from their own threads (one mutex, never held
// while compiling).
#pragma once

#include <cstddef>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <unordered_map>
#include <utility>

#include "genie/node/executor.h"
#include "genie/status.h"
#include "genie/wire/codec.h"

namespace genie::node {

class GraphRegistry {
 public:
  /// Graphs are compiled by `executor` (it outlives the registry).
  explicit GraphRegistry(const Executor& executor) : executor_(executor) {}

  struct Registered {
    wire::GraphId id;
    std::shared_ptr<const CompiledGraph> graph;
  };
  /// The graph whose FlatBuffers bytes are `bytes` (`graph`, verified, is their root): the one
  /// kept under their hash, else compiled now and kept. Errors: the executor's compile errors
  /// (UnknownOp, SchemaMismatch, naming the op), nothing kept.
  Result<Registered> add(std::span<const std::byte> bytes, const wire::Graph& graph);
  /// The graph kept under `id`, or nullptr.
  std::shared_ptr<const CompiledGraph> find(const wire::GraphId& id) const;
  /// The FlatBuffers bytes of the graph kept under `id`, or nullptr (the compile worker's input).
  std::shared_ptr<const std::string> bytesOf(const wire::GraphId& id) const;
  /// Graphs kept.
  size_t size() const;

 private:
  const Executor& executor_;
  mutable std::mutex mutex_;
  struct Kept {
    std::shared_ptr<const CompiledGraph> graph;
    std::shared_ptr<const std::string> bytes;
  };
  std::unordered_map<wire::GraphId, Kept, wire::GraphIdHash, wire::GraphIdEqual> graphs_;
};

}  // namespace genie::node
