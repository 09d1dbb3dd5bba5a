// How the benchmarks measure: the sizes they sweep, the in-flight window every throughput run
// keeps (run_window), calibrated throughput and latency measurements with warm-up, CPU time of
// both sides, and a Sweep that runs one measurement after another with the progress line.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "tcpx/status.h"

namespace tcpx::bench {

class Peer;
class Progress;

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start);

// --- command-line sizes ------------------------------------------------------------------------

// The most sizes a list may hold (a range from 1 to 2^64 - 1 has 32).
constexpr size_t kMaxSizes = 64;

// "4K,64K,1M" or a range "4K..64M" (each size 4x the previous, the last one at most the range's
// end), or both ("4K..64K,1M"); false on anything else (an empty list, a bad size, a range of
// zero or backwards, more than kMaxSizes sizes).
bool parse_size_list(const std::string& text, std::vector<uint64_t>* out);
// "A,B": two GPU indices, each in Config::gpu_index's range (0..1023).
bool parse_gpu_pair(const std::string& text, std::vector<int>* out);

// Receive buffers in flight are capped at this many bytes (a window of 16 64 MiB messages
// would be 1 GiB).
constexpr uint64_t kMaxInFlightBytes = 512ULL << 20;

// --- the in-flight window ----------------------------------------------------------------------
//
// `lanes` streams of `count` operations each (a lane: a peer, a pair of endpoints, a NIXL
// agent), all at once, at most `window` in flight per lane. An operation runs in a slot of its
// lane: slots 0..window-1 are reused as operations complete (a completed slot is the next one
// posted), and with `last_slot` >= 0 the last operation of every lane runs in that slot instead,
// so that --verify can prepare it before and check it after, apart from the others.
struct Window {
    size_t lanes = 1;
    uint64_t count = 0;  // per lane
    int window = 1;
    int last_slot = -1;
    double stall_seconds = 60;  // no completion for this long: the run failed (kTimeout)
    std::string what;           // what is moving, for that error ("WRITE of 64 KiB")
    // Posts the operation of (lane, slot); an error ends the run.
    std::function<Status(size_t lane, int slot)> post;
    // Whether the operation of (lane, slot) completed; an error ends the run.
    std::function<StatusOr<bool>(size_t lane, int slot)> done;
    // Optional: blocks until the operation of (lane, slot) completes or about a millisecond has
    // passed, whichever comes first (done() reports it afterwards); an error ends the run.
    // Without it the window naps between rounds instead.
    std::function<Status(size_t lane, int slot)> wait;
};

// Runs the window until every lane's operations completed. Polls without pause first (a
// completion is usually microseconds away), then yields the core between rounds so that the
// transports' threads can run on a machine with few cores, and once nothing has completed for
// 200 us (or 2000 rounds) blocks in Window::wait, or naps 20 us between rounds (as a waiting
// application would, so that CPU time per GB counts the transfers, not this loop's spinning).
// Returns each lane's seconds from the start until its last operation completed.
StatusOr<std::vector<double>> run_window(const Window& w);

// --- measurements ------------------------------------------------------------------------------

struct Throughput {
    double gbps = 0;
    uint64_t iters = 0;
    double seconds = 0;
    // CPU seconds (user + system, every thread) that both sides, initiator and target, spent in
    // the measured run; 0 where not measured. peer_cpu_seconds: the part of it spent by the
    // target's process when that is another process (0 when both sides share one).
    double cpu_seconds = 0;
    double peer_cpu_seconds = 0;
};

// CPU seconds per GB (10^9 bytes) moved; 0 where not measured.
double cpu_per_gb(const Throughput& t);

struct Latency {
    double p50_us = 0;
    double p99_us = 0;
    double mean_us = 0;
    uint64_t iters = 0;
};

Latency summarize(std::vector<double> samples_us);

// The most iterations one timed run of measure_throughput asks for (unless min_iters is more).
constexpr uint64_t kMaxRunCount = 5'000'000;

// How long to measure: about min_seconds, at least min_iters iterations.
struct Calibration {
    double min_seconds = 0.5;
    uint64_t min_iters = 5;
};

// CPU seconds (user + system) every thread of this process has used so far
// (CLOCK_PROCESS_CPUTIME_ID).
double process_cpu_seconds();

// CPU seconds so far of this process and of the peer's process (0 when the peer is a thread
// here: this process's time covers it).
struct CpuTimes {
    double here = 0;
    double peer = 0;
};
using CpuClock = std::function<StatusOr<CpuTimes>()>;

// The peer process's CPU seconds so far ("cpu" -> "cpu <seconds>").
StatusOr<double> peer_cpu_seconds(Peer* peer);
// Both sides' CPU seconds so far: this process's, and the peer's unless it is a thread here
// (`peer_is_process` false).
StatusOr<CpuTimes> both_cpu_seconds(Peer* peer, bool peer_is_process);

// run(count) does `count` iterations and returns their seconds.
using TimedRun = std::function<StatusOr<double>(uint64_t count)>;
// run(count) does `count` iterations and returns one sample (microseconds) per iteration.
using SampledRun = std::function<StatusOr<std::vector<double>>(uint64_t count)>;

// Warms up with growing runs until one lasts an eighth of min_seconds (connections and buffers
// are warm then, and the rate is known), then measures for about min_seconds. A measurement that
// ends up shorter than half of min_seconds (the rate rose after the warm-up) is taken again at the
// new rate. Each iteration moves `bytes_per_iter` bytes. With `cpu`, read before and after every
// run, the measured run's CPU seconds too.
StatusOr<Throughput> measure_throughput(const Calibration& cal, uint64_t bytes_per_iter,
                                        const TimedRun& run, const CpuClock& cpu = nullptr);

// Warms up with 20 iterations, then measures for about min_seconds (at most 200000 iterations);
// samples adding up to less than half of min_seconds (the warm-up was slow) are topped up at the
// new rate.
StatusOr<Latency> measure_latency(const Calibration& cal, const SampledRun& run);

// One measurement after another, each announced on the progress line ("[step/steps] what").
class Sweep {
 public:
    Sweep(const Calibration& cal, Progress* progress, CpuClock cpu = nullptr)
        : cal_(cal), progress_(progress), cpu_(std::move(cpu)) {}

    // `min_iters` > 0: at least that many iterations (instead of the calibration's).
    StatusOr<Throughput> throughput(const std::string& what, uint64_t bytes_per_iter,
                                    const TimedRun& run, uint64_t min_iters = 0);
    StatusOr<Latency> latency(const std::string& what, const SampledRun& run);

    const Calibration& calibration() const { return cal_; }

 private:
    Calibration cal_;
    Progress* progress_;
    CpuClock cpu_;
};

}  // namespace tcpx::bench
