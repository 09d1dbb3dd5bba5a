// `tcpx-p2p bench engine`: the transfer engine against raw TCP over loopback.
//
// The initiator (this process) owns one endpoint and connects it to `peers` target endpoints,
// which live in the responder: a thread of this process (--procs 1) or a child process
// (--procs 2). Targets need no application action for one-sided transfers; the responder only
// creates the endpoints, registers their memory and hands out the metadata and memory
// descriptors (hex on the line channel), and prepares and checks bytes for --verify.
//
// Memory per peer, here and there: (concurrency + 1) slots of batch x size bytes. Transfers in
// flight use distinct slots; the last transfer of every measurement uses the extra slot, which is
// prepared before it (source patterned with a per-measurement seed, destination poisoned) and
// checked after it with --verify.
//
// With --mem vram every peer has that memory twice on each side: GPU memory (the initiator's on
// one GPU, the targets' on another or the same) for the measured transfers, and host memory for
// the raw TCP baseline and for the same transfers between host memory (the host figures). Both
// are registered with the same endpoints, so the two figures differ only in the memory.
//
// This file is the initiator: its measurements, the options, the side channel's greeting and
// the sweep. The targets and their commands are bench/engine/target.cc, the table and the JSON
// bench/engine/report.cc, and what all three share bench/engine/common.h.
#include "bench/engine_bench.h"

#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <thread>
#include <utility>
#include <vector>

#include "bench/engine/common.h"
#include "bench/engine/report.h"
#include "bench/engine/target.h"
#include "bench/harness/measure.h"
#include "bench/harness/raw_tcp.h"
#include "bench/harness/report.h"
#include "bench/harness/roles.h"
#include "common/status_util.h"
#include "common/strings.h"
#include "tcpx/config.h"
#include "tcpx/endpoint.h"

namespace tcpx::bench {

// This driver's own pieces (bench/engine/).
using namespace engine_bench;

namespace {

// --- the initiator's measurements ---------------------------------------------------------------

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
    StatusOr<Stats> target_stats() {
        TCPX_ASSIGN_OR_RETURN(std::string reply, peer_->call("stats"));
        return parse_stats_line(reply);
    }

    // Both sides' CPU seconds so far: the targets are threads of this process (--procs 1) or
    // another process, which reports its own.
    StatusOr<CpuTimes> cpu_seconds() { return both_cpu_seconds(peer_, o_.processes != 1); }

    // Our endpoints: one for all peers, or with --pairs one per peer (per GPU: endpoint i on
    // GPU i); the targets' endpoints, and a connection from ours to each.
    Status setup() {
        const int ours = o_.pairs ? o_.peers : 1;
        for (int i = 0; i < ours; ++i) {
            Config c = config_;
            if (o_.per_gpu) c.gpu_index = i;
            TCPX_ASSIGN_OR_RETURN(auto ep,
                                  Endpoint::create(c, "bench-initiator-" + std::to_string(i)));
            eps_.push_back(std::move(ep));
            gpus_.push_back(static_cast<int>(c.gpu_index));
        }
        TCPX_ASSIGN_OR_RETURN(
            std::string reply,
            peer_->call("endpoints " + std::to_string(o_.peers) + (o_.per_gpu ? " pergpu" : "")));
        const auto w = words(reply);
        if (w.size() != static_cast<size_t>(o_.peers) + 1 || w[0] != "md") {
            return protocol_error("peer: " + reply);
        }
        peers_.resize(static_cast<size_t>(o_.peers));
        for (int i = 0; i < o_.peers; ++i) {
            std::string md;
            if (!unhex_blob(w[static_cast<size_t>(i) + 1], &md)) {
                return protocol_error("bad metadata from peer");
            }
            PeerState& p = peers_[static_cast<size_t>(i)];
            p.ep = o_.pairs ? i : 0;
            auto id = ep(p)->connect(md);
            if (!id.ok()) {
                return Status(id.status())
                    .with_context("connecting to target " + std::to_string(i));
            }
            p.id = *id;
        }
        // What the targets' endpoints run (they may have other settings: another host's
        // environment); a target that does not say keeps ours.
        channels_ = static_cast<int>(config_.channels);
        StatusOr<std::string> theirs = peer_->call("channels");
        if (theirs.ok()) {
            const auto cw = words(*theirs);
            int n = 0;
            if (cw.size() != 2 || cw[0] != "channels" ||
                std::from_chars(cw[1].data(), cw[1].data() + cw[1].size(), n).ec != std::errc() ||
                n < 1) {
                return protocol_error("peer: " + *theirs);
            }
            channels_ = std::min(channels_, n);
        }
        // connect() returns when our side is ready; wait until the targets' sides are too before
        // the first request (the engine refuses a request that reaches a target in the middle of
        // its handshake: "WRITE_REQ before the connection was ready").
        TCPX_RETURN_IF_ERROR(
            peer_->call("accept " + std::to_string(config_.connect_timeout_ms)).status());
        if (!o_.baseline) return Status();
        return raw_.connect(peer_, raw_streams()).with_context("raw TCP baseline");
    }

