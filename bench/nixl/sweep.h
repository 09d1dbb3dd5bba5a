// The initiator's run: for every backend of --backends, agents here and at the target, every op
// and size (or the KV workload), then the report on stdout.
#pragma once

#include <memory>

#include "bench/harness/roles.h"
#include "bench/nixl/common.h"
#include "bench/nixl/environment.h"

namespace tcpx::bench::nixl_bench {

// Runs the sweep against the target behind `peer` (which says "quit" to it when done) and prints
// the table or JSON. Returns the exit code: 1 when a case failed or a verification did, or when
// nothing could be measured at all.
int run_initiator(const Options& o, std::unique_ptr<Peer> peer, const Machine& machine);

}  // namespace tcpx::bench::nixl_bench
