// Status: Genie's error value inside the C++ core (transport, wire, node).
//
// Errors that cross threads or layers are values, not exceptions: a `Status` carries a code,
// a message naming what failed, the file:line where it was decided and, for a request that a
// node refused or failed, the node's detail (RemoteDetail). Exceptions are used only at the
// libtorch boundary and in the Python binding. `Result<T>` is a value or a Status.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

#include <fmt/format.h>

namespace genie {

enum class StatusCode : uint16_t {
  kOk = 0,
  kInvalidArgument,    // caller passed something malformed
  kInvalidMessage,     // a received buffer failed verification
  kUnsupported,        // asked for something this build or peer cannot do
  kNotFound,
  kAlreadyExists,
  kOutOfMemory,
  kTooLarge,           // over a configured size limit
  kTimeout,            // a bounded wait ran out
  kPeerUnreachable,    // connect failed, or the peer died / the link broke
  kCancelled,          // the operation was abandoned (endpoint or worker closed)
  kUnauthenticated,
  kRemote,             // the peer answered with an error
  kInternal,
};

std::string_view statusCodeName(StatusCode code);

/// What a node says of a request it refused or failed: made by the node (its executor and
/// service), sent in its Error reply (schemas/genie.fbs `Error`), and found again in the
/// client's kRemote Status, so that a caller can raise what eager PyTorch raises.
struct RemoteDetail {
  uint16_t code = 0;         // the wire ErrorCode (genie/wire/codec.h: wire::errorCodeOf)
  int32_t op_index = -1;     // the failing op's index in the graph, -1 if no op failed
  std::string op_name;       // the failing op's schema name, "aten::addmm.default"; "" if none
  std::string message;       // the node's own message: for an op, what the op raised (eager's text)
  std::string error_class;   // the C++ exception class the op raised, "c10::IndexError"; "" if none
};

class [[nodiscard]] Status {
 public:
  Status() = default;  // OK
  Status(StatusCode code, std::string message, const char* file = "", int line = 0)
      : code_(code), message_(std::move(message)), file_(file), line_(line) {}

  static Status ok() { return Status(); }
  bool isOk() const { return code_ == StatusCode::kOk; }
  explicit operator bool() const { return isOk(); }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  const char* file() const { return file_; }
  int line() const { return line_; }

  /// The node's detail of a refused or failed request, else nullptr.
  const RemoteDetail* remote() const { return remote_.get(); }
  /// This status with `detail` attached (shared, immutable).
  Status withRemote(RemoteDetail detail) const {
    Status out = *this;
    out.remote_ = std::make_shared<const RemoteDetail>(std::move(detail));
    return out;
  }

  /// "kTimeout: flush of endpoint to 127.0.0.1:5000 did not finish in 2000 ms (endpoint.cc:120)"
  std::string toString() const;

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
  const char* file_ = "";
  int line_ = 0;
  std::shared_ptr<const RemoteDetail> remote_;
};

/// A value or the Status explaining why there is none.
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}        // NOLINT(implicit)
  Result(Status status) : v_(std::move(status)) {}  // NOLINT(implicit); must not be OK
  bool isOk() const { return std::holds_alternative<T>(v_); }
  explicit operator bool() const { return isOk(); }
  T& value() & { return std::get<T>(v_); }
  const T& value() const& { return std::get<T>(v_); }
  T&& value() && { return std::get<T>(std::move(v_)); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T&& operator*() && { return std::move(*this).value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  const Status& status() const {
    static const Status kOkStatus;
    return isOk() ? kOkStatus : std::get<Status>(v_);
  }

 private:
  std::variant<T, Status> v_;
};

}  // namespace genie

/// Makes a Status with the current file and line: GENIE_ERROR(kTimeout, "flush took {} ms", ms).
#define GENIE_ERROR(code, ...) \
  ::genie::Status(::genie::StatusCode::code, ::fmt::format(__VA_ARGS__), __FILE__, __LINE__)

/// Returns from the enclosing function if `expr` (a Status) is not OK.
#define GENIE_RETURN_IF_ERROR(expr)          \
  do {                                       \
    ::genie::Status genie_status_ = (expr);  \
    if (!genie_status_.isOk()) return genie_status_; \
  } while (0)