    // Memory for transfers of batch pieces of `size`: the concurrency that fits, regions of every
    // memory type in use here and there, the peer's descriptors.
    Status prepare(uint64_t size) {
        size_ = size;
        slot_bytes_ = size * static_cast<uint64_t>(o_.batch);
        const uint64_t per_slot = slot_bytes_ * static_cast<uint64_t>(o_.peers);
        conc_ = static_cast<int>(
            std::min<uint64_t>(static_cast<uint64_t>(o_.concurrency),
                               std::max<uint64_t>(1, kMaxInFlightBytes / per_slot)));
        const uint64_t region = slot_bytes_ * static_cast<uint64_t>(conc_ + 1);
        const uint64_t sets = o_.bidir ? 2 : 1;  // --bidir: a region per direction
        if (region * static_cast<uint64_t>(o_.peers) * sets > (16ULL << 30)) {
            return invalid_argument(strformat("%s per side is too much memory",
                                              format_bytes(region * o_.peers * sets).c_str()));
        }
        for (MemType type : mem_types(o_)) {
            TCPX_ASSIGN_OR_RETURN(std::string reply,
                                  peer_->call(strformat("mem %s %llu", mem_name(type),
                                                        static_cast<unsigned long long>(region))));
            const auto w = words(reply);
            if (w.size() != peers_.size() + 1 || w[0] != "mem") {
                return protocol_error("peer: " + reply);
            }
            for (size_t i = 0; i < peers_.size(); ++i) {
                PeerState& p = peers_[i];
                std::string blob;
                if (!unhex_blob(w[i + 1], &blob)) return protocol_error("bad descriptor from peer");
                TCPX_ASSIGN_OR_RETURN(p.remote[type], RemoteMem::parse(blob));
                TCPX_RETURN_IF_ERROR(ensure_region(ep(p), &p.local[type], type, gpu(p), region)
                                         .with_context("initiator"));
            }
            if (!o_.bidir) continue;
            // The regions the targets' own transfers write into or read from.
            std::string rmem = strformat("rmem %s", mem_name(type));
            for (PeerState& p : peers_) {
                TCPX_RETURN_IF_ERROR(ensure_region(ep(p), &p.rev[type], type, gpu(p), region)
                                         .with_context("initiator"));
                TCPX_ASSIGN_OR_RETURN(RemoteMem d, ep(p)->describe(p.rev[type].mem));
                rmem += " " + hex_blob(d.serialize());
            }
            TCPX_RETURN_IF_ERROR(peer_->call(rmem).status());
        }
        return Status();
    }

    int concurrency() const { return conc_; }
    uint64_t slot_bytes() const { return slot_bytes_; }

    // `count` transfers between memory of `type` to each of the first `npeers` peers, conc_ in
    // flight per peer (with --bidir the targets do the same toward us at the same time); the time
    // until the last one completes. last() has each peer's and direction's.
    StatusOr<double> transfers(Op op, MemType type, int npeers, uint64_t count) {
        TCPX_RETURN_IF_ERROR(verify_prep(op, type, npeers));
        if (o_.bidir) {
            TCPX_RETURN_IF_ERROR(verify_prep_rev(op, type, npeers));
            TCPX_RETURN_IF_ERROR(peer_->send(
                strformat("xfer %s %s %llu %llu %d %d %d", op == Op::kWrite ? "write" : "read",
                          mem_name(type), static_cast<unsigned long long>(count),
                          static_cast<unsigned long long>(size_), o_.batch, conc_, npeers)));
        }
        std::vector<Lane> lanes;
        for (size_t i = 0; i < static_cast<size_t>(npeers); ++i) {
            PeerState& p = peers_[i];
            lanes.push_back(Lane{ep(p), p.id, p.local[type].mem, p.remote[type]});
        }
        StatusOr<std::vector<double>> fwd = run_lanes(lanes, shape(op), count);
        last_ = Directions();
        if (o_.bidir) {
            // The targets' answer comes when their transfers are done (or failed).
            StatusOr<std::string> reply = peer_->reply();
            if (!fwd.ok()) return fwd.status();
            if (!reply.ok()) return Status(reply.status()).with_context("the targets' transfers");
            const auto w = words(*reply);
            if (w.size() != static_cast<size_t>(npeers) + 1 || w[0] != "secs") {
                return protocol_error("peer: " + *reply);
            }
            for (size_t i = 1; i < w.size(); ++i) last_.rev.push_back(std::stod(w[i]));
        }
        if (!fwd.ok()) return fwd.status();
        last_.fwd = *fwd;
        TCPX_RETURN_IF_ERROR(verify_check(op, type, npeers));
        if (o_.bidir) TCPX_RETURN_IF_ERROR(verify_check_rev(op, type, npeers));
        double seconds = 0;
        for (double v : last_.fwd) seconds = std::max(seconds, v);
        for (double v : last_.rev) seconds = std::max(seconds, v);
        return seconds;
    }

    // Per peer, the seconds of the last transfers() in each direction (rev: with --bidir).
    struct Directions {
        std::vector<double> fwd;
        std::vector<double> rev;
    };
    const Directions& last() const { return last_; }

    // `count` transfers between memory of `type` to the first peer, one at a time: each one's
    // time from post to completion (wait), in microseconds.
    StatusOr<std::vector<double>> single_transfers(Op op, MemType type, uint64_t count) {
        TCPX_RETURN_IF_ERROR(verify_prep(op, type, 1));
        std::vector<double> us;
        us.reserve(count);
        for (uint64_t k = 0; k < count; ++k) {
            const int slot = k + 1 < count ? 0 : conc_;
            const auto start = Clock::now();
            TCPX_ASSIGN_OR_RETURN(XferId id, post(op, type, 0, slot));
            Status st = ep(peers_[0])->wait(id, kStallTimeout);
            if (!st.ok()) {
                return st.with_context(strformat("%s of %s, one at a time", op_name(op),
                                                 format_bytes(slot_bytes_).c_str()));
            }
            us.push_back(seconds_since(start) * 1e6);
        }
        TCPX_RETURN_IF_ERROR(verify_check(op, type, 1));
        return us;
    }

