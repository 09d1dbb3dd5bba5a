#include "common/log.h"

#include <strings.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <new>
#include <string>

#include "common/env.h"
#include "common/params.h"

namespace tcpx {
namespace {

constexpr int kLevelUnset = -1;
std::atomic<int> g_level{kLevelUnset};

// Never destroyed: threads the library does not join (a plugin's I/O threads: NCCL never unloads
// it, and older ncclNet versions have no finalize) may log while the process exits, after static
// destructors have run; a destroyed sink (NCCL's logger, held by a std::function) would then be
// called. Built in static storage, not on the heap: the first message may be the one that says
// memory ran out.
template <typename T>
T& immortal() {
    alignas(T) static unsigned char storage[sizeof(T)];
    static T* object = new (storage) T();
    return *object;
}
std::mutex& sink_mutex() { return immortal<std::mutex>(); }
LogSink& sink_slot() { return immortal<LogSink>(); }

void stderr_sink(LogLevel level, const char* file, int line, std::string_view message) {
    const char* base = std::strrchr(file, '/');
    base = base ? base + 1 : file;
    const auto now = std::chrono::system_clock::now().time_since_epoch();
    const auto us = std::chrono::duration_cast<std::chrono::microseconds>(now).count();
    // One fprintf per line so concurrent messages do not interleave within a line.
    std::fprintf(stderr, "[%lld.%06lld] tcpx %s %ld %s:%d %.*s\n",
                 static_cast<long long>(us / 1000000), static_cast<long long>(us % 1000000),
                 log_level_name(level), static_cast<long>(::syscall(SYS_gettid)), base, line,
                 static_cast<int>(message.size()), message.data());
}

}  // namespace

const char* log_level_name(LogLevel level) {
    switch (level) {
        case LogLevel::kTrace:
            return "trace";
        case LogLevel::kDebug:
            return "debug";
        case LogLevel::kInfo:
            return "info";
        case LogLevel::kWarn:
            return "warn";
        case LogLevel::kError:
            return "error";
        case LogLevel::kOff:
            return "off";
    }
    return "?";
}

bool parse_log_level(std::string_view text, LogLevel* level) {
    for (int i = 0; i <= static_cast<int>(LogLevel::kOff); ++i) {
        const char* name = log_level_name(static_cast<LogLevel>(i));
        if (text.size() == std::strlen(name) &&
            ::strncasecmp(text.data(), name, text.size()) == 0) {
            *level = static_cast<LogLevel>(i);
            return true;
        }
    }
    return false;
}

void set_log_sink(LogSink sink) {
    std::lock_guard<std::mutex> lock(sink_mutex());
    sink_slot() = std::move(sink);
}

void set_log_level(LogLevel level) { g_level.store(static_cast<int>(level)); }

LogLevel log_level() {
    int level = g_level.load(std::memory_order_relaxed);
    if (level == kLevelUnset) {
        // First use: TCPX_P2P_LOG_LEVEL, parsed through the parameter table. An invalid value
        // keeps the default here; Settings::from_env() reports it as an error. (Only this one
        // variable is read: loading all of them could log, and logging needs the level.)
        LogLevel resolved = LogLevel::kWarn;
        Settings settings;
        const std::string env_name = std::string(kEnvPrefix) + "LOG_LEVEL";
        if (const auto value = env_get(env_name.c_str());
            value.has_value() && settings.set("LOG_LEVEL", *value).ok()) {
            parse_log_level(settings.log_level, &resolved);
        }
        int expected = kLevelUnset;
        g_level.compare_exchange_strong(expected, static_cast<int>(resolved));
        level = g_level.load();
    }
    return static_cast<LogLevel>(level);
}

void log_message(LogLevel level, const char* file, int line, const char* fmt, ...) noexcept {
    char stack_buf[512];
    va_list args;
    va_start(args, fmt);
    va_list copy;
    va_copy(copy, args);
    const int len = std::vsnprintf(stack_buf, sizeof(stack_buf), fmt, copy);
    va_end(copy);
    std::string heap_buf;
    std::string_view message(stack_buf, len < 0 ? 0 : static_cast<size_t>(len));
    if (len >= static_cast<int>(sizeof(stack_buf))) {
        try {
            heap_buf.resize(static_cast<size_t>(len) + 1);
            std::vsnprintf(heap_buf.data(), heap_buf.size(), fmt, args);
            heap_buf.resize(static_cast<size_t>(len));
            message = heap_buf;
        } catch (const std::bad_alloc&) {
            message = std::string_view(stack_buf, sizeof(stack_buf) - 1);  // cut short
        }
    }
    va_end(args);

    try {
        std::lock_guard<std::mutex> lock(sink_mutex());
        if (sink_slot()) {
            try {
                sink_slot()(level, file, line, message);
                return;
            } catch (...) {
                // The application's sink failed (out of memory, say): the line still goes out.
            }
        }
        stderr_sink(level, file, line, message);
    } catch (...) {
        // The mutex could not be locked (std::system_error): stderr, unserialised.
        stderr_sink(level, file, line, message);
    }
}

bool may_log_stranger_event() {
    static std::atomic<int64_t> window{0};
    static std::atomic<int> count{0};
    const int64_t now = std::chrono::duration_cast<std::chrono::seconds>(
                            std::chrono::steady_clock::now().time_since_epoch())
                            .count();
    if (window.exchange(now) != now) count.store(0);
    return count.fetch_add(1) < 5;
}

}  // namespace tcpx
