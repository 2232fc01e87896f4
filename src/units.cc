#include "genie/units.h"

#include <cctype>
#include <charconv>
#include <string>

namespace genie {

namespace {

/// The multiplier of a unit (lower-cased), or 0 when it is not one.
uint64_t unitMultiplier(std::string_view unit) {
  struct Unit {
    std::string_view name;
    uint64_t multiplier;
  };
  static constexpr Unit kUnits[] = {
      {"", 1},
      {"b", 1},
      {"k", uint64_t{1} << 10},
      {"kib", uint64_t{1} << 10},
      {"kb", 1'000},
      {"m", uint64_t{1} << 20},
      {"mib", uint64_t{1} << 20},
      {"mb", 1'000'000},
      {"g", uint64_t{1} << 30},
      {"gib", uint64_t{1} << 30},
      {"gb", 1'000'000'000},
      {"t", uint64_t{1} << 40},
      {"tib", uint64_t{1} << 40},
      {"tb", 1'000'000'000'000},
  };
  for (const Unit& u : kUnits) {
    if (u.name == unit) return u.multiplier;
  }
  return 0;
}

}  // namespace

Result<uint64_t> parseByteSize(std::string_view text) {
  auto invalid = [&] {
    return GENIE_ERROR(kInvalidArgument, "'{}' is not a size (e.g. 8, 64K, 64MiB = 64M = 2^26 bytes, 64MB = 64*10^6)",
                       text);
  };
  uint64_t value = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (end == text.data() || ec != std::errc()) return invalid();
  std::string unit(end, text.data() + text.size());
  for (char& c : unit) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  const uint64_t multiplier = unitMultiplier(unit);
  if (multiplier == 0 || (value != 0 && value > UINT64_MAX / multiplier)) return invalid();
  return value * multiplier;
}

}  // namespace genie
