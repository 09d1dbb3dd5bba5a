// The initiator side of `tcpx-p2p bench engine`: its endpoints, connected to the targets'; the
// memory of every size (or the KV workload's pools) here and there; and the ways it moves bytes:
// transfers in flight on every peer (with --bidir the targets' too), one at a time, the raw TCP
// baseline beside them, and --verify's prepared and checked last transfers.
//
// Memory per peer, here and there: (concurrency + 1) slots of batch x size bytes. Transfers in
// flight use distinct slots; the last transfer of every measurement uses the extra slot, which is
// prepared before it (source patterned with a per-measurement seed, destination poisoned) and
// checked after it with --verify.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "bench/engine/common.h"
#include "bench/engine_bench.h"
#include "bench/harness/measure.h"
#include "bench/harness/memory.h"
#include "bench/harness/raw_tcp.h"
#include "bench/harness/roles.h"
#include "tcpx/config.h"
#include "tcpx/endpoint.h"
#include "tcpx/status.h"

namespace tcpx::bench::engine_bench {

class EngineInitiator {
 public:
    EngineInitiator(const EngineBenchOptions& o, const Config& config, Peer* peer)
        : o_(o), config_(config), peer_(peer) {}
    ~EngineInitiator() {
        raw_.close();
        eps_.clear();  // before the memory they may still touch
    }

    // The raw baseline's streams: as many as the engine's data sockets per peer.
    int raw_streams() const { return static_cast<int>(config_.nsocks) * channels_; }

    // Data channels per peer and direction as they run: a peer uses the smaller of the two
    // sides' counts (after setup(); each side's Config::effective() before it). An endpoint that
    // stripes its peers over several interfaces (rails, with TCPX_P2P_AUTH_SECRET) may raise its
    // own count to one per interface; the engine has no public read-out of that, so it is not
    // counted here (docs/benchmarking.md).
    int channels() const { return channels_; }

    // --stats: our endpoints' counters, and the targets' (they report them).
    Stats own_stats() const { return sum_stats(eps_); }
    StatusOr<Stats> target_stats();

    // Both sides' CPU seconds so far: the targets are threads of this process (--procs 1) or
    // another process, which reports its own.
    StatusOr<CpuTimes> cpu_seconds() { return both_cpu_seconds(peer_, o_.processes != 1); }

    // Our endpoints: one for all peers, or with --pairs one per peer (per GPU: endpoint i on
    // GPU i); the targets' endpoints, and a connection from ours to each.
    Status setup();

    // Memory for transfers of batch pieces of `size`: the concurrency that fits, regions of every
    // memory type in use here and there, the peer's descriptors.
    Status prepare(uint64_t size);

    int concurrency() const { return conc_; }
    uint64_t slot_bytes() const { return slot_bytes_; }

    // `count` transfers between memory of `type` to each of the first `npeers` peers, conc_ in
    // flight per peer (with --bidir the targets do the same toward us at the same time); the time
    // until the last one completes. last() has each peer's and direction's.
    StatusOr<double> transfers(Op op, MemType type, int npeers, uint64_t count);

    // Per peer, the seconds of the last transfers() in each direction (rev: with --bidir).
    struct Directions {
        std::vector<double> fwd;
        std::vector<double> rev;
    };
    const Directions& last() const { return last_; }

    // `count` transfers between memory of `type` to the first peer, one at a time: each one's
    // time from post to completion (wait), in microseconds.
    StatusOr<std::vector<double>> single_transfers(Op op, MemType type, uint64_t count);

    // Raw TCP moving the same bytes in the same direction, as many slots of the same size, from
    // / into host memory of its own.
    StatusOr<double> raw_stream(Op op, uint64_t count);

    // The raw request/response closest to one transfer: WRITE = the data there and an
    // acknowledgement back; READ = a request there and the data back.
    StatusOr<std::vector<double>> raw_pingpong(Op op, uint64_t count);

    // --kv: the pools of every memory type here and there (the first peer's), and the requests.
    Status prepare_kv();

    // --kv: `count` requests of memory `type`, one at a time (a decode pulling one sequence's
    // cache): each the KV request's pieces, or with `contiguous` the same bytes as one piece.
    StatusOr<double> kv_transfers(Op op, MemType type, bool contiguous, uint64_t count);

    // --kv --verify: one more request, its source patterned and its destination poisoned first,
    // checked after.
    Status verify_kv(Op op, MemType type, bool contiguous);

 private:
    std::string kv_what(Op op, MemType type, bool contiguous) const;

    StatusOr<XferId> post_kv(Op op, MemType type, bool contiguous, int request);

    struct PeerState {
        PeerId id = 0;
        int ep = 0;  // index in eps_
        ByMem<RemoteMem> remote;
        ByMem<Region> local;
        ByMem<Region> rev;  // --bidir: where the target's own transfers go to or come from
    };

    Endpoint* ep(const PeerState& p) const { return eps_[static_cast<size_t>(p.ep)].get(); }
    int gpu(const PeerState& p) const { return gpus_[static_cast<size_t>(p.ep)]; }

    Shape shape(Op op) const;

    // The raw baseline's own memory: the engine may still be finishing a transfer's last send
    // completion in its buffers (the peer has the bytes already), and its threads must never
    // share bytes with the baseline's.
    uint8_t* raw_buffer(uint64_t bytes);

    StatusOr<XferId> post(Op op, MemType type, size_t p, int slot);

    // --bidir --verify, the targets' direction: before, the last transfer's source (theirs for
    // WRITE, ours for READ) gets the pattern and its destination is poisoned; after, the
    // destination must hold the pattern.
    Status verify_prep_rev(Op op, MemType type, int npeers);
    Status verify_check_rev(Op op, MemType type, int npeers);

    // --verify: before a measurement, its last transfer's source gets this measurement's
    // pattern and its destination is poisoned; after it, the destination must hold the pattern.
    Status verify_prep(Op op, MemType type, int npeers);
    Status verify_check(Op op, MemType type, int npeers);

    const EngineBenchOptions& o_;
    Config config_;
    Peer* peer_;
    std::vector<PeerState> peers_;  // declared before eps_: outlives them
    std::vector<uint8_t> raw_mem_;  // the raw TCP baseline's buffer
    std::vector<std::unique_ptr<Endpoint>> eps_;
    std::vector<int> gpus_;  // per endpoint
    Directions last_;
    uint64_t rrun_ = 0;
    RawTcpInitiator raw_;
    std::vector<IoVec> iov_;
    ByMem<std::vector<std::vector<IoVec>>> kv_iov_;  // --kv: the requests' pieces
    uint64_t size_ = 0;
    uint64_t slot_bytes_ = 0;
    int conc_ = 1;
    int channels_ = 1;  // as they run (channels())
    uint64_t run_ = 0;
};

}  // namespace tcpx::bench::engine_bench
