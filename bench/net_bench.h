// The loopback benchmark of the net layer: our socket transport against raw TCP with the same
// number of streams, measured in the same run, between two endpoints in one process or two.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace tcpx::bench {

// The largest message: a transport request's size is an int (ncclNet v7), and each side holds a
// few messages' worth of buffers.
constexpr uint64_t kNetMaxMessage = 1ULL << 30;

struct NetBenchOptions {
    std::vector<uint64_t> sizes;  // message sizes to sweep, 1..kNetMaxMessage
    int nsocks = 8;               // data sockets per comm = raw TCP streams
    int io_threads = 0;           // 0: the transport's default
    int window = 16;  // messages in flight in the throughput runs (at most 512 MiB of them)
    double min_seconds = 0.5;  // per measurement
    int min_iters = 5;         // per measurement
    int processes = 1;         // 1: both endpoints in this process; 2: the receiver in a child
    std::string interface = "=lo";
    bool baseline = true;  // also measure raw TCP
    bool latency = true;   // also measure round trips
    bool json = false;
    bool progress = true;  // on stderr, when it is a terminal
};

// Runs the sweep and prints the table (or JSON) on stdout. Returns the process exit code.
int run_net_bench(const NetBenchOptions& options);

// The responder side in a child process (`tcpx-p2p bench net --serve`): commands on stdin,
// replies on stdout.
int serve_net_bench(const NetBenchOptions& options);

}  // namespace tcpx::bench