    // Raw TCP moving the same bytes in the same direction, as many slots of the same size, from
    // / into host memory of its own.
    StatusOr<double> raw_stream(Op op, uint64_t count) {
        const uint64_t slots = static_cast<uint64_t>(conc_);
        return raw_.stream(peer_, op == Op::kWrite, slot_bytes_, count,
                           raw_buffer(slot_bytes_ * slots), slots, slots);
    }

    // The raw request/response closest to one transfer: WRITE = the data there and an
    // acknowledgement back; READ = a request there and the data back.
    StatusOr<std::vector<double>> raw_pingpong(Op op, uint64_t count) {
        const uint64_t out = op == Op::kWrite ? slot_bytes_ : kSmallMessage;
        const uint64_t back = op == Op::kWrite ? kSmallMessage : slot_bytes_;
        return raw_.pingpong(peer_, out, back, count, raw_buffer(std::max(out, back)));
    }

    // --kv: the pools of every memory type here and there (the first peer's), and the requests.
    Status prepare_kv() {
        const KvShape& k = o_.kv_shape;
        TCPX_RETURN_IF_ERROR(peer_->call("kvshape " + kv_shape_words(k)).status());
        PeerState& p = peers_[0];
        const int gpu = this->gpu(p);
        for (MemType type : mem_types(o_)) {
            TCPX_ASSIGN_OR_RETURN(std::string reply,
                                  peer_->call(strformat("mem %s %llu", mem_name(type),
                                                        static_cast<unsigned long long>(k.pool))));
            const auto w = words(reply);
            std::string blob;
            if (w.size() != 2 || w[0] != "mem" || !unhex_blob(w[1], &blob)) {
                return protocol_error("peer: " + reply);
            }
            TCPX_ASSIGN_OR_RETURN(p.remote[type], RemoteMem::parse(blob));
            TCPX_RETURN_IF_ERROR(
                ensure_region(ep(p), &p.local[type], type, gpu, k.pool).with_context("initiator"));
            auto& requests = kv_iov_[type];
            requests.assign(kKvRequests, {});
            for (int r = 0; r < kKvRequests; ++r) {
                const auto local = kv_offsets(k, kv_seed(r, KvSide::kInitiator));
                const auto remote = kv_offsets(k, kv_seed(r, KvSide::kTarget));
                auto& iov = requests[static_cast<size_t>(r)];
                iov.reserve(local.size());
                for (size_t i = 0; i < local.size(); ++i) {
                    iov.push_back(IoVec{p.local[type].mem, local[i], p.remote[type], remote[i],
                                        k.block_bytes()});
                }
            }
        }
        return Status();
    }

    // --kv: `count` requests of memory `type`, one at a time (a decode pulling one sequence's
    // cache): each the KV request's pieces, or with `contiguous` the same bytes as one piece.
    StatusOr<double> kv_transfers(Op op, MemType type, bool contiguous, uint64_t count) {
        const auto start = Clock::now();
        for (uint64_t n = 0; n < count; ++n) {
            TCPX_ASSIGN_OR_RETURN(XferId id,
                                  post_kv(op, type, contiguous, static_cast<int>(n % kKvRequests)));
            Status st = ep(peers_[0])->wait(id, kStallTimeout);
            if (!st.ok()) return st.with_context(kv_what(op, type, contiguous));
        }
        return seconds_since(start);
    }

    // --kv --verify: one more request, its source patterned and its destination poisoned first,
    // checked after.
    Status verify_kv(Op op, MemType type, bool contiguous) {
        if (!o_.verify) return Status();
        const KvShape& k = o_.kv_shape;
        const uint64_t total = k.request_bytes();
        const Buffer& local = peers_[0].local[type].buf;
        const uint64_t run = ++run_;
        const std::string what = kv_what(op, type, contiguous);
        const std::vector<uint64_t> offsets = kv_offsets(k, kv_seed(0, KvSide::kInitiator));
        const char* mem = mem_name(type);
        const auto ull = [](uint64_t v) { return static_cast<unsigned long long>(v); };
        if (op == Op::kWrite) {
            TCPX_RETURN_IF_ERROR(contiguous
                                     ? prepare_bytes(local, 0, total, true, pattern_seed(run, 0))
                                     : kv_fill(local, k, offsets, run));
            TCPX_RETURN_IF_ERROR(peer_
                                     ->call(strformat("prep write %s %llu 0 %llu 1", mem, ull(run),
                                                      ull(contiguous ? total : k.pool)))
                                     .status());
        } else {
            TCPX_RETURN_IF_ERROR(
                peer_
                    ->call(contiguous
                               ? strformat("prep read %s %llu 0 %llu 1", mem, ull(run), ull(total))
                               : strformat("kvfill %s %llu 0", mem, ull(run)))
                    .status());
            TCPX_RETURN_IF_ERROR(prepare_bytes(local, 0, contiguous ? total : k.pool, false, 0));
        }
        TCPX_ASSIGN_OR_RETURN(XferId id, post_kv(op, type, contiguous, 0));
        TCPX_RETURN_IF_ERROR(ep(peers_[0])->wait(id, kStallTimeout).with_context(what));
        Status st;
        if (op == Op::kWrite) {
            st = peer_
                     ->call(contiguous
                                ? strformat("check %s %llu 0 %llu 1", mem, ull(run), ull(total))
                                : strformat("kvcheck %s %llu 0", mem, ull(run)))
                     .status();
        } else {
            st = contiguous ? check_bytes(local, 0, total, pattern_seed(run, 0), "initiator")
                            : kv_check(local, k, offsets, run, "initiator");
        }
        if (!st.ok()) return internal_error("VERIFICATION FAILED: " + what + ": " + st.to_string());
        return Status();
    }

 private:
    std::string kv_what(Op op, MemType type, bool contiguous) const {
        return strformat("%s of a KV request (%s memory%s)", op_name(op), mem_name(type),
                         contiguous ? ", contiguous" : "");
    }

