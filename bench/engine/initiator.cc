#include "bench/engine/initiator.h"

#include <algorithm>
#include <charconv>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include "bench/harness/report.h"
#include "bench/kv_workload.h"
#include "common/status_util.h"
#include "common/strings.h"

namespace tcpx::bench::engine_bench {

StatusOr<Stats> EngineInitiator::target_stats() {
    TCPX_ASSIGN_OR_RETURN(std::string reply, peer_->call("stats"));
    return parse_stats_line(reply);
}

Status EngineInitiator::setup() {
    const int ours = o_.pairs ? o_.peers : 1;
    for (int i = 0; i < ours; ++i) {
        Config c = config_;
        if (o_.per_gpu) c.gpu_index = i;
        TCPX_ASSIGN_OR_RETURN(auto ep, Endpoint::create(c, "bench-initiator-" + std::to_string(i)));
        eps_.push_back(std::move(ep));
        gpus_.push_back(static_cast<int>(c.gpu_index));
    }
    TCPX_ASSIGN_OR_RETURN(std::string reply, peer_->call("endpoints " + std::to_string(o_.peers) +
                                                         (o_.per_gpu ? " pergpu" : "")));
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
            return Status(id.status()).with_context("connecting to target " + std::to_string(i));
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

Status EngineInitiator::prepare(uint64_t size) {
    // Memory per side and type: a region of conc + 1 slots per peer (two with --bidir) and, in
    // host memory, the raw baseline's conc slots; all of it within kSideBytes. Each product is
    // checked: one that wrapped would make a small (or zero) figure of a huge one.
    const uint64_t peers = static_cast<uint64_t>(o_.peers);
    const uint64_t sets = o_.bidir ? 2 : 1;  // --bidir: a region per direction
    uint64_t slot = 0;
    uint64_t per_slot = 0;
    if (size == 0 || __builtin_mul_overflow(size, static_cast<uint64_t>(o_.batch), &slot) ||
        __builtin_mul_overflow(slot, peers, &per_slot)) {
        return invalid_argument(strformat("%llu bytes x --batch %d x %d peers is out of range",
                                          static_cast<unsigned long long>(size), o_.batch,
                                          o_.peers));
    }
    const int conc =
        static_cast<int>(std::min<uint64_t>(static_cast<uint64_t>(o_.concurrency),
                                            std::max<uint64_t>(1, kMaxInFlightBytes / per_slot)));
    const uint64_t raw = o_.baseline ? slot * static_cast<uint64_t>(conc) : 0;
    uint64_t region = 0;
    uint64_t regions = 0;
    uint64_t side = 0;
    if (__builtin_mul_overflow(slot, static_cast<uint64_t>(conc) + 1, &region) ||
        __builtin_mul_overflow(region, peers * sets, &regions) ||
        __builtin_add_overflow(regions, raw, &side) || side > kSideBytes) {
        return invalid_argument(strformat(
            "%s x --batch %d needs more than %s of memory per side (%d peer%s x %d transfer%s in "
            "flight + 1%s%s)",
            format_bytes(size).c_str(), o_.batch, format_bytes(kSideBytes).c_str(), o_.peers,
            plural(o_.peers), conc, plural(conc), o_.bidir ? ", both directions" : "",
            o_.baseline ? ", and the raw TCP baseline's buffer" : ""));
    }
    size_ = size;
    slot_bytes_ = slot;
    conc_ = conc;
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
            TCPX_RETURN_IF_ERROR(
                ensure_region(ep(p), &p.rev[type], type, gpu(p), region).with_context("initiator"));
            TCPX_ASSIGN_OR_RETURN(RemoteMem d, ep(p)->describe(p.rev[type].mem));
            rmem += " " + hex_blob(d.serialize());
        }
        TCPX_RETURN_IF_ERROR(peer_->call(rmem).status());
    }
    return Status();
}

