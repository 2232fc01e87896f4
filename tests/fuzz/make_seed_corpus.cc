// Writes the seed corpus of fuzz_wire_decoder: one valid message of each Body type, plus the
// sample Graph on its own, in the fuzzer's input format (8 bytes little-endian payload_bytes,
// then the header). Usage: make_seed_corpus <dir>
#include <CLI/CLI.hpp>

#include <cstdio>
#include <filesystem>
#include <fstream>

#include "genie/wire/codec.h"
#include "sample_messages.h"

namespace {

bool writeSeed(const std::filesystem::path& path, uint64_t payload_bytes,
               std::span<const std::byte> header) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(&payload_bytes), sizeof(payload_bytes));
  out.write(reinterpret_cast<const char*>(header.data()),
            static_cast<std::streamsize>(header.size()));
  return static_cast<bool>(out);
}

}  // namespace

int main(int argc, char** argv) {
  using namespace genie::wire;
  CLI::App app{"Writes fuzz_wire_decoder's seed corpus: one valid message of each Body type and the sample "
               "Graph, in the fuzzer's input format (8 bytes little-endian payload_bytes, then the header)."};
  std::string dir_name;
  app.add_option("dir", dir_name, "the corpus directory (made if missing; its seeds are overwritten)")->required();
  CLI11_PARSE(app, argc, argv);
  const std::filesystem::path dir(dir_name);
  std::filesystem::create_directories(dir);
  for (const auto& sample : samples::sampleMessages()) {
    auto verified = verifyMessage(bytesOf(sample.header), sample.payload_bytes);
    if (!verified.isOk()) {
      std::fprintf(stderr, "sample %s is invalid: %s\n", std::string(bodyName(sample.body)).c_str(),
                   verified.status().toString().c_str());
      return 1;
    }
    const auto path = dir / (std::string(bodyName(sample.body)) + ".seed");
    if (!writeSeed(path, sample.payload_bytes, bytesOf(sample.header))) {
      std::fprintf(stderr, "cannot write %s\n", path.c_str());
      return 1;
    }
  }
  auto graph = samples::sampleGraph();
  if (!writeSeed(dir / "Graph.seed", 0, bytesOf(graph))) return 1;
  return 0;
}
