#include "genie/status.h"

#include <cstring>

namespace genie {

std::string_view statusCodeName(StatusCode code) {
  switch (code) {
    case StatusCode::kOk: return "kOk";
    case StatusCode::kInvalidArgument: return "kInvalidArgument";
    case StatusCode::kInvalidMessage: return "kInvalidMessage";
    case StatusCode::kUnsupported: return "kUnsupported";
    case StatusCode::kNotFound: return "kNotFound";
    case StatusCode::kAlreadyExists: return "kAlreadyExists";
    case StatusCode::kOutOfMemory: return "kOutOfMemory";
    case StatusCode::kTooLarge: return "kTooLarge";
    case StatusCode::kTimeout: return "kTimeout";
    case StatusCode::kPeerUnreachable: return "kPeerUnreachable";
    case StatusCode::kCancelled: return "kCancelled";
    case StatusCode::kUnauthenticated: return "kUnauthenticated";
    case StatusCode::kRemote: return "kRemote";
    case StatusCode::kInternal: return "kInternal";
  }
  return "kUnknown";
}

std::string Status::toString() const {
  if (isOk()) return "kOk";
  const char* base = std::strrchr(file_, '/');
  base = base ? base + 1 : file_;
  if (line_ > 0) return fmt::format("{}: {} ({}:{})", statusCodeName(code_), message_, base, line_);
  return fmt::format("{}: {}", statusCodeName(code_), message_);
}

}  // namespace genie
