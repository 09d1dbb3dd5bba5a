#include "net/plugin/log_limiter.h"

#include <chrono>

#include "common/params.h"

namespace tcpx::net {
namespace {

int64_t steady_ms() {
    return std::chrono::duration_cast<std::chrono::milliseconds>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
}

}  // namespace

LogRateLimiter::LogRateLimiter(int64_t burst, int64_t interval_ms, Clock clock)
    : burst_(burst), interval_ms_(interval_ms), clock_(clock ? std::move(clock) : steady_ms) {}

void LogRateLimiter::configure(int64_t burst, int64_t interval_ms) {
    std::lock_guard<std::mutex> lock(mu_);
    burst_ = burst;
    interval_ms_ = interval_ms;
    sources_.clear();
}

int64_t LogRateLimiter::interval_ms() const {
    std::lock_guard<std::mutex> lock(mu_);
    return interval_ms_;
}

LogRateLimiter::Verdict LogRateLimiter::admit(std::string_view file, int line) {
    std::string key(file);
    key += ':';
    key += std::to_string(line);
    const int64_t now = clock_();
    std::lock_guard<std::mutex> lock(mu_);
    auto it = sources_.find(key);
    if (it == sources_.end()) {
        if (sources_.size() >= kMaxSources) key = "(other sources)";
        it = sources_.try_emplace(std::move(key), Source{now, 0, 0}).first;
    }
    Source& s = it->second;
    Verdict v;
    if (now - s.window_start >= interval_ms_) {
        v.suppressed = s.suppressed;
        s = Source{now, 0, 0};
    }
    if (s.printed < burst_) {
        ++s.printed;
        v.print = true;
    } else {
        ++s.suppressed;
    }
    return v;
}

LogRateLimiter& plugin_log_limiter() {
    // Never destroyed: plugins' threads may log during exit.
    static auto* limiter = [] {
        const Settings defaults;
        return new LogRateLimiter(defaults.plugin_log_burst, defaults.plugin_log_interval_ms);
    }();
    return *limiter;
}

}  // namespace tcpx::net