    StatusOr<XferId> post_kv(Op op, MemType type, bool contiguous, int request) {
        PeerState& ps = peers_[0];
        Endpoint* e = ep(ps);
        StatusOr<XferId> id = Status(StatusCode::kInternal, "not posted");
        if (contiguous) {
            const uint64_t total = o_.kv_shape.request_bytes();
            id = op == Op::kWrite
                     ? e->write(ps.id, ps.local[type].mem, 0, ps.remote[type], 0, total)
                     : e->read(ps.id, ps.local[type].mem, 0, ps.remote[type], 0, total);
        } else {
            const auto& iov = kv_iov_[type][static_cast<size_t>(request)];
            id = op == Op::kWrite ? e->writev(ps.id, iov) : e->readv(ps.id, iov);
        }
        if (!id.ok()) return Status(id.status()).with_context(kv_what(op, type, contiguous));
        return id;
    }

    struct PeerState {
        PeerId id = 0;
        int ep = 0;  // index in eps_
        ByMem<RemoteMem> remote;
        ByMem<Region> local;
        ByMem<Region> rev;  // --bidir: where the target's own transfers go to or come from
    };

    Endpoint* ep(const PeerState& p) const { return eps_[static_cast<size_t>(p.ep)].get(); }
    int gpu(const PeerState& p) const { return gpus_[static_cast<size_t>(p.ep)]; }

    Shape shape(Op op) const {
        Shape s;
        s.op = op;
        s.size = size_;
        s.batch = o_.batch;
        s.conc = conc_;
        return s;
    }

    // The raw baseline's own memory: the engine may still be finishing a transfer's last send
    // completion in its buffers (the peer has the bytes already), and its threads must never
    // share bytes with the baseline's.
    uint8_t* raw_buffer(uint64_t bytes) {
        if (raw_mem_.size() < bytes) raw_mem_.resize(bytes);
        return raw_mem_.data();
    }

    StatusOr<XferId> post(Op op, MemType type, size_t p, int slot) {
        PeerState& ps = peers_[p];
        StatusOr<XferId> id = post_lane(Lane{ep(ps), ps.id, ps.local[type].mem, ps.remote[type]},
                                        shape(op), slot, &iov_);
        if (!id.ok()) {
            return Status(id.status())
                .with_context(strformat("posting a %s to target %zu", op_name(op), p));
        }
        return id;
    }

    // --bidir --verify, the targets' direction: before, the last transfer's source (theirs for
    // WRITE, ours for READ) gets the pattern and its destination is poisoned; after, the
    // destination must hold the pattern.
    Status verify_prep_rev(Op op, MemType type, int npeers) {
        if (!o_.verify) return Status();
        rrun_ = run_ | (1ULL << 63);  // apart from the forward direction's run numbers
        const uint64_t off = static_cast<uint64_t>(conc_) * slot_bytes_;
        for (int i = 0; i < npeers; ++i) {
            TCPX_RETURN_IF_ERROR(prepare_bytes(peers_[static_cast<size_t>(i)].rev[type].buf, off,
                                               slot_bytes_, op == Op::kRead,
                                               pattern_seed(rrun_, i)));
        }
        // "prep read" patterns, "prep write" poisons: the target is the source of its WRITEs.
        return peer_
            ->call(strformat("prep %s %s %llu %llu %llu %d rev",
                             op == Op::kWrite ? "read" : "write", mem_name(type),
                             static_cast<unsigned long long>(rrun_),
                             static_cast<unsigned long long>(off),
                             static_cast<unsigned long long>(slot_bytes_), npeers))
            .status();
    }

    Status verify_check_rev(Op op, MemType type, int npeers) {
        if (!o_.verify) return Status();
        const uint64_t off = static_cast<uint64_t>(conc_) * slot_bytes_;
        const std::string what =
            strformat("the targets' %s of %s (batch %d, %s memory, --bidir), last transfer",
                      op_name(op), format_bytes(size_).c_str(), o_.batch, mem_name(type));
        if (op == Op::kRead) {
            auto reply = peer_->call(strformat(
                "check %s %llu %llu %llu %d rev", mem_name(type),
                static_cast<unsigned long long>(rrun_), static_cast<unsigned long long>(off),
                static_cast<unsigned long long>(slot_bytes_), npeers));
            if (reply.ok()) return Status();
            return internal_error("VERIFICATION FAILED: " + what + ": " +
                                  std::string(reply.status().message()));
        }
        for (int i = 0; i < npeers; ++i) {
            Status st = check_bytes(peers_[static_cast<size_t>(i)].rev[type].buf, off, slot_bytes_,
                                    pattern_seed(rrun_, i), "from target " + std::to_string(i));
            if (!st.ok() && st.code() != StatusCode::kInternal) return st;
            if (!st.ok()) {
                return internal_error("VERIFICATION FAILED: " + what + ", " +
                                      std::string(st.message()));
            }
        }
        return Status();
    }

    // --verify: before a measurement, its last transfer's source gets this measurement's
    // pattern and its destination is poisoned; after it, the destination must hold the pattern.
    Status verify_prep(Op op, MemType type, int npeers) {
        if (!o_.verify) return Status();
        ++run_;
        const uint64_t off = static_cast<uint64_t>(conc_) * slot_bytes_;
        for (int i = 0; i < npeers; ++i) {
            TCPX_RETURN_IF_ERROR(prepare_bytes(peers_[static_cast<size_t>(i)].local[type].buf, off,
                                               slot_bytes_, op == Op::kWrite,
                                               pattern_seed(run_, i)));
        }
        return peer_
            ->call(strformat("prep %s %s %llu %llu %llu %d", op == Op::kWrite ? "write" : "read",
                             mem_name(type), static_cast<unsigned long long>(run_),
                             static_cast<unsigned long long>(off),
                             static_cast<unsigned long long>(slot_bytes_), npeers))
            .status();
    }

