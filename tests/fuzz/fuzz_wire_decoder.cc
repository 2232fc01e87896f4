// libFuzzer target for the wire decoder: verifyMessage, verifyGraph and checkGraph.
//
// Input: 8 bytes little-endian `payload_bytes`, then the header bytes (inputs shorter than
// 8 bytes are headers with payload_bytes 0). libFuzzer's buffer is heap-allocated, so the
// header starts 8-byte aligned, as verifyMessage requires.
//
// Beyond "no crash", every accepted buffer is read in full (minireflect walks every field and
// every value is read; this build generates the schema with --reflect-names) so ASan sees any
// read the Verifier should have refused, and the properties a verified message promises are
// checked; a broken promise traps, which libFuzzer reports as a crash.
#include <flatbuffers/minireflect.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "genie/wire/codec.h"

namespace {

using namespace genie::wire;

void require(bool ok) {
  if (!ok) __builtin_trap();
}

// Reads every value minireflect reaches (every field of every table, struct, vector, union
// and string) into a sink: the same reads as FlatBufferToString, without formatting them as
// text, which cost more than the decoder itself.
struct ReadEverything : flatbuffers::IterationVisitor {
  uint64_t sink = 0;
  size_t values = 0;
  void add(uint64_t v) { sink = sink * 31 + v; ++values; }
  void UType(uint8_t v, const char*) override { add(v); }
  void Bool(bool v) override { add(v); }
  void Char(int8_t v, const char*) override { add(static_cast<uint8_t>(v)); }
  void UChar(uint8_t v, const char*) override { add(v); }
  void Short(int16_t v, const char*) override { add(static_cast<uint16_t>(v)); }
  void UShort(uint16_t v, const char*) override { add(v); }
  void Int(int32_t v, const char*) override { add(static_cast<uint32_t>(v)); }
  void UInt(uint32_t v, const char*) override { add(v); }
  void Long(int64_t v) override { add(static_cast<uint64_t>(v)); }
  void ULong(uint64_t v) override { add(v); }
  void Float(float v) override { uint32_t u; std::memcpy(&u, &v, sizeof(u)); add(u); }
  void Double(double v) override { uint64_t u; std::memcpy(&u, &v, sizeof(u)); add(u); }
  void String(const flatbuffers::String* s) override {
    for (uint32_t i = 0; i < s->size(); ++i) add(static_cast<uint8_t>(s->c_str()[i]));
  }
  void Unknown(const uint8_t* v) override { add(*v); }
  void StartSequence() override { ++values; }
};

volatile uint64_t g_sink;

void walk(const uint8_t* buf, const flatbuffers::TypeTable* table) {
  ReadEverything reader;
  flatbuffers::IterateFlatBuffer(buf, table, &reader);
  require(reader.values > 0);
  g_sink = reader.sink;
}

void checkSlots(const flatbuffers::Vector<flatbuffers::Offset<TensorSlot>>* slots,
                size_t payload_bytes) {
  for (uint32_t i = 0; slots && i < slots->size(); ++i) {
    const TensorSlot* s = slots->Get(i);
    auto span = tensorSpanBytes(*s->desc());
    require(span.isOk() && span.value() == s->desc()->nbytes());
    if (!s->remote()) {
      require(s->payload_offset() % kPayloadAlignment == 0);
      require(s->payload_offset() <= payload_bytes &&
              s->desc()->nbytes() <= payload_bytes - s->payload_offset());
    }
  }
}

void checkGraphBytes(const uint8_t* data, size_t size) {
  auto graph = verifyGraph(std::as_bytes(std::span(data, size)));
  if (!graph.isOk()) return;
  require(checkGraph(*graph.value()).isOk());
  (void)graphNumValues(*graph.value());
  (void)hashGraph(std::as_bytes(std::span(data, size)));
  walk(data, GraphTypeTable());
}

void checkAccepted(const Message& msg, const uint8_t* header, size_t payload_bytes) {
  walk(header, MessageTypeTable());
  switch (msg.body_type()) {
    case Body::PutTensors: checkSlots(msg.body_as_PutTensors()->tensors(), payload_bytes); break;
    case Body::TensorData: checkSlots(msg.body_as_TensorData()->tensors(), payload_bytes); break;
    case Body::RunResult: {
      checkSlots(msg.body_as_RunResult()->outputs(), payload_bytes);
      const auto* described = msg.body_as_RunResult()->described();
      for (uint32_t i = 0; described && i < described->size(); ++i) {
        const TensorSlot* s = described->Get(i);
        require(s->handle() && !isNull(*s->handle()) && s->payload_offset() == 0 && !s->remote());
        auto span = tensorSpanBytes(*s->desc());
        require(span.isOk() && span.value() == s->desc()->nbytes());
      }
      break;
    }
    case Body::RunGraph: {
      const auto* free = msg.body_as_RunGraph()->free();
      for (uint32_t i = 0; free && i < free->size(); ++i) require(!isNull(*free->Get(i)));
      break;
    }
    case Body::SendTensors: {
      const SendTensors* send = msg.body_as_SendTensors();
      require(send->peer() && send->peer()->size() > 0 && send->peer()->size() <= kMaxPeerChars);
      require(send->peer_session() && !isNull(*send->peer_session()));
      require(send->handles() && send->peer_handles() && send->handles()->size() > 0 &&
              send->handles()->size() == send->peer_handles()->size());
      for (uint32_t i = 0; i < send->handles()->size(); ++i) {
        require(!isNull(*send->handles()->Get(i)) && !isNull(*send->peer_handles()->Get(i)));
      }
      require(payload_bytes == 0);
      break;
    }
    case Body::RegisterGraph: {
      const auto* bytes = msg.body_as_RegisterGraph()->graph();
      auto graph = verifyGraph(std::as_bytes(std::span(bytes->data(), bytes->size())));
      require(graph.isOk());  // verifyMessage promised it
      require(checkGraph(*graph.value()).isOk());
      walk(bytes->data(), GraphTypeTable());
      break;
    }
    default: break;
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  uint64_t payload_bytes = 0;
  if (size >= sizeof(payload_bytes)) {
    std::memcpy(&payload_bytes, data, sizeof(payload_bytes));  // little-endian hosts only
    data += sizeof(payload_bytes);
    size -= sizeof(payload_bytes);
  }
  const auto header = std::as_bytes(std::span(data, size));
  auto msg = verifyMessage(header, payload_bytes);
  if (msg.isOk()) {
    checkAccepted(*msg.value(), data, payload_bytes);
  } else {
    require(!msg.status().message().empty());
    checkGraphBytes(data, size);  // the same bytes as a bare Graph
  }
  // Tight limits reach the depth / table / size refusals.
  VerifyLimits tight;
  tight.max_depth = 4;
  tight.max_tables = 16;
  tight.max_header_bytes = 256;
  tight.max_payload_bytes = 1 << 16;
  (void)verifyMessage(header, payload_bytes, tight);
  return 0;
}

// `--help` (or `-h`): what this binary is and how to run it, then exit 0. libFuzzer parses the
// rest of the command line itself (its flags are `-name=value`; `-help=1` lists them) and would
// otherwise take `--help` for a corpus path and start fuzzing.
extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) {
  for (int i = 1; i < *argc; ++i) {
    if (std::strcmp((*argv)[i], "--help") == 0 || std::strcmp((*argv)[i], "-h") == 0) {
      std::printf(
          "fuzz_wire_decoder: libFuzzer target for the wire decoder (verifyMessage, verifyGraph, checkGraph).\n"
          "Input: 8 bytes little-endian payload_bytes, then the message header.\n"
          "Usage: %s [libFuzzer flags, e.g. -max_total_time=60] [corpus dirs or files...]\n"
          "       %s -help=1      libFuzzer's own flags\n"
          "Seeds: make_seed_corpus <dir>; campaigns: perf/fuzz_campaign.sh.\n",
          (*argv)[0], (*argv)[0]);
      std::exit(0);
    }
  }
  return 0;
}

