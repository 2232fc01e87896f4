// Logging that any translation unit may use, including those that include torch headers
// (torch ships its own fmt, which cannot meet spdlog's in one TU): callers format the
// message, genie_common hands it to spdlog.
#pragma once

#include <string>
#include <string_view>

#include <fmt/format.h>

namespace genie {

enum class LogLevel { kTrace, kDebug, kInfo, kWarn, kError, kCritical };

/// Logs one preformatted line through the default spdlog logger.
void logMessage(LogLevel level, std::string_view message);
/// Sets the level from "trace", "debug", "info", "warn", "error", "critical", "off".
/// Returns false for an unknown name.
bool setLogLevel(std::string_view name);
/// Sends the log to standard error under `name` (programs keep standard output for results).
void logToStderr(const std::string& name);

}  // namespace genie

#define GENIE_LOG_INFO(...) ::genie::logMessage(::genie::LogLevel::kInfo, ::fmt::format(__VA_ARGS__))
#define GENIE_LOG_WARN(...) ::genie::logMessage(::genie::LogLevel::kWarn, ::fmt::format(__VA_ARGS__))
#define GENIE_LOG_ERROR(...) ::genie::logMessage(::genie::LogLevel::kError, ::fmt::format(__VA_ARGS__))
#define GENIE_LOG_DEBUG(...) ::genie::logMessage(::genie::LogLevel::kDebug, ::fmt::format(__VA_ARGS__))
