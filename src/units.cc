#include "genie/units.h"

#include <cctype>
#include <charconv>

namespace genie {

Result<uint64_t> parseByteSize(std::string_view text) {
  auto invalid = [&] { return GENIE_ERROR(kInvalidArgument, "'{}' is not a size (e.g. 8, 64K, 512M, 16G)", text); };
  if (text.empty()) return invalid();
  unsigned shift = 0;
  std::string_view digits = text;
  switch (std::toupper(static_cast<unsigned char>(text.back()))) {
    case 'K': shift = 10; break;
    case 'M': shift = 20; break;
    case 'G': shift = 30; break;
    case 'T': shift = 40; break;
    default: break;
  }
  if (shift) digits.remove_suffix(1);
  uint64_t value = 0;
  auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), value);
  if (digits.empty() || ec != std::errc() || end != digits.data() + digits.size()) return invalid();
  if (shift && value > (UINT64_MAX >> shift)) return invalid();
  return value << shift;
}

}  // namespace genie
