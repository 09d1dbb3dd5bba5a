// The pieces of `tcpx-p2p bench engine` that its initiator (initiator.cc, sweep.cc), its targets
// (target.cc) and its report (report.cc) share: the operations, the counters' line, each side's
// settings, registered memory, and the loop that keeps transfers in flight on lanes.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "bench/engine_bench.h"
#include "bench/harness/memory.h"
#include "tcpx/config.h"
#include "tcpx/endpoint.h"
#include "tcpx/status.h"

namespace tcpx::bench::engine_bench {

// The small message of the raw latency baseline: about the size of the engine's WRITE
// acknowledgement or READ request (a header, a transfer id, a status or one segment).
inline constexpr uint64_t kSmallMessage = 32;

// The memory each side of a run may hold per memory type, all its endpoints together: the
// registered regions (with --bidir both sets) and, in host memory, the raw TCP baseline's buffer.
// The initiator refuses a size that needs more before it starts; the target refuses commands
// that would make it hold more (TargetLimits).
inline constexpr uint64_t kSideBytes = 16ULL << 30;

// A transfer that has not finished after this long means the engine is stuck.
inline constexpr auto kStallTimeout = std::chrono::seconds(60);

enum class Op { kWrite, kRead };

const char* op_name(Op op);

// --stats: the counters as one line of numbers (the target's reply), and the sum of several.
inline constexpr uint64_t Stats::*kStatFields[] = {&Stats::bytes_sent,
                                                   &Stats::bytes_received,
                                                   &Stats::transfers_started,
                                                   &Stats::transfers_completed,
                                                   &Stats::transfers_failed,
                                                   &Stats::requests_served,
                                                   &Stats::errors,
                                                   &Stats::retries,
                                                   &Stats::window_blocked_ns,
                                                   &Stats::staging_waits,
                                                   &Stats::staging_peak_bytes};
inline constexpr const char* kStatNames[] = {"bytes_sent",
                                             "bytes_received",
                                             "transfers_started",
                                             "transfers_completed",
                                             "transfers_failed",
                                             "requests_served",
                                             "errors",
                                             "retries",
                                             "window_blocked_ns",
                                             "staging_waits",
                                             "staging_peak_bytes"};

Stats sum_stats(const std::vector<std::unique_ptr<Endpoint>>& eps);

std::string stats_line(const Stats& s);

StatusOr<Stats> parse_stats_line(const std::string& line);

// Which side of the benchmark an endpoint is on: the index of its GPU in --gpus.
enum Side { kInitiatorSide = 0, kTargetSide = 1 };

// The settings of one side's endpoints. With --mem vram they serve that side's GPU: the engine
// makes it current before transports allocate per-connection GPU memory.
StatusOr<Config> bench_config(const EngineBenchOptions& o, Side side);

// The socket transport's I/O threads per endpoint under `c` (effective): 0 with SOCKET_IO=caller
// (automatic on a small machine), where the progress thread does the I/O.
int io_threads_per_endpoint(const Config& c);

// --- memory ------------------------------------------------------------------------------------

bool parse_mem(const std::string& word, MemType* type);

// One T per memory type.
template <typename T>
class ByMem {
 public:
    T& operator[](MemType t) { return v_[static_cast<size_t>(t)]; }
    const T& operator[](MemType t) const { return v_[static_cast<size_t>(t)]; }

 private:
    std::array<T, 2> v_;
};

// The memory types a run registers: the measured one first; with --mem vram also host memory,
// for the raw TCP baseline and the host figures.
std::vector<MemType> mem_types(const EngineBenchOptions& o);

struct Region {
    Buffer buf;
    MemId mem = 0;
};

// A registered region of at least `len` bytes of `type` (on GPU `gpu`), kept when it is large
// enough already.
Status ensure_region(Endpoint* ep, Region* r, MemType type, int gpu, uint64_t len);

// --- transfers: one loop for the initiator and, with --bidir, the targets
// -------------------------

// One stream of transfers: an endpoint, the peer it posts to, our region and the peer's.
struct Lane {
    Endpoint* ep = nullptr;
    PeerId peer = 0;
    MemId local = 0;
    RemoteMem remote;
};

// What every transfer of a measurement looks like. Slot k of a region is bytes [k, k + 1) x
// slot_bytes(); the transfers in flight use slots 0..conc-1 and the last one of a measurement
// slot conc, which --verify prepares before and checks after.
struct Shape {
    Op op = Op::kWrite;
    uint64_t size = 0;  // per piece
    int batch = 1;
    int conc = 1;
    uint64_t slot_bytes() const { return size * static_cast<uint64_t>(batch); }
};

StatusOr<XferId> post_lane(const Lane& lane, const Shape& s, int slot, std::vector<IoVec>* iov);

// `count` transfers on every lane, s.conc in flight on each, all lanes at once; the last one of
// every lane in slot s.conc. Returns each lane's seconds from the start until its last transfer
// completed.
StatusOr<std::vector<double>> run_lanes(const std::vector<Lane>& lanes, const Shape& s,
                                        uint64_t count);

}  // namespace tcpx::bench::engine_bench
