// What the pieces of tcpx-nixl-bench share: its names, the operations, the options both sides
// run with, and the sizes derived from them.
#pragma once

#include <nixl.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "bench/harness/measure.h"
#include "bench/kv_workload.h"
#include "tcpx/status.h"

namespace tcpx::bench::nixl_bench {

inline constexpr char kProgram[] = "tcpx-nixl-bench";
inline constexpr char kInitiatorName[] = "tcpx-nixl-bench-initiator";
inline constexpr char kTargetName[] = "tcpx-nixl-bench-target";
// The notification attached to each request of a --verify round.
inline constexpr char kVerifyNotif[] = "tcpx-nixl-bench-verify";

enum class Op { kWrite, kRead };

const char* op_name(Op op);
nixl_xfer_op_t nixl_op(Op op);

struct Options {
    std::vector<std::string> backends = {"TCPX", "UCX"};
    std::vector<Op> ops = {Op::kWrite, Op::kRead};
    std::vector<uint64_t> sizes;
    int depth = 8;  // requests in flight (fewer where they would pass max_memory)
    int batch = 1;  // descriptors per request
    uint64_t max_memory = kMaxInFlightBytes;  // per side
    double min_seconds = 0.5;
    int min_iters = 5;
    bool vram = false;
    int initiator_gpu = 0;
    int target_gpu = 0;
    // The TCPX backend's "interface" parameter; empty with --listen / --connect: the interface
    // that holds this side's end of the side channel.
    std::string interface = "=lo";
    // Backend parameters from --param BACKEND:key=value, applied over the plugin's defaults.
    std::vector<std::pair<std::string, std::pair<std::string, std::string>>> params;
    bool verify = true;
    bool latency = true;
    bool json = false;
    bool progress = true;
    bool progress_thread = true;  // NIXL's, in both agents (nixlAgentConfig::useProgThread)
    double stall_seconds = 60;    // no completion for this long: the backend is stuck
    bool kv = false;              // the KV workload (bench/kv_workload.h) instead of the sweep
    KvShape kv_shape;
    // Roles on two hosts: the target serves the initiator's commands on a TCP side channel
    // accepted at `listen` (HOST:PORT, port 0: ephemeral); the initiator connects to `connect`.
    // Both empty: both roles on this host, the target in a forked child.
    std::string listen;
    std::string connect;
    double connect_timeout = 30;  // seconds the initiator tries to reach --connect
};

// "DRAM" or "VRAM", as the table says.
const char* mem_name(const Options& o);

Status from_nixl(nixl_status_t st, const std::string& what);

// Requests in flight for `size`: --depth, fewer where depth x batch x size would pass
// --max-memory (but at least one).
int depth_for(const Options& o, uint64_t size);

// The region each side registers: room for the largest case.
uint64_t region_bytes(const Options& o);

// How long either end of the side channel waits for the other: a measurement's run, or a stuck
// backend's --timeout (a --verify round waits that long for its notifications), with room to
// spare.
int side_timeout_ms(const Options& o);

}  // namespace tcpx::bench::nixl_bench
