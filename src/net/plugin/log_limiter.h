// A rate limit on a plugin's log lines, per source line of the plugin.
//
// Google's TCPX plugin logs a WARN for every host-memory receive (and others in loops); at
// thousands of receives a second that would bury everything else and cost more than the
// transfers. Each source (file:line) may print `burst` lines per `interval_ms`; the rest of that
// interval is counted, and the count is reported, once, with the source's first line after the
// interval ends. A burst of 0 prints nothing but the counts.
#pragma once

#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>

namespace tcpx::net {

class LogRateLimiter {
 public:
    // Milliseconds on a monotonic clock (injected by tests).
    using Clock = std::function<int64_t()>;

    LogRateLimiter(int64_t burst, int64_t interval_ms, Clock clock = {});

    struct Verdict {
        bool print = false;
        // Lines of this source suppressed in its previous interval, not yet reported: the caller
        // reports them before this line (whether or not it prints it).
        uint64_t suppressed = 0;
    };
    Verdict admit(std::string_view file, int line);

    // New limits; forgets every source's state.
    void configure(int64_t burst, int64_t interval_ms);
    int64_t interval_ms() const;

 private:
    struct Source {
        int64_t window_start = 0;
        int64_t printed = 0;
        uint64_t suppressed = 0;
    };
    // Sources past this many share one entry: a plugin has finitely many log statements, but
    // `file` comes from the plugin and is not ours to trust with unbounded memory.
    static constexpr size_t kMaxSources = 4096;

    mutable std::mutex mu_;
    int64_t burst_;
    int64_t interval_ms_;
    Clock clock_;
    std::unordered_map<std::string, Source> sources_;
};

// The limiter the logger handed to plugins (nccl_logger_into_tcpx_log) applies. V7Net::create
// and the plugin probe configure it from PLUGIN_LOG_BURST / PLUGIN_LOG_INTERVAL_MS.
LogRateLimiter& plugin_log_limiter();

}  // namespace tcpx::net