    Status verify_check(Op op, MemType type, int npeers) {
        if (!o_.verify) return Status();
        const uint64_t off = static_cast<uint64_t>(conc_) * slot_bytes_;
        const std::string what =
            strformat("%s of %s (batch %d, %s memory), last transfer", op_name(op),
                      format_bytes(size_).c_str(), o_.batch, mem_name(type));
        if (op == Op::kWrite) {
            auto reply = peer_->call(strformat(
                "check %s %llu %llu %llu %d", mem_name(type), static_cast<unsigned long long>(run_),
                static_cast<unsigned long long>(off), static_cast<unsigned long long>(slot_bytes_),
                npeers));
            if (reply.ok()) return Status();
            // The target's message (after "peer: INTERNAL: ") says where.
            std::string why(reply.status().message());
            const size_t at = why.find("target ");
            if (at != std::string::npos) why = why.substr(at);
            return internal_error("VERIFICATION FAILED: " + what + ", in " + why);
        }
        for (int i = 0; i < npeers; ++i) {
            Status st =
                check_bytes(peers_[static_cast<size_t>(i)].local[type].buf, off, slot_bytes_,
                            pattern_seed(run_, i), "from target " + std::to_string(i));
            if (!st.ok() && st.code() != StatusCode::kInternal) return st;  // not the bytes
            if (!st.ok()) {
                return internal_error("VERIFICATION FAILED: " + what + ", " +
                                      std::string(st.message()));
            }
        }
        return Status();
    }

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

Status check_options(const EngineBenchOptions& o) {
    if (o.kv) {
        if (o.peers != 1) return invalid_argument("--kv: one peer (--peers 1)");
        if (o.batch != 1) return invalid_argument("--kv: a request is its own batch (no --batch)");
        TCPX_RETURN_IF_ERROR(check_kv_shape(o.kv_shape));
    }
    if (o.sizes.empty()) return invalid_argument("no sizes");
    for (uint64_t s : o.sizes) {
        if (s == 0) return invalid_argument("--sizes: a size of 0");
    }
    if (!o.write && !o.read) return invalid_argument("no operation to measure");
    if (o.processes != 1 && o.processes != 2) return invalid_argument("--procs must be 1 or 2");
    if (o.batch < 1) return invalid_argument("--batch must be at least 1");
    if (o.concurrency < 1) return invalid_argument("--concurrency must be at least 1");
    if (o.peers < 1) return invalid_argument("--peers must be at least 1");
    if (!o.listen.empty()) return invalid_argument("--listen: the target runs listen_engine_bench");
    if (!o.connect.empty() && o.processes != 2) {
        return invalid_argument("--connect: the targets are on the other host; no --procs");
    }
    if (o.kv && (o.bidir || o.pairs)) {
        return invalid_argument("--kv: one direction, one peer (no --bidir, --pairs, --gpus all)");
    }
    if (o.per_gpu && o.mem != MemType::kVram) {
        return invalid_argument("--gpus all: one endpoint pair per GPU, with --mem vram");
    }
    if (o.pairs && !o.per_gpu && o.mem == MemType::kVram) {
        return invalid_argument(
            "--pairs: host memory; for GPU memory, --gpus all (a pair per GPU)");
    }
    if (!o.gpus.empty()) {
        if (o.mem != MemType::kVram) return invalid_argument("--gpus applies to --mem vram only");
        if (o.gpus.size() != 2) return invalid_argument("--gpus takes two GPU indices: A,B");
        for (int g : o.gpus) {
            if (g < 0) return invalid_argument("--gpus: a GPU index below 0");
        }
    }
    return Status();
}

// --mem vram: fails unless GPUs can be used, refuses GPUs that do not exist, and picks the
// default pair when --gpus was not given (two GPUs when there are, so that the copies of both
// sides do not share one).
Status choose_gpus(EngineBenchOptions* o) {
    if (o->mem != MemType::kVram) return Status();
    StatusOr<int> n = usable_gpus();
    if (!n.ok()) return Status(n.status()).with_context(o->per_gpu ? "--gpus all" : "--mem vram");
    if (o->per_gpu) {
        o->peers = *n;  // pair i on GPU i of both sides
        return Status();
    }
    if (o->gpus.empty()) o->gpus = *n >= 2 ? std::vector<int>{0, 1} : std::vector<int>{0, 0};
    for (int g : o->gpus) {
        if (g >= *n) {
            return invalid_argument(strformat("--gpus %d,%d: there is no GPU %d (%d usable)",
                                              o->gpus[0], o->gpus[1], g, *n));
        }
    }
    return Status();
}

std::vector<std::string> serve_args(const EngineBenchOptions& o) {
    std::vector<std::string> args = {"bench", "engine", "--serve", "--interface", o.interface};
    auto add = [&](const char* flag, const std::string& v) {
        if (v.empty()) return;
        args.push_back(flag);
        args.push_back(v);
    };
    add("--channels", o.channels);
    add("--nsocks", o.nsocks);
    add("--chunk", o.chunk);
    add("--window", o.window);
    add("--mem", mem_name(o.mem));
    if (o.gpus.size() == 2) add("--gpus", strformat("%d,%d", o.gpus[0], o.gpus[1]));
    if (o.bidir) args.push_back("--bidir");
    return args;
}

// --- the side channel (--listen / --connect)
// ------------------------------------------------------
//
// The same command lines as the child's pipes, over one TCP connection. The initiator speaks
// first: "hello tcpx-p2p-bench-engine 1 <key>=<value>...", the target settings the target's
// command line would carry in the child (serve_args); the target answers "hello
// tcpx-p2p-bench-engine 1 <what its engine runs>", or "error ..." and closes. Plaintext and
// unauthenticated: the engine's own handshake (TCPX_P2P_AUTH_SECRET) guards the data endpoints.

constexpr const char* kHello = "hello tcpx-p2p-bench-engine 1";

std::string hello_line(const EngineBenchOptions& o) {
    return greeting_line(
        kHello, {{"mem", mem_name(o.mem)},
                 {"gpus", o.gpus.size() == 2 ? strformat("%d,%d", o.gpus[0], o.gpus[1]) : ""},
                 {"channels", o.channels},
                 {"nsocks", o.nsocks},
                 {"chunk", o.chunk},
                 {"window", o.window},
                 {"bidir", o.bidir ? "1" : "0"},
                 {"time", strformat("%g", o.min_seconds)}});
}

// The target's options from a hello line (its own --interface stays).
Status parse_hello(const std::string& line, EngineBenchOptions* o) {
    TCPX_ASSIGN_OR_RETURN(auto settings, greeting_settings(line, kHello, "tcpx-p2p bench engine"));
    for (const auto& [key, value] : settings) {
        if (key == "mem") {
            if (!parse_mem(value, &o->mem)) return invalid_argument("hello: bad mem");
        } else if (key == "gpus") {
            if (!parse_gpu_pair(value, &o->gpus)) return invalid_argument("hello: bad gpus");
        } else if (key == "channels") {
            o->channels = value;
        } else if (key == "nsocks") {
            o->nsocks = value;
        } else if (key == "chunk") {
            o->chunk = value;
        } else if (key == "window") {
            o->window = value;
        } else if (key == "bidir" && (value == "0" || value == "1")) {
            o->bidir = value == "1";
        } else if (key == "time") {
            char* end = nullptr;
            o->min_seconds = std::strtod(value.c_str(), &end);
            if (end == value.c_str() || *end != '\0' || !(o->min_seconds > 0) ||
                o->min_seconds > 600) {
                return invalid_argument("hello: bad time");
            }
        } else {
            return invalid_argument("hello: unknown '" + (key + "=" + value).substr(0, 64) + "'");
        }
    }
    return Status();
}

// The engine's settings as a line for the other side's header.
std::string engine_summary(const Config& c) {
    if (!c.net_plugin.empty()) {
        return strformat("%lld channel%s, ncclNet plugin %s", static_cast<long long>(c.channels),
                         c.channels == 1 ? "" : "s", c.net_plugin.c_str());
    }
    return strformat("%lld channel%s x %lld data sockets, %s", static_cast<long long>(c.channels),
                     c.channels == 1 ? "" : "s", static_cast<long long>(c.nsocks),
                     io_threads_phrase(io_threads_per_endpoint(c)).c_str());
}

// --connect: the side channel to the targets, greeted; with no --interface, the interface that
// reaches them.
StatusOr<std::unique_ptr<Peer>> connect_targets(EngineBenchOptions* o, std::string* target) {
    TCPX_ASSIGN_OR_RETURN(auto peer, connect_to_target(o->connect, o->connect_timeout,
                                                       reply_timeout_ms(o->min_seconds)));
    if (o->interface.empty()) {
        StatusOr<std::string> name = interface_of(peer->local());
        if (!name.ok()) {
            return Status(name.status()).with_context("--connect without --interface");
        }
        o->interface = "=" + *name;
    }
    TCPX_ASSIGN_OR_RETURN(std::string said, greet_target(peer.get(), kHello, hello_line(*o),
                                                         "tcpx-p2p bench engine", o->connect));
    *target = o->connect + ": " + said;
    return std::unique_ptr<Peer>(std::move(peer));
}

// --- the sweep ---------------------------------------------------------------------------------

std::vector<Op> ops_of(const EngineBenchOptions& o) {
    std::vector<Op> ops;
    if (o.write) ops.push_back(Op::kWrite);
    if (o.read) ops.push_back(Op::kRead);
    return ops;
}

Calibration calibration_of(const EngineBenchOptions& o) {
    Calibration cal;
    cal.min_seconds = o.min_seconds;
    cal.min_iters = static_cast<uint64_t>(o.min_iters);
    return cal;
}

// --kv: every memory and op, the KV requests and the contiguous transfer of the same bytes.
StatusOr<std::vector<KvRow>> sweep_kv(const EngineBenchOptions& o, EngineInitiator* init) {
    TCPX_RETURN_IF_ERROR(init->prepare_kv().with_context("--kv: the pools"));
    const std::vector<Op> ops = ops_of(o);
    std::vector<MemType> mems = {o.mem};
    if (host_figures(o)) mems.push_back(MemType::kHost);
    Progress progress(o.progress && !o.json, mems.size() * ops.size() * 2);
    Sweep sweep(calibration_of(o), &progress, [init] { return init->cpu_seconds(); });
    const uint64_t bytes = o.kv_shape.request_bytes();
    std::vector<KvRow> rows;
    for (MemType mem : mems) {
        for (Op op : ops) {
            KvRow row;
            row.op = op_name(op);
            row.mem = mem_name(mem);
            for (bool contiguous : {false, true}) {
                const std::string what = strformat("%s, %s memory, %s", op_name(op), mem_name(mem),
                                                   contiguous ? "contiguous" : "KV requests");
                Throughput& out = contiguous ? row.contiguous : row.kv;
                TCPX_ASSIGN_OR_RETURN(out, sweep.throughput(what, bytes, [&](uint64_t n) {
                    return init->kv_transfers(op, mem, contiguous, n);
                }));
                TCPX_RETURN_IF_ERROR(init->verify_kv(op, mem, contiguous));
            }
            row.verified = o.verify;
            rows.push_back(row);
        }
    }
    progress.clear();
    return rows;
}

// Every size and op: the engine's throughput (the host figures, one peer, raw TCP beside it)
// and its latency (host, raw ping-pong beside it), as the options ask.
StatusOr<std::vector<Row>> sweep_sizes(const EngineBenchOptions& o, EngineInitiator* init) {
    const std::vector<Op> ops = ops_of(o);
    const bool single = o.peers > 1 && o.single_peer;
    const bool host = host_figures(o);
    const size_t per_op = 1 + (host ? 1 : 0) + (single ? 1 : 0) + (o.baseline ? 1 : 0) +
                          (o.latency ? 1 + (host ? 1 : 0) + (o.baseline ? 1 : 0) : 0);
    Progress progress(o.progress && !o.json, o.sizes.size() * ops.size() * per_op);
    Sweep sweep(calibration_of(o), &progress, [init] { return init->cpu_seconds(); });
    const std::string ours_what = strformat("engine (%s)", mem_name(o.mem));
    std::vector<Row> rows;
    for (uint64_t size : o.sizes) {
        TCPX_RETURN_IF_ERROR(init->prepare(size).with_context(format_bytes(size)));
        // At least one transfer per slot in flight.
        const uint64_t min_iters = std::max<uint64_t>(static_cast<uint64_t>(o.min_iters),
                                                      static_cast<uint64_t>(init->concurrency()));
        const uint64_t bytes = init->slot_bytes();
        // --bidir: the same again in the other direction.
        const uint64_t dirs = o.bidir ? 2 : 1;
        const uint64_t all_bytes = bytes * static_cast<uint64_t>(o.peers) * dirs;
        auto throughput = [&](const std::string& what, uint64_t n_bytes, Throughput* out,
                              const TimedRun& fn) -> Status {
            TCPX_ASSIGN_OR_RETURN(*out, sweep.throughput(what, n_bytes, fn, min_iters));
            return Status();
        };
        auto latency = [&](const std::string& what, Latency* out, const SampledRun& fn) -> Status {
            TCPX_ASSIGN_OR_RETURN(*out, sweep.latency(what, fn));
            return Status();
        };
        for (Op op : ops) {
            Row row;
            row.op = op;
            row.size = size;
            row.concurrency = init->concurrency();
            const std::string what = std::string(op_name(op)) + " " + format_bytes(size);
            TCPX_RETURN_IF_ERROR(
                throughput(what + ": " + ours_what + ", throughput", all_bytes, &row.ours,
                           [&](uint64_t n) { return init->transfers(op, o.mem, o.peers, n); }));
            split_directions(init->last().fwd, bytes, row.ours.iters, &row.fwd, &row.per_peer);
            split_directions(init->last().rev, bytes, row.ours.iters, &row.rev, &row.per_peer_rev);
            if (host) {
                TCPX_RETURN_IF_ERROR(throughput(
                    what + ": engine (host), throughput", all_bytes, &row.host,
                    [&](uint64_t n) { return init->transfers(op, MemType::kHost, o.peers, n); }));
            }
            if (single) {
                TCPX_RETURN_IF_ERROR(throughput(
                    what + ": " + ours_what + ", one peer, throughput", bytes * dirs, &row.single,
                    [&](uint64_t n) { return init->transfers(op, o.mem, 1, n); }));
            }
            if (o.baseline) {
                TCPX_RETURN_IF_ERROR(
                    throughput(what + ": raw TCP, throughput", bytes, &row.raw,
                               [&](uint64_t n) { return init->raw_stream(op, n); }));
            }
            if (o.latency) {
                TCPX_RETURN_IF_ERROR(
                    latency(what + ": " + ours_what + ", one at a time", &row.ours_lat,
                            [&](uint64_t n) { return init->single_transfers(op, o.mem, n); }));
                if (host) {
                    TCPX_RETURN_IF_ERROR(latency(
                        what + ": engine (host), one at a time", &row.host_lat,
                        [&](uint64_t n) { return init->single_transfers(op, MemType::kHost, n); }));
                }
                if (o.baseline) {
                    TCPX_RETURN_IF_ERROR(
                        latency(what + ": raw TCP, ping-pong", &row.raw_lat,
                                [&](uint64_t n) { return init->raw_pingpong(op, n); }));
                }
            }
            rows.push_back(row);
        }
    }
    progress.clear();
    return rows;
}

// --stats: both sides' counters. A served read is counted when its last send completes, a
// moment after the reader has its bytes (docs/engine.md): wait (briefly) until each side has
// served what the other completed.
StatusOr<std::pair<Stats, Stats>> settled_stats(EngineInitiator* init) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
    while (true) {
        TCPX_ASSIGN_OR_RETURN(Stats theirs, init->target_stats());
        const Stats ours = init->own_stats();
        const bool settled = theirs.requests_served >= ours.transfers_completed &&
                             ours.requests_served >= theirs.transfers_completed;
        if (settled || std::chrono::steady_clock::now() > deadline) return std::pair(ours, theirs);
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
}

Status run(const EngineBenchOptions& options) {
    EngineBenchOptions o = options;
    // --kv: the contiguous transfer of the same bytes is the baseline.
    if (o.kv) o.baseline = false;
    TCPX_RETURN_IF_ERROR(check_options(o));
    TCPX_RETURN_IF_ERROR(choose_gpus(&o));
    Setup setup;
    std::unique_ptr<Peer> peer;
    if (!o.connect.empty()) {
        TCPX_ASSIGN_OR_RETURN(peer, connect_targets(&o, &setup.target));
    }
    TCPX_ASSIGN_OR_RETURN(Config config, bench_config(o, kInitiatorSide));
    // The emulated TCPX plugin without a wire (tests/fakes) connects comms inside one process
    // only: with targets in a child every transfer would stall until the timeout.
    const char* no_wire = std::getenv("FAKETCPX_NO_WIRE");
    if (o.processes == 2 && !config.net_plugin.empty() && no_wire != nullptr &&
        std::string(no_wire) == "1") {
        return invalid_argument(
            "FAKETCPX_NO_WIRE=1: the emulated plugin without a wire needs both ends in one "
            "process; use --procs 1");
    }
    if (peer) {
        // connected already (--connect)
    } else if (o.processes == 2) {
        TCPX_ASSIGN_OR_RETURN(peer, ProcessPeer::spawn(serve_args(o)));
    } else {
        TCPX_ASSIGN_OR_RETURN(Config target_config, bench_config(o, kTargetSide));
        peer = std::make_unique<ThreadPeer>([target_config, &o](Channel* ch) {
            (void)serve_targets(target_config, o.interface, o.bidir, ch);
        });
    }
    setup.io_threads = io_threads_per_endpoint(config);
    std::vector<Row> rows;
    std::vector<KvRow> kv_rows;
    std::optional<std::pair<Stats, Stats>> counters;  // --stats: ours, the targets'
    {
        EngineInitiator init(o, config, peer.get());
        TCPX_RETURN_IF_ERROR(init.setup().with_context("setting up"));
        // The header says what ran: the channels both sides use, the raw streams matching them.
        config.channels = init.channels();
        setup.raw_streams = init.raw_streams();
        if (o.kv) {
            TCPX_ASSIGN_OR_RETURN(kv_rows, sweep_kv(o, &init));
        } else {
            TCPX_ASSIGN_OR_RETURN(rows, sweep_sizes(o, &init));
        }
        if (o.stats) {
            TCPX_ASSIGN_OR_RETURN(counters, settled_stats(&init));
        }
    }

    if (o.kv) {
        if (o.json) {
            print_kv_json(o, config, kv_rows);
        } else {
            print_kv_table(o, config, setup, kv_rows);
        }
    } else if (o.json) {
        print_json(o, config, setup, rows);
    } else {
        print_table(o, config, setup, rows);
    }
    if (counters) print_stats(o, counters->first, counters->second);
    return Status();
}

}  // namespace

int run_engine_bench(const EngineBenchOptions& options) {
    ::signal(SIGPIPE, SIG_IGN);
    Status st = run(options);
    if (!st.ok()) {
        std::fprintf(stderr, "tcpx-p2p bench engine: %s\n", st.to_string().c_str());
        return 1;
    }
    return 0;
}

int serve_engine_bench(const EngineBenchOptions& options) {
    ::signal(SIGPIPE, SIG_IGN);
    FdChannel channel(STDIN_FILENO, STDOUT_FILENO);
    auto config = bench_config(options, kTargetSide);
    if (!config.ok()) {
        // Every command fails with the reason; the initiator reports it.
        refuse_commands(&channel, config.status());
        return 1;
    }
    Status st = serve_targets(*config, options.interface, options.bidir, &channel);
    return st.ok() ? 0 : 1;
}

namespace {

// --listen: waits for an initiator that greets us correctly (a stray connection that does not is
// answered "error ..." and closed) and serves it. OK when it said quit.
Status listen_and_serve(const EngineBenchOptions& options) {
    if (!options.connect.empty()) return invalid_argument("--listen and --connect: pick one role");
    if (options.processes != 2) {
        return invalid_argument("--listen: the target side of two hosts; no --procs");
    }
    EngineBenchOptions o = options;
    TCPX_ASSIGN_OR_RETURN(Fd listener,
                          listen_side_channel("tcpx-p2p bench engine", options.listen));
    TCPX_ASSIGN_OR_RETURN(SideChannel side, accept_initiator("tcpx-p2p bench engine", listener,
                                                             [&](const std::string& line) {
                                                                 o = options;
                                                                 return parse_hello(line, &o);
                                                             }));
    FdChannel& ch = *side.channel;
    Status st;
    if (o.interface.empty()) {
        TCPX_ASSIGN_OR_RETURN(SocketAddress local, local_address(side.fd.get()));
        StatusOr<std::string> name = interface_of(local);
        if (!name.ok()) {
            st = Status(name.status()).with_context("--listen without --interface");
            ch.write_line("error " + st.to_string());
            return st;
        }
        o.interface = "=" + *name;
    }
    StatusOr<Config> config = bench_config(o, kTargetSide);
    if (!config.ok()) {
        st = Status(config.status()).with_context("target");
        ch.write_line("error " + st.to_string());
        return st;
    }
    std::fprintf(stderr, "tcpx-p2p bench engine: serving %s on %s\n", side.who.c_str(),
                 o.interface.c_str());
    if (!ch.write_line(std::string(kHello) + " " + o.interface + ", " + engine_summary(*config))) {
        return unavailable("initiator " + side.who + " went away");
    }
    ch.set_timeout(reply_timeout_ms(o.min_seconds));
    return serve_targets(*config, o.interface, o.bidir, &ch).with_context("initiator " + side.who);
}

}  // namespace

int listen_engine_bench(const EngineBenchOptions& options) {
    ::signal(SIGPIPE, SIG_IGN);
    Status st = listen_and_serve(options);
    if (!st.ok()) {
        std::fprintf(stderr, "tcpx-p2p bench engine: %s\n", st.to_string().c_str());
        return 1;
    }
    std::fprintf(stderr, "tcpx-p2p bench engine: the initiator is done\n");
    return 0;
}

}  // namespace tcpx::bench
