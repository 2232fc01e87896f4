// Parsing of sizes given by people (flags, environment variables).
#pragma once

#include <cstdint>
#include <string_view>

#include "genie/status.h"

namespace genie {

/// "1024", "64K", "512M", "16G", "1T" -> bytes (K, M, G, T = 2^10, 2^20, 2^30, 2^40; case
/// insensitive). Errors: kInvalidArgument naming the text (empty, not a number, overflow).
Result<uint64_t> parseByteSize(std::string_view text);

}  // namespace genie
