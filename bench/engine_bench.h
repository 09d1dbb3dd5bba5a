// The benchmark of the transfer engine (tcpx::Endpoint): one-sided WRITE and READ from an
// initiator endpoint to one or more target endpoints (or from N initiator endpoints to N targets,
// one pair per GPU), in one process, two, or on two hosts (--listen / --connect), one direction
// or both at once, between host or GPU memory, against raw TCP measured in the same run (the same
// stream count for throughput, a ping-pong for latency) and, for GPU memory, against the same
// transfers between host memory.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "bench/harness/memory.h"
#include "bench/kv_workload.h"

namespace tcpx::bench {

struct EngineBenchOptions {
    std::vector<uint64_t> sizes;  // bytes per piece; a transfer moves batch pieces
    bool write = true;            // measure WRITE
    bool read = true;             // measure READ
    int batch = 1;                // pieces per transfer (writev/readv when > 1)
    int concurrency = 8;          // transfers in flight per peer (at most 512 MiB of them)
    int peers = 1;                // target endpoints the initiator connects to
    // With pairs, `peers` initiator endpoints, each connected to its own target endpoint (all
    // busy at once); per_gpu (--gpus all): pair i on GPU i of both sides, peers = the GPUs.
    bool pairs = false;
    bool per_gpu = false;
    // Both directions at once: the targets also post the same transfers toward the initiator's
    // endpoints (into memory of their own), and the figures are each direction's and the sum.
    bool bidir = false;
    int processes = 2;  // 1: targets in this process; 2: all targets in a child
    // Roles on two hosts: the target serves the command channel on a TCP connection accepted at
    // `listen` (HOST:PORT, port 0: ephemeral); the initiator connects to `connect`. Empty: both
    // roles on this host (processes).
    std::string listen;
    std::string connect;
    double connect_timeout = 30;  // seconds the initiator tries to reach --connect
    // Empty with --listen / --connect: the interface holding the side channel's address.
    std::string interface = "=lo";
    // Memory of every registered region. With kVram, `gpus` holds the initiator's GPU and the
    // targets' GPU (empty: 0,1 on a machine with two GPUs or more, else 0,0), and unless
    // !host_baseline the same transfers are also measured between host memory.
    MemType mem = MemType::kHost;
    std::vector<int> gpus;
    bool host_baseline = true;
    // Engine settings from the command line; empty: from TCPX_P2P_* or the default.
    std::string channels;         // CHANNELS
    std::string nsocks;           // NSOCKS
    std::string chunk;            // XFER_CHUNK_SIZE
    std::string window;           // WINDOW
    std::string progress_thread;  // PROGRESS_THREAD (off: the target side polls, as NIXL's does)
    double min_seconds = 0.5;     // per measurement
    int min_iters = 5;            // per measurement
    bool baseline = true;         // also measure raw TCP
    bool latency = true;          // also measure single transfers (concurrency 1)
    bool single_peer = true;      // with peers > 1: also measure one peer with the same settings
    bool verify = false;          // check the bytes of every measurement's last transfer
    bool kv = false;              // the KV workload instead of the size sweep (bench/kv_workload.h)
    KvShape kv_shape;
    bool json = false;
    bool stats = false;  // print both sides' endpoint counters (Endpoint::stats) after the figures
    bool progress = true;  // on stderr, when it is a terminal
};

// Runs the sweep and prints the table (or JSON) on stdout. Returns the process exit code.
int run_engine_bench(const EngineBenchOptions& options);

// The target side in a child process (`tcpx-p2p bench engine --serve`): commands on stdin,
// replies on stdout.
int serve_engine_bench(const EngineBenchOptions& options);

// The target side on its own host (`tcpx-p2p bench engine --listen HOST:PORT`): prints a banner
// with the address it listens on, serves the first initiator that greets it correctly (others are
// refused), and returns when that one says quit or goes away.
int listen_engine_bench(const EngineBenchOptions& options);

}  // namespace tcpx::bench
