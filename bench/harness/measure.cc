#include "bench/harness/measure.h"

#include <time.h>

#include <algorithm>
#include <charconv>
#include <cstdlib>
#include <thread>
#include <utility>

#include "bench/harness/report.h"
#include "bench/harness/roles.h"
#include "common/params.h"
#include "common/status_util.h"
#include "common/strings.h"

namespace tcpx::bench {

double seconds_since(Clock::time_point start) {
    return std::chrono::duration<double>(Clock::now() - start).count();
}

// --- command-line sizes ------------------------------------------------------------------------

bool parse_size_list(const std::string& text, std::vector<uint64_t>* out) {
    out->clear();
    for (const std::string& item : split_trimmed(text, ',')) {
        const size_t dots = item.find("..");
        if (dots != std::string::npos) {
            uint64_t lo = 0;
            uint64_t hi = 0;
            if (!parse_size(item.substr(0, dots), &lo) || !parse_size(item.substr(dots + 2), &hi) ||
                lo == 0 || lo > hi) {
                return false;
            }
            // Each size 4x the last, up to hi: stop before s * 4 would pass hi (or wrap).
            for (uint64_t s = lo;; s *= 4) {
                out->push_back(s);
                if (out->size() > kMaxSizes || s > hi / 4) break;
            }
        } else {
            uint64_t v = 0;
            if (!parse_size(item, &v)) return false;
            out->push_back(v);
        }
        if (out->size() > kMaxSizes) return false;
    }
    return !out->empty();
}

bool parse_gpu_pair(const std::string& text, std::vector<int>* out) {
    out->clear();
    const size_t comma = text.find(',');
    if (comma == std::string::npos) return false;
    const std::string_view all(text);
    for (std::string_view item : {all.substr(0, comma), all.substr(comma + 1)}) {
        item = trim(item);
        int v = -1;
        const auto [end, ec] = std::from_chars(item.data(), item.data() + item.size(), v);
        if (item.empty() || ec != std::errc() || end != item.data() + item.size() || v < 0 ||
            v > 1023) {
            return false;
        }
        out->push_back(v);
    }
    return true;
}

// --- the in-flight window ----------------------------------------------------------------------

// run_window's wait with nothing completing: polls this long, then yields the core between rounds
// until kYieldFor (both bounded in rounds too), then blocks in Window::wait, or naps kNap between
// rounds where there is none. Time bounds, not only round counts: on a loaded machine each yield
// can last milliseconds, and a thread that sleeps is woken sooner than one that keeps yielding.
constexpr uint64_t kPollRounds = 200;
constexpr uint64_t kYieldRounds = 2000;
constexpr auto kPollFor = std::chrono::microseconds(20);
constexpr auto kYieldFor = std::chrono::microseconds(200);
constexpr auto kNap = std::chrono::microseconds(20);

StatusOr<std::vector<double>> run_window(const Window& w) {
    struct Flight {
        int slot;
    };
    const size_t n = w.lanes;
    std::vector<std::vector<Flight>> inflight(n);
    std::vector<std::vector<int>> free_slots(n);
    for (auto& f : free_slots) {
        for (int slot = w.window - 1; slot >= 0; --slot) f.push_back(slot);
    }
    std::vector<uint64_t> posted(n, 0);
    std::vector<uint64_t> done(n, 0);
    std::vector<double> seconds(n, 0);
    uint64_t remaining = w.count * n;
    const auto start = Clock::now();
    auto last_done = start;
    const auto stall = std::chrono::duration<double>(w.stall_seconds);
    for (uint64_t spins = 0; remaining > 0;) {
        bool progressed = false;
        for (size_t p = 0; p < n; ++p) {
            auto& f = inflight[p];
            for (size_t i = 0; i < f.size();) {
                TCPX_ASSIGN_OR_RETURN(bool complete, w.done(p, f[i].slot));
                if (!complete) {
                    ++i;
                    continue;
                }
                if (f[i].slot != w.last_slot) free_slots[p].push_back(f[i].slot);
                f[i] = f.back();
                f.pop_back();
                --remaining;
                if (++done[p] == w.count) seconds[p] = seconds_since(start);
                progressed = true;
            }
            while (posted[p] < w.count && f.size() < static_cast<size_t>(w.window)) {
                int slot = w.last_slot;
                if (w.last_slot < 0 || posted[p] + 1 < w.count) {
                    slot = free_slots[p].back();
                    free_slots[p].pop_back();
                }
                TCPX_RETURN_IF_ERROR(w.post(p, slot));
                f.push_back(Flight{slot});
                ++posted[p];
                progressed = true;
            }
        }
        if (progressed) {
            spins = 0;
            last_done = Clock::now();
            continue;
        }
        // As an application would wait: poll, then yield, then, once nothing has completed for
        // a while (a wire slower than this machine), block until one of its operations completes
        // (a lane's oldest, lanes in turn) or nap between rounds. Without that this thread would
        // take every idle cycle, and the CPU time per GB beside raw TCP's (which blocks in the
        // kernel) would count its spinning rather than the transfers' cost.
        ++spins;
        const auto idle = Clock::now() - last_done;
        if (spins > kYieldRounds || idle > kYieldFor) {
            const size_t p = spins % n;
            if (w.wait && !inflight[p].empty()) {
                TCPX_RETURN_IF_ERROR(w.wait(p, inflight[p].front().slot));
            } else {
                std::this_thread::sleep_for(kNap);
            }
        } else if (spins > kPollRounds || idle > kPollFor) {
            std::this_thread::yield();
        }
        if (spins % 1024 == 0 && Clock::now() - last_done > stall) {
            return timeout_error(strformat(
                "%s: no transfer completed for %.0f s (%llu of %llu left)", w.what.c_str(),
                w.stall_seconds, static_cast<unsigned long long>(remaining),
                static_cast<unsigned long long>(w.count * n)));
        }
    }
    return seconds;
}

// --- measurements ------------------------------------------------------------------------------

Latency summarize(std::vector<double> samples_us) {
    Latency out;
    if (samples_us.empty()) return out;
    std::sort(samples_us.begin(), samples_us.end());
    const size_t n = samples_us.size();
    out.p50_us = samples_us[n / 2];
    out.p99_us = samples_us[std::min(n - 1, n * 99 / 100)];
    double sum = 0;
    for (double v : samples_us) sum += v;
    out.mean_us = sum / static_cast<double>(n);
    out.iters = n;
    return out;
}

double process_cpu_seconds() {
    timespec ts{};
    if (::clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts) != 0) return 0;
    return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

StatusOr<double> peer_cpu_seconds(Peer* peer) {
    TCPX_ASSIGN_OR_RETURN(std::string reply, peer->call("cpu"));
    const auto w = words(reply);
    double seconds = -1;
    if (w.size() == 2 && w[0] == "cpu" && !parse_seconds(w[1], &seconds)) seconds = -1;
    if (seconds < 0) return protocol_error("peer: expected \"cpu <seconds>\", got: " + reply);
    return seconds;
}

StatusOr<CpuTimes> both_cpu_seconds(Peer* peer, bool peer_is_process) {
    CpuTimes t;
    t.here = process_cpu_seconds();
    if (!peer_is_process) return t;
    TCPX_ASSIGN_OR_RETURN(t.peer, peer_cpu_seconds(peer));
    return t;
}

double cpu_per_gb(const Throughput& t) {
    const double gb = t.gbps * t.seconds;  // GB moved in the measured run
    return t.cpu_seconds > 0 && gb > 0 ? t.cpu_seconds / gb : 0;
}

StatusOr<Throughput> measure_throughput(const Calibration& cal, uint64_t bytes_per_iter,
                                        const TimedRun& timed, const CpuClock& cpu) {
    // Every run between two readings of both sides' CPU clocks: the last run's is the figure.
    CpuTimes used;
    auto run = [&](uint64_t count) -> StatusOr<double> {
        CpuTimes before;
        if (cpu) {
            TCPX_ASSIGN_OR_RETURN(before, cpu());
        }
        TCPX_ASSIGN_OR_RETURN(double seconds, timed(count));
        if (cpu) {
            TCPX_ASSIGN_OR_RETURN(CpuTimes after, cpu());
            used = CpuTimes{after.here - before.here, after.peer - before.peer};
        }
        return seconds;
    };
    constexpr uint64_t kMaxCount = kMaxRunCount;
    uint64_t count =
        std::clamp<uint64_t>((32ULL << 20) / std::max<uint64_t>(bytes_per_iter, 1), 4, 2000);
    TCPX_ASSIGN_OR_RETURN(double t, run(count));
    while (t < cal.min_seconds / 8 && count < kMaxCount) {
        count = std::min(kMaxCount, count * 4);
        TCPX_ASSIGN_OR_RETURN(t, run(count));
    }
    auto count_for = [&](double seconds, uint64_t iters) {
        const double per = std::max(seconds / static_cast<double>(iters), 1e-9);
        return std::clamp<uint64_t>(static_cast<uint64_t>(cal.min_seconds / per), cal.min_iters,
                                    std::max(kMaxCount, cal.min_iters));
    };
    count = count_for(t, count);
    TCPX_ASSIGN_OR_RETURN(double seconds, run(count));
    for (int retry = 0; retry < 2 && seconds < cal.min_seconds / 2; ++retry) {
        const uint64_t more = count_for(seconds, count);
        if (more <= count) break;  // at the iteration cap already
        count = more;
        TCPX_ASSIGN_OR_RETURN(seconds, run(count));
    }
    Throughput out;
    out.iters = count;
    out.seconds = seconds;
    out.gbps = static_cast<double>(bytes_per_iter) * static_cast<double>(count) / seconds / 1e9;
    out.cpu_seconds = used.here + used.peer;
    out.peer_cpu_seconds = used.peer;
    return out;
}

StatusOr<Latency> measure_latency(const Calibration& cal, const SampledRun& run) {
    constexpr uint64_t kMaxSamples = 200000;
    TCPX_ASSIGN_OR_RETURN(auto warm, run(20));
    double sum = 0;
    for (double v : warm) sum += v;
    const double per = std::max(sum / 20.0 / 1e6, 1e-7);
    const uint64_t count =
        std::clamp<uint64_t>(static_cast<uint64_t>(cal.min_seconds / per), cal.min_iters,
                             std::max<uint64_t>(kMaxSamples, cal.min_iters));
    TCPX_ASSIGN_OR_RETURN(auto samples, run(count));
    for (int retry = 0; retry < 2 && samples.size() < kMaxSamples; ++retry) {
        double total_us = 0;
        for (double v : samples) total_us += v;
        if (total_us / 1e6 >= cal.min_seconds / 2) break;
        const double mean_s = std::max(total_us / static_cast<double>(samples.size()) / 1e6, 1e-7);
        const uint64_t more = std::min<uint64_t>(
            static_cast<uint64_t>((cal.min_seconds - total_us / 1e6) / mean_s) + 1,
            kMaxSamples - samples.size());
        TCPX_ASSIGN_OR_RETURN(auto extra, run(more));
        samples.insert(samples.end(), extra.begin(), extra.end());
    }
    return summarize(std::move(samples));
}

StatusOr<Throughput> Sweep::throughput(const std::string& what, uint64_t bytes_per_iter,
                                       const TimedRun& run, uint64_t min_iters) {
    if (progress_ != nullptr) progress_->next(what);
    Calibration cal = cal_;
    if (min_iters > 0) cal.min_iters = min_iters;
    return measure_throughput(cal, bytes_per_iter, run, cpu_);
}

StatusOr<Latency> Sweep::latency(const std::string& what, const SampledRun& run) {
    if (progress_ != nullptr) progress_->next(what);
    return measure_latency(cal_, run);
}

}  // namespace tcpx::bench
