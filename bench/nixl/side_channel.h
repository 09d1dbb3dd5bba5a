// tcpx-nixl-bench on two hosts (--listen / --connect): the harness's side channel (roles.h), as
// `tcpx-p2p bench engine` uses it. The same command lines as the forked child's socketpair, over
// one TCP connection. The initiator speaks first: "hello tcpx-nixl-bench 1 <key>=<value>...",
// the settings both agents must share (memory, GPUs, progress threads, --timeout, --param); the
// target answers "hello tcpx-nixl-bench 1 <its interface>, <its environment and machine>", or
// "error ..." and closes. Plaintext and unauthenticated (docs/benchmarking.md).
#pragma once

#include <memory>
#include <string>

#include "bench/harness/roles.h"
#include "bench/nixl/common.h"
#include "bench/nixl/environment.h"
#include "tcpx/status.h"

namespace tcpx::bench::nixl_bench {

// --connect: the side channel to the target at o->connect, greeted; with no --interface
// (o->interface empty) the interface that reaches it. *target: "ADDR: what the target said of
// itself", for the header.
StatusOr<std::unique_ptr<Peer>> connect_target(Options* o, std::string* target);

// --listen: prints a banner with the address it listens on, serves the first initiator that
// greets it correctly (others are refused, and listening goes on), and returns when that one
// says quit (OK) or goes away. `options`: this side's (--listen, --interface); `machine`: this
// host, for the greeting's answer.
Status listen_and_serve(const Options& options, const Machine& machine);

}  // namespace tcpx::bench::nixl_bench
