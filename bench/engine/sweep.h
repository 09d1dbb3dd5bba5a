// The initiator's run of `tcpx-p2p bench engine`: its endpoints connected to the targets', every
// size and op (or the KV workload) measured through the harness's Sweep, the endpoints' counters
// with --stats, then the report on stdout.
#pragma once

#include "bench/engine/report.h"
#include "bench/engine_bench.h"
#include "bench/harness/roles.h"
#include "tcpx/config.h"
#include "tcpx/status.h"

namespace tcpx::bench::engine_bench {

// Runs the sweep against the targets behind `peer` with our endpoints' `config` and prints the
// table or JSON (its header from `setup`: what the target said with --connect). The caller ends
// the peer after it returns.
Status run_initiator(const EngineBenchOptions& o, Config config, Setup setup, Peer* peer);

}  // namespace tcpx::bench::engine_bench
