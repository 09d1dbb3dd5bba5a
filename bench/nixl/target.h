// The target side of tcpx-nixl-bench (the responder): its region and agent, and the initiator's
// commands, in the forked child or on another host.
#pragma once

#include <cstdint>

#include "bench/harness/roles.h"
#include "bench/nixl/common.h"
#include "tcpx/status.h"

namespace tcpx::bench::nixl_bench {

// The largest region a target on a side channel allocates (the largest --kv-pool): there the
// commands come from the network.
inline constexpr uint64_t kMaxSideRegion = 64ULL << 30;

// Serves the initiator's commands on `ch` (the protocol is at the top of target.cc) until it says
// quit (OK) or goes away (UNAVAILABLE), polling the agent's notifications between commands. The
// agents are made with `o` (memory, the target's GPU, --interface, --param, progress thread);
// the region is at most `max_region` bytes.
Status serve_target(const Options& o, Channel* ch, uint64_t max_region = UINT64_MAX);

}  // namespace tcpx::bench::nixl_bench
