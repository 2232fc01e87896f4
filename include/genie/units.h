// Parsing of sizes given by people (flags, environment variables). The one size parser of
// Genie: every flag and GENIE_* variable that takes bytes goes through it.
#pragma once

#include <cstdint>
#include <string_view>

#include "genie/status.h"

namespace genie {

/// A byte count: digits, then an optional unit (case insensitive).
///   none or B          bytes
///   K, M, G, T         2^10, 2^20, 2^30, 2^40 (as `--memory-limit 64M` always meant)
///   KiB, MiB, GiB, TiB the same, IEC names
///   KB, MB, GB, TB     10^3, 10^6, 10^9, 10^12 (SI)
/// "64M" and "64MiB" are 67,108,864 bytes; "64MB" is 64,000,000.
/// Errors: kInvalidArgument naming the text (empty, not a whole number, unknown unit, overflow).
Result<uint64_t> parseByteSize(std::string_view text);

}  // namespace genie
