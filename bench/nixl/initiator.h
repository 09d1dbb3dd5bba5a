// The initiator side of tcpx-nixl-bench: its agent, the transfer requests it creates (one per
// slot of the window, or the KV workload's), and the ways it posts them: a window of requests in
// flight, one at a time, and the --verify rounds that the target prepares and checks.
#pragma once

#include <nixl.h>

#include <cstdint>
#include <string>
#include <vector>

#include "bench/harness/measure.h"
#include "bench/harness/roles.h"
#include "bench/nixl/agent.h"
#include "bench/nixl/common.h"
#include "tcpx/status.h"

namespace tcpx::bench::nixl_bench {

class Initiator {
 public:
    Initiator(const Options& o, Peer* peer, Memory* memory) : o_(o), peer_(peer), memory_(memory) {}
    ~Initiator() { end(); }

    // An agent with `backend` here and there, metadata loaded, connected.
    Status begin(const std::string& backend);
    // The agents go away, here and there.
    void end();

    const nixl_b_params_t& params() const { return agent_.params; }

    // One request per slot for (op, size).
    Status prepare(Op op, uint64_t size);
    int depth() const { return static_cast<int>(handles_.size()); }
    uint64_t round_bytes() const { return slot_bytes_ * handles_.size(); }

    // Every slot once, each request with a notification: the source patterned and the
    // destination poisoned before, the destination checked after (here for READ, there for
    // WRITE), and every notification must have arrived.
    Status verify(uint64_t run);

    // `total` requests with depth() in flight, each slot reposted as it completes. Returns the
    // seconds from the first post to the last completion.
    StatusOr<double> requests(uint64_t total, const nixl_opt_args_t* args = nullptr);

    // `count` requests one at a time (slot 0): microseconds from post to completion each.
    StatusOr<std::vector<double>> singles(uint64_t count);

    // Both sides' CPU seconds so far (the target is another process: it reports its own).
    StatusOr<CpuTimes> cpu_seconds() { return both_cpu_seconds(peer_, true); }

    // --kv: one request per KV request of the workload (its every piece a descriptor, local
    // and remote blocks chosen by the two sides' seeds), then one of the same bytes as one
    // descriptor (the contiguous baseline), for `op`.
    Status prepare_kv(Op op);

    // --kv: `count` requests one at a time (a decode pulling one sequence's cache), cycling
    // through the KV requests, or with `contiguous` the contiguous one. The seconds they took.
    StatusOr<double> kv_requests(bool contiguous, uint64_t count,
                                 const nixl_opt_args_t* args = nullptr);

    // --kv --verify: one request (the first KV request, or the contiguous one) with a
    // notification, its source patterned and its destination pool poisoned first; after it,
    // every byte of the destination's pieces must hold its pattern.
    Status verify_kv(uint64_t run, bool contiguous);

 private:
    std::string kv_what(bool contiguous) const;
    // Until the request of `slot` completes (or --timeout passes without it).
    Status wait(size_t slot);
    Status post(size_t slot, const nixl_opt_args_t* args);
    void release();

    const Options& o_;
    Peer* peer_;
    Memory* memory_;
    Agent agent_;
    bool registered_ = false;
    bool target_begun_ = false;
    std::string target_;  // the target agent's name, from its metadata
    uint64_t remote_addr_ = 0;
    uint64_t remote_dev_ = 0;
    Op op_ = Op::kWrite;
    uint64_t slot_bytes_ = 0;
    std::vector<nixlXferReqH*> handles_;
};

}  // namespace tcpx::bench::nixl_bench
