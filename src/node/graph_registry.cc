#include "graph_registry.h"

namespace genie::node {

Result<GraphRegistry::Registered> GraphRegistry::add(std::span<const std::byte> bytes, const wire::Graph& graph) {
  const wire::GraphId id = wire::hashGraph(bytes);
  if (auto kept = find(id)) return Registered{id, std::move(kept)};
  auto compiled = executor_.compile(graph);  // outside the lock: compiling takes a while
  if (!compiled) return compiled.status();
  std::lock_guard<std::mutex> lock(mutex_);
  // Another session may have registered the same graph meanwhile: the first one kept stays.
  auto [it, added] = graphs_.emplace(
      id, Kept{*compiled, std::make_shared<const std::string>(reinterpret_cast<const char*>(bytes.data()), bytes.size())});
  return Registered{id, it->second.graph};
}

std::shared_ptr<const CompiledGraph> GraphRegistry::find(const wire::GraphId& id) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = graphs_.find(id);
  return it == graphs_.end() ? nullptr : it->second.graph;
}

std::shared_ptr<const std::string> GraphRegistry::bytesOf(const wire::GraphId& id) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = graphs_.find(id);
  return it == graphs_.end() ? nullptr : it->second.bytes;
}

size_t GraphRegistry::size() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return graphs_.size();
}

}  // namespace genie::node
