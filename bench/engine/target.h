// The target side of `tcpx-p2p bench engine` (the responder): the endpoints the initiator connects
// to, in a thread, a child process or on another host.
#pragma once

#include <cstdint>
#include <string>

#include "bench/engine/common.h"
#include "bench/harness/roles.h"
#include "tcpx/config.h"
#include "tcpx/status.h"

namespace tcpx::bench::engine_bench {

// What the initiator's commands may make a target hold or wait for. On a side channel they come
// from the network; the defaults are what a real initiator can ask, and a fuzzer runs the same
// target with small ones.
struct TargetLimits {
    int endpoints = 256;  // endpoints <n>
    // Memory per memory type, all endpoints: the registered regions and, in host memory, the raw
    // TCP baseline's buffer too (kSideBytes).
    uint64_t side_bytes = kSideBytes;
    int64_t accept_ms = 86400000;  // accept <ms>: the largest CONNECT_TIMEOUT_MS
    int raw_wait_ms = 60000;       // the raw baseline's waits (RawTcpResponder)
};

// Serves the initiator's commands on `ch` (the protocol is at the top of target.cc) until it says
// quit or goes away; the endpoints are made with `config`, and the raw TCP baseline listens on
// `interface`. With `bidir` every endpoint has a second region per memory type, for its own
// transfers toward the initiator.
Status serve_targets(const Config& config, const std::string& interface, bool bidir, Channel* ch,
                     const TargetLimits& limits = {});

}  // namespace tcpx::bench::engine_bench
