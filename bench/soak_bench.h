// `tcpx-p2p bench soak`: many peers keeping many writes in flight against one target for a long
// time, in one process; prints throughput, errors, open fds and resident memory as it goes and
// at the end, and checks every byte of the target's region once it stops. For leaks and slow
// drift, not for speed.
#pragma once

#include <cstdint>

namespace tcpx::bench {

// The largest write, and the most memory the target's region (peers x inflight x size) may
// take; the initiators hold as much again.
constexpr uint64_t kSoakMaxSize = 1ULL << 30;
constexpr uint64_t kSoakMaxBytes = 16ULL << 30;

struct SoakOptions {
    int peers = 64;
    int inflight = 32;  // writes in flight per peer
    uint64_t size = 64 * 1024;
    double seconds = 600;
    int report_seconds = 30;
    int threads = 4;  // posting and polling threads
};

// 0 when every transfer succeeded and every byte is right; 2 for options out of their bounds.
int run_soak_bench(const SoakOptions& options);

}  // namespace tcpx::bench
