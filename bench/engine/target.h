// The target side of `tcpx-p2p bench engine` (the responder): the endpoints the initiator connects
// to, in a thread, a child process or on another host.
#pragma once

#include <string>

#include "bench/harness/roles.h"
#include "tcpx/config.h"
#include "tcpx/status.h"

namespace tcpx::bench::engine_bench {

// Serves the initiator's commands on `ch` (the protocol is at the top of target.cc) until it says
// quit or goes away; the endpoints are made with `config`, and the raw TCP baseline listens on
// `interface`. With `bidir` every endpoint has a second region per memory type, for its own
// transfers toward the initiator.
Status serve_targets(const Config& config, const std::string& interface, bool bidir, Channel* ch);

}  // namespace tcpx::bench::engine_bench
