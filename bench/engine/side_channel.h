// `tcpx-p2p bench engine` on two hosts (--listen / --connect): the harness's side channel
// (roles.h), as tcpx-nixl-bench uses it. The same command lines as the child's pipes, over one
// TCP connection. The initiator speaks first: "hello tcpx-p2p-bench-engine 1 <key>=<value>...",
// the target settings the target's command line would carry in the child (memory, GPUs, the
// engine's settings, --bidir, --time); the target answers "hello tcpx-p2p-bench-engine 1 <its
// interface>, <what its engine runs>", or "error ..." and closes. Plaintext and unauthenticated:
// the engine's own handshake (TCPX_P2P_AUTH_SECRET) guards the data endpoints.
#pragma once

#include <memory>
#include <string>

#include "bench/engine_bench.h"
#include "bench/harness/roles.h"
#include "tcpx/status.h"

namespace tcpx::bench::engine_bench {

// --connect: the side channel to the targets at o->connect, greeted; with no --interface
// (o->interface empty) the interface that reaches them. *target: "ADDR: what the target said of
// its engine", for the header.
StatusOr<std::unique_ptr<Peer>> connect_targets(EngineBenchOptions* o, std::string* target);

// --listen: waits for an initiator that greets us correctly (a stray connection that does not is
// answered "error ..." and closed) and serves it. OK when it said quit.
Status listen_and_serve(const EngineBenchOptions& options);

}  // namespace tcpx::bench::engine_bench
