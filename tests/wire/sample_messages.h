// Valid sample messages and a small Graph builder, shared by the wire tests and by the
// fuzzer's seed-corpus generator (tests/fuzz/make_seed_corpus.cc).
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "genie/wire/codec.h"

namespace genie::wire::samples {

/// Handles used by the samples: {0x6e6965 + n, n} (never null).
Handle handle(uint64_t n);

/// A finished header and the payload size it was built for.
struct SampleMessage {
  Body body = Body::NONE;
  flatbuffers::DetachedBuffer header;
  size_t payload_bytes = 0;
};

/// One valid message per Body member, in Body order (Hello .. SendTensors); every optional
/// feature shows up at least once (strides, storage_offset, remote buffers, inline inputs,
/// Hello.attach_session).
std::vector<SampleMessage> sampleMessages();

/// A valid Graph (finishGraph'd) with 2 tensor inputs (the second bound to handle(12)), 1
/// scalar input and one argument of every Value kind.
flatbuffers::DetachedBuffer sampleGraph();

/// Builds Graphs argument by argument; nothing is checked, so tests can build bad ones.
class GraphMaker {
 public:
  flatbuffers::FlatBufferBuilder& fbb() { return fbb_; }

  /// `bound`: GraphInput.handle (a bound input); {0,0} leaves the input unbound.
  void tensorInput(DType dtype, std::vector<int64_t> shape, Handle bound = {});
  void setNumScalarInputs(uint32_t n) { num_scalar_inputs_ = n; }

  /// Arguments; `name` empty means positional.
  flatbuffers::Offset<Argument> arg(std::string_view name, Value type,
                                    flatbuffers::Offset<void> value);
  flatbuffers::Offset<Argument> tensor(uint32_t id, std::string_view name = {});
  flatbuffers::Offset<Argument> integer(int64_t v, std::string_view name = {});
  flatbuffers::Offset<Argument> scalarInput(uint32_t slot, std::string_view name = {});

  void node(std::string_view op, std::string_view overload,
            const std::vector<flatbuffers::Offset<Argument>>& args, uint32_t num_outputs = 1);

  /// Finishes with finishGraph and returns the bytes (the maker is spent afterwards).
  flatbuffers::DetachedBuffer finish(std::string_view name = "test");

 private:
  flatbuffers::FlatBufferBuilder fbb_;
  std::vector<flatbuffers::Offset<GraphInput>> inputs_;
  std::vector<flatbuffers::Offset<Node>> nodes_;
  uint32_t num_scalar_inputs_ = 0;
};

}  // namespace genie::wire::samples