StatusOr<double> EngineInitiator::transfers(Op op, MemType type, int npeers, uint64_t count) {
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
        // The targets' answer comes when their transfers are done (or failed). Without progress
        // threads their transfers to and from our memory move only while we call in: poll our
        // endpoints until it comes, as a NIXL agent without one polls.
        if (config_.progress_thread == "off") {
            while (!peer_->channel()->wait_input(0)) {
                for (const auto& e : eps_) (void)e->get_notifications();
            }
        }
        StatusOr<std::string> reply = peer_->reply();
        if (!fwd.ok()) return fwd.status();
        if (!reply.ok()) return Status(reply.status()).with_context("the targets' transfers");
        const auto w = words(*reply);
        if (w.size() != static_cast<size_t>(npeers) + 1 || w[0] != "secs") {
            return protocol_error("peer: " + *reply);
        }
        for (size_t i = 1; i < w.size(); ++i) {
            double v = 0;
            if (!parse_seconds(w[i], &v)) return protocol_error("peer: " + reply->substr(0, 200));
            last_.rev.push_back(v);
        }
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

StatusOr<std::vector<double>> EngineInitiator::single_transfers(Op op, MemType type,
                                                                uint64_t count) {
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

StatusOr<double> EngineInitiator::raw_stream(Op op, uint64_t count) {
    const uint64_t slots = static_cast<uint64_t>(conc_);
    return raw_.stream(peer_, op == Op::kWrite, slot_bytes_, count, raw_buffer(slot_bytes_ * slots),
                       slots, slots);
}

StatusOr<std::vector<double>> EngineInitiator::raw_pingpong(Op op, uint64_t count) {
    const uint64_t out = op == Op::kWrite ? slot_bytes_ : kSmallMessage;
    const uint64_t back = op == Op::kWrite ? kSmallMessage : slot_bytes_;
    return raw_.pingpong(peer_, out, back, count, raw_buffer(std::max(out, back)));
}

Status EngineInitiator::prepare_kv() {
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
                iov.push_back(
                    IoVec{p.local[type].mem, local[i], p.remote[type], remote[i], k.block_bytes()});
            }
        }
    }
    return Status();
}

StatusOr<double> EngineInitiator::kv_transfers(Op op, MemType type, bool contiguous,
                                               uint64_t count) {
    const auto start = Clock::now();
    for (uint64_t n = 0; n < count; ++n) {
        TCPX_ASSIGN_OR_RETURN(XferId id,
                              post_kv(op, type, contiguous, static_cast<int>(n % kKvRequests)));
        Status st = ep(peers_[0])->wait(id, kStallTimeout);
        if (!st.ok()) return st.with_context(kv_what(op, type, contiguous));
    }
    return seconds_since(start);
}

Status EngineInitiator::verify_kv(Op op, MemType type, bool contiguous) {
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
        TCPX_RETURN_IF_ERROR(contiguous ? prepare_bytes(local, 0, total, true, pattern_seed(run, 0))
                                        : kv_fill(local, k, offsets, run));
        TCPX_RETURN_IF_ERROR(peer_
                                 ->call(strformat("prep write %s %llu 0 %llu 1", mem, ull(run),
                                                  ull(contiguous ? total : k.pool)))
                                 .status());
    } else {
        TCPX_RETURN_IF_ERROR(peer_
                                 ->call(contiguous ? strformat("prep read %s %llu 0 %llu 1", mem,
                                                               ull(run), ull(total))
                                                   : strformat("kvfill %s %llu 0", mem, ull(run)))
                                 .status());
        TCPX_RETURN_IF_ERROR(prepare_bytes(local, 0, contiguous ? total : k.pool, false, 0));
    }
    TCPX_ASSIGN_OR_RETURN(XferId id, post_kv(op, type, contiguous, 0));
    TCPX_RETURN_IF_ERROR(ep(peers_[0])->wait(id, kStallTimeout).with_context(what));
    Status st;
    if (op == Op::kWrite) {
        st = peer_
                 ->call(contiguous ? strformat("check %s %llu 0 %llu 1", mem, ull(run), ull(total))
                                   : strformat("kvcheck %s %llu 0", mem, ull(run)))
                 .status();
    } else {
        st = contiguous ? check_bytes(local, 0, total, pattern_seed(run, 0), "initiator")
                        : kv_check(local, k, offsets, run, "initiator");
    }
    if (!st.ok()) return internal_error("VERIFICATION FAILED: " + what + ": " + st.to_string());
    return Status();
}

std::string EngineInitiator::kv_what(Op op, MemType type, bool contiguous) const {
    return strformat("%s of a KV request (%s memory%s)", op_name(op), mem_name(type),
                     contiguous ? ", contiguous" : "");
}

StatusOr<XferId> EngineInitiator::post_kv(Op op, MemType type, bool contiguous, int request) {
    PeerState& ps = peers_[0];
    Endpoint* e = ep(ps);
    StatusOr<XferId> id = Status(StatusCode::kInternal, "not posted");
    if (contiguous) {
        const uint64_t total = o_.kv_shape.request_bytes();
        id = op == Op::kWrite ? e->write(ps.id, ps.local[type].mem, 0, ps.remote[type], 0, total)
                              : e->read(ps.id, ps.local[type].mem, 0, ps.remote[type], 0, total);
    } else {
        const auto& iov = kv_iov_[type][static_cast<size_t>(request)];
        id = op == Op::kWrite ? e->writev(ps.id, iov) : e->readv(ps.id, iov);
    }
    if (!id.ok()) return Status(id.status()).with_context(kv_what(op, type, contiguous));
    return id;
}

Shape EngineInitiator::shape(Op op) const {
    Shape s;
    s.op = op;
    s.size = size_;
    s.batch = o_.batch;
    s.conc = conc_;
    return s;
}

