#include "genie/log.h"

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

namespace genie {

void logMessage(LogLevel level, std::string_view message) {
  switch (level) {
    case LogLevel::kTrace: spdlog::trace("{}", message); break;
    case LogLevel::kDebug: spdlog::debug("{}", message); break;
    case LogLevel::kInfo: spdlog::info("{}", message); break;
    case LogLevel::kWarn: spdlog::warn("{}", message); break;
    case LogLevel::kError: spdlog::error("{}", message); break;
    case LogLevel::kCritical: spdlog::critical("{}", message); break;
  }
}

bool setLogLevel(std::string_view name) {
  auto level = spdlog::level::from_str(std::string(name));
  if (level == spdlog::level::off && name != "off") return false;
  spdlog::set_level(level);
  return true;
}

void logToStderr(const std::string& name) {
  auto level = spdlog::get_level();
  spdlog::set_default_logger(spdlog::stderr_color_mt(name));
  spdlog::set_level(level);
}

}  // namespace genie
