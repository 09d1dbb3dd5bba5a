// The target side of tcpx-nixl-bench (the responder): its region and agent, and the initiator's
// commands, in the forked child or on another host.
#pragma once

#include "bench/harness/roles.h"
#include "bench/nixl/common.h"
#include "tcpx/status.h"

namespace tcpx::bench::nixl_bench {

// Serves the initiator's commands on `ch` (the protocol is at the top of target.cc) until it says
// quit (OK) or goes away (UNAVAILABLE), polling the agent's notifications between commands. The
// agents are made with `o` (memory, the target's GPU, --interface, --param, progress thread).
Status serve_target(const Options& o, Channel* ch);

}  // namespace tcpx::bench::nixl_bench