uint8_t* EngineInitiator::raw_buffer(uint64_t bytes) {
    if (raw_mem_.size() < bytes) raw_mem_.resize(bytes);
    return raw_mem_.data();
}

StatusOr<XferId> EngineInitiator::post(Op op, MemType type, size_t p, int slot) {
    PeerState& ps = peers_[p];
    StatusOr<XferId> id =
        post_lane(Lane{ep(ps), ps.id, ps.local[type].mem, ps.remote[type]}, shape(op), slot, &iov_);
    if (!id.ok()) {
        return Status(id.status())
            .with_context(strformat("posting a %s to target %zu", op_name(op), p));
    }
    return id;
}

Status EngineInitiator::verify_prep_rev(Op op, MemType type, int npeers) {
    if (!o_.verify) return Status();
    rrun_ = run_ | (1ULL << 63);  // apart from the forward direction's run numbers
    const uint64_t off = static_cast<uint64_t>(conc_) * slot_bytes_;
    for (int i = 0; i < npeers; ++i) {
        TCPX_RETURN_IF_ERROR(prepare_bytes(peers_[static_cast<size_t>(i)].rev[type].buf, off,
                                           slot_bytes_, op == Op::kRead, pattern_seed(rrun_, i)));
    }
    // "prep read" patterns, "prep write" poisons: the target is the source of its WRITEs.
    return peer_
        ->call(strformat("prep %s %s %llu %llu %llu %d rev", op == Op::kWrite ? "read" : "write",
                         mem_name(type), static_cast<unsigned long long>(rrun_),
                         static_cast<unsigned long long>(off),
                         static_cast<unsigned long long>(slot_bytes_), npeers))
        .status();
}

Status EngineInitiator::verify_check_rev(Op op, MemType type, int npeers) {
    if (!o_.verify) return Status();
    const uint64_t off = static_cast<uint64_t>(conc_) * slot_bytes_;
    const std::string what =
        strformat("the targets' %s of %s (batch %d, %s memory, --bidir), last transfer",
                  op_name(op), format_bytes(size_).c_str(), o_.batch, mem_name(type));
    if (op == Op::kRead) {
        auto reply = peer_->call(strformat("check %s %llu %llu %llu %d rev", mem_name(type),
                                           static_cast<unsigned long long>(rrun_),
                                           static_cast<unsigned long long>(off),
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

Status EngineInitiator::verify_prep(Op op, MemType type, int npeers) {
    if (!o_.verify) return Status();
    ++run_;
    const uint64_t off = static_cast<uint64_t>(conc_) * slot_bytes_;
    for (int i = 0; i < npeers; ++i) {
        TCPX_RETURN_IF_ERROR(prepare_bytes(peers_[static_cast<size_t>(i)].local[type].buf, off,
                                           slot_bytes_, op == Op::kWrite, pattern_seed(run_, i)));
    }
    return peer_
        ->call(strformat("prep %s %s %llu %llu %llu %d", op == Op::kWrite ? "write" : "read",
                         mem_name(type), static_cast<unsigned long long>(run_),
                         static_cast<unsigned long long>(off),
                         static_cast<unsigned long long>(slot_bytes_), npeers))
        .status();
}

Status EngineInitiator::verify_check(Op op, MemType type, int npeers) {
    if (!o_.verify) return Status();
    const uint64_t off = static_cast<uint64_t>(conc_) * slot_bytes_;
    const std::string what = strformat("%s of %s (batch %d, %s memory), last transfer", op_name(op),
                                       format_bytes(size_).c_str(), o_.batch, mem_name(type));
    if (op == Op::kWrite) {
        auto reply = peer_->call(strformat("check %s %llu %llu %llu %d", mem_name(type),
                                           static_cast<unsigned long long>(run_),
                                           static_cast<unsigned long long>(off),
                                           static_cast<unsigned long long>(slot_bytes_), npeers));
        if (reply.ok()) return Status();
        // The target's message (after "peer: INTERNAL: ") says where. Only that is a failed
        // verification: a target gone, or a check it refused, is reported as what it is.
        std::string why(reply.status().message());
        if (why.rfind("peer: INTERNAL: ", 0) != 0) return reply.status();
        const size_t at = why.find("target ");
        if (at != std::string::npos) why = why.substr(at);
        return internal_error("VERIFICATION FAILED: " + what + ", in " + why);
    }
    for (int i = 0; i < npeers; ++i) {
        Status st = check_bytes(peers_[static_cast<size_t>(i)].local[type].buf, off, slot_bytes_,
                                pattern_seed(run_, i), "from target " + std::to_string(i));
        if (!st.ok() && st.code() != StatusCode::kInternal) return st;  // not the bytes
        if (!st.ok()) {
            return internal_error("VERIFICATION FAILED: " + what + ", " +
                                  std::string(st.message()));
        }
    }
    return Status();
}
}  // namespace tcpx::bench::engine_bench
