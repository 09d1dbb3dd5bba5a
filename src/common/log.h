// Leveled logging with one replaceable sink.
//
// Every message goes through log_message(); the default sink writes one line to stderr. Inside
// NCCL the plugin replaces the sink with one that forwards to NCCL's logger; applications and
// tests may install their own (set_log_sink). The level comes from TCPX_P2P_LOG_LEVEL (see
// params.h) unless set_log_level() is called.
#pragma once

#include <functional>
#include <string_view>

namespace tcpx {

enum class LogLevel : int { kTrace = 0, kDebug = 1, kInfo = 2, kWarn = 3, kError = 4, kOff = 5 };

// "trace", "debug", "info", "warn", "error", "off".
const char* log_level_name(LogLevel level);
// Parses the names above (case-insensitive); false when `text` is none of them.
bool parse_log_level(std::string_view text, LogLevel* level);

using LogSink =
    std::function<void(LogLevel level, const char* file, int line, std::string_view message)>;

// Replaces the sink; an empty function restores the stderr sink. Thread-safe.
void set_log_sink(LogSink sink);
void set_log_level(LogLevel level);
LogLevel log_level();
inline bool log_enabled(LogLevel level) { return level >= log_level() && level != LogLevel::kOff; }

// Never throws: it is called from catch handlers and noexcept functions (a sink that fails, out
// of memory or otherwise, has the line go to stderr instead).
void log_message(LogLevel level, const char* file, int line, const char* fmt, ...) noexcept
    __attribute__((format(printf, 4, 5)));

// Whether a line about something a stranger did (a connection refused, closed or cut short) may
// be logged now: a few a second at most, over the whole process, so that no one who can reach a
// port can fill the log.
bool may_log_stranger_event();

}  // namespace tcpx

#define TCPX_LOG(level, ...)                                                               \
    do {                                                                                   \
        if (::tcpx::log_enabled(::tcpx::LogLevel::level))                                  \
            ::tcpx::log_message(::tcpx::LogLevel::level, __FILE__, __LINE__, __VA_ARGS__); \
    } while (0)
#define TCPX_TRACE(...) TCPX_LOG(kTrace, __VA_ARGS__)
#define TCPX_DEBUG(...) TCPX_LOG(kDebug, __VA_ARGS__)
#define TCPX_INFO(...) TCPX_LOG(kInfo, __VA_ARGS__)
#define TCPX_WARN(...) TCPX_LOG(kWarn, __VA_ARGS__)
#define TCPX_ERROR(...) TCPX_LOG(kError, __VA_ARGS__)
