// The engine's transfers: registration, posting, completion (the data channels are in
// engine_channels.cc, the control messages that drive transfers in engine_dispatch.cc).
#include <algorithm>
#include <cstring>
#include <thread>

#include "common/log.h"
#include "common/status_util.h"
#include "common/strings.h"
#include "engine/ctrl_wire.h"
#include "engine/engine.h"
#include "engine/reg_windows.h"

namespace tcpx {

using engine::Clock;
using engine::Op;
using engine::Region;
namespace wire = engine::wire;

// --- memory
// ----------------------------------------------------------------------------------------

StatusOr<MemId> Endpoint::Impl::reg(void* ptr, size_t len) {
    // GPU memory is recognised by its address; a registration must lie within one allocation.
    auto info = cuda::classify(ptr, len);
    if (!info.ok()) return Status(info.status()).with_context("reg");
    auto lock = api_lock();
    TCPX_ASSIGN_OR_RETURN(Region * r, registry_.add(ptr, len, info->kind, info->device));
    return r->id;
}

// Whether one of the transfer's pieces lies in `r` (compared, never dereferenced).
static bool uses_region(const engine::Xfer& x, const engine::Region* r) {
    return std::any_of(x.pieces.begin(), x.pieces.end(),
                       [&](const engine::Xfer::Piece& piece) { return piece.region == r; });
}

Status Endpoint::Impl::dereg(MemId mem) {
    Region* dying = nullptr;
    {
        auto lock = api_lock();
        TCPX_ASSIGN_OR_RETURN(dying, registry_.kill(mem));
        if (dying == nullptr) return Status();
        // A receive no send has matched holds the region with nothing on the wire: it ends now
        // (CANCELLED), rather than hold this up for PEER_TIMEOUT_MS and then take its peer down.
        for (auto& [id, p] : peers_) {
            for (Xfer* x :
                 p->posted_recvs.take_if([&](const Xfer* x) { return uses_region(*x, dying); })) {
                end_unmatched_recv(x, cancelled("the receive's memory was deregistered"));
            }
        }
    }
    // Transfers still use the region: they finish first. The registry frees it with its last
    // reference; until then `dying` stays valid.
    const auto deadline =
        engine::deadline_after(std::chrono::milliseconds(config_.peer_timeout_ms));
    if (drive([&] { return !registry_.exists(mem); }, deadline)) return Status();
    auto lock = api_lock();
    if (!registry_.exists(mem)) return Status();
    // The peers holding it up have not completed within the peer timeout: disconnect them, so
    // nothing touches the region once we return.
    std::vector<PeerId> stuck;
    for (auto& [id, p] : peers_) {
        const bool holds = std::any_of(p->xfers.begin(), p->xfers.end(),
                                       [&](const Xfer* x) { return uses_region(*x, dying); });
        if (holds) stuck.push_back(id);
    }
    for (PeerId id : stuck) {
        fail_peer(*peers_.at(id),
                  timeout_error(strformat("a transfer did not complete within %lld ms while its "
                                          "region was being deregistered",
                                          static_cast<long long>(config_.peer_timeout_ms))));
    }
    // Their transfers end once the transport lets go (a plugin's requests get their grace, the
    // other peers served meanwhile), with the region's last reference.
    settle_peers(lock, stuck);
    // Local copies (copy()) hold it too, however long they take: they end by themselves, and
    // nothing may touch the region once we return.
    if (registry_.exists(mem) && dying->copies > 0) {
        lock.unlock();
        drive([&] { return !registry_.exists(mem) || dying->copies == 0; },
              Clock::time_point::max(), false);
    }
    return Status();
}

StatusOr<RemoteMem> Endpoint::Impl::describe(MemId mem) {
    auto lock = api_lock();
    Region* r = registry_.find(mem);
    if (r == nullptr) {
        return not_found(
            strformat("no registration with id %llu", static_cast<unsigned long long>(mem)));
    }
    RemoteMem out;
    out.addr = reinterpret_cast<uint64_t>(r->base);
    out.len = r->len;
    out.key = r->key;
    out.kind = r->kind;
    out.device = r->device;
    return out;
}

// --- transfer bookkeeping
// --------------------------------------------------------------------------

StatusOr<Endpoint::Impl::Xfer*> Endpoint::Impl::new_xfer(Xfer::Kind kind, Peer& p,
                                                         bool user_visible) {
    XferId user_id = 0;
    if (user_visible) {
        // Cancelled transfers still waiting for their peer's answer count too: a peer that
        // answers nothing would otherwise have a cancel-and-post loop hold one for ever each.
        if (detached_ > 0 &&
            xfers_->in_use() + detached_ >= static_cast<size_t>(config_.max_transfers)) {
            return resource_exhausted(strformat(
                "%zu transfers are in flight, %zu of them cancelled and waiting for their "
                "peer's answer (TCPX_P2P_MAX_TRANSFERS)",
                xfers_->in_use() + detached_, detached_));
        }
        TCPX_ASSIGN_OR_RETURN(user_id, xfers_->allocate());
    }
    try {
        auto x = std::make_unique<Xfer>();
        x->kind = kind;
        x->peer = &p;
        x->chunk = p.chunk;  // (0 while connecting: set by queue_chunks or the deferred post)
        x->user_id = user_id;
        p.xfers.insert(x.get());
        if (user_visible) xfers_->set_owner(user_id, x.get());
        if (x->served()) ++p.served;
        if (user_visible) count(p, &Stats::transfers_started);
        return x.release();
    } catch (...) {
        // Out of memory: nobody was given the id, which goes back; the call fails with it.
        if (user_id != 0) {
            xfers_->finish(user_id, Status());
            (void)xfers_->take(user_id);
        }
        throw;
    }
}

void Endpoint::Impl::hold(Xfer* x, Region* r, uint64_t offset, uint64_t len) {
    // Listed first: destroy() gives back the references of listed pieces only, so one taken for
    // a piece the list then had no memory for would keep the region (and its transport
    // registrations) for good, and dereg() would wait out PEER_TIMEOUT_MS for it.
    x->pieces.push_back(Xfer::Piece{r, offset, len});
    registry_.ref(r);
}

std::vector<wire::Segment> Endpoint::Impl::hold_pieces(Xfer* x, std::span<const IoVec> iov,
                                                       const std::vector<Region*>& regions) {
    std::vector<wire::Segment> segs;
    segs.reserve(iov.size());
    for (size_t i = 0; i < iov.size(); ++i) {
        hold(x, regions[i], iov[i].offset, iov[i].len);
        segs.push_back(wire::Segment{iov[i].remote.key, iov[i].remote_offset, iov[i].len});
    }
    return segs;
}

void Endpoint::Impl::destroy(Xfer* x) {
    if (x->detached()) --detached_;
    for (const Xfer::Piece& piece : x->pieces) {
        if (piece.region != nullptr) registry_.unref(piece.region);  // (a drain's are null)
    }
    if (x->notification_held && x->peer != nullptr) {
        --x->peer->notif_count;
        x->peer->notif_bytes -= x->notification.size();
    }
    // (A transfer is finished, which forgets its record, before it goes; in any case the table
    // must not point at a record that is gone.)
    if (x->user_id != 0) xfers_->set_owner(x->user_id, nullptr);
    if (x->peer != nullptr) {
        x->peer->served_pieces -= x->served_pieces;
        served_weight_ -= x->served_weight;
        if (x->served()) --x->peer->served;
        x->peer->xfers.erase(x);
    }
    delete x;
    // wait() may wait for this transfer, dereg() for a region it held (a served request's too).
    wake_waiters();
}

void Endpoint::Impl::queue_chunks(Peer& p, bool tx, Xfer* x) {
    // A send or receive posted while connecting took the peer's chunk size before the connection
    // agreed on one: cut it by the agreed one (both sides cut a send/recv pair alike by it).
    if (x->chunk == 0) x->chunk = p.chunk;
    if (x->chunk == 0) {
        // Cannot happen: chunks are queued only on a ready connection, whose size is at least
        // wire::kMinChunk. Fail the transfer rather than divide by it.
        x->result = internal_error("a transfer was cut before its connection agreed a chunk size");
        return;
    }
    // Counted now, cut later (refill): what a transfer costs up front does not grow with its
    // length, whatever length a peer names.
    const auto len_at = [x](size_t i) { return x->pieces[i].len; };
    const uint64_t chunks = engine::packer::count(len_at, x->pieces.size(), x->chunk);
    x->ops_left += chunks;
    active_ops_ += chunks;
    if (chunks > 0) (tx ? p.tx_pending : p.rx_pending).push_back(engine::Extent{x, {}});
    refill(p, tx);
}

void Endpoint::Impl::refill(Peer& p, bool tx) {
    // Round-robin over the channels with the direction's counter: the peer assigns the matching
    // requests with its own copy of the counter, in the same order (see engine.h). Chunks are cut
    // in that order while every channel has fewer than a window and its staging ahead queued.
    auto& pending = tx ? p.tx_pending : p.rx_pending;
    auto& channels = tx ? p.tx : p.rx;
    uint64_t& seq = tx ? p.tx_seq : p.rx_seq;
    const size_t depth = static_cast<size_t>(window_ + staging_slots_);
    while (!pending.empty()) {
        Channel& ch = channels[seq % channels.size()];
        if (ch.queued.size() >= depth) break;
        engine::Extent& e = pending.front();
        Xfer* x = e.xfer;
        engine::packer::Cut cut;
        const auto len_at = [x](size_t i) { return x->pieces[i].len; };
        if (!engine::packer::next(len_at, x->pieces.size(), x->chunk, &e.at, &cut)) {
            pending.pop_front();  // (counted by the same rule: no chunk is missing)
            continue;
        }
        ch.queued.push_back(make_op(ch, tx, x, cut));
        if (stage_times_) ch.queued.back().queued_ns = engine::stage_clock_ns();
        ++seq;
        if (e.at.piece >= x->pieces.size()) pending.pop_front();
    }
}

Op Endpoint::Impl::make_op(const Channel& ch, bool tx, Xfer* x,
                           const engine::packer::Cut& cut) const {
    using engine::OpPath;
    // A cancelled read's chunks not yet cut land in scratch: its memory is not to be touched. (A
    // cancelled write's are sent from its memory all the same: the target waits for them.)
    if (x->cancelled && x->kind == Xfer::Kind::kRead) return Op{x, nullptr, nullptr, cut.len};
    const Xfer::Piece& first = x->pieces[cut.first];
    Op op{x, first.region, nullptr, cut.len};
    op.first = static_cast<uint32_t>(cut.first);
    op.end = static_cast<uint32_t>(cut.end);
    if (first.region == nullptr) return op;  // a drain: into scratch, however many pieces
    if (cut.pieces == 1) {
        op.ptr = first.region->base + first.offset + cut.offset;
        op.path = path_for(ch, tx, first.region);
        return op;
    }
    bool any_gpu = false, all_gpu = true;
    for (size_t i = cut.first; i < cut.end; ++i) {
        if (x->pieces[i].len == 0) continue;
        const bool gpu = x->pieces[i].region->kind == MemKind::kCuda;
        any_gpu = any_gpu || gpu;
        all_gpu = all_gpu && gpu;
    }
    const bool takes_gpu = (props_.ptr_support & static_cast<int>(net::MemType::kCuda)) != 0;
    op.path = !any_gpu               ? OpPath::kGather
              : all_gpu && takes_gpu ? OpPath::kDeviceGather
                                     : OpPath::kStagedGather;
    return op;
}

engine::OpPath Endpoint::Impl::path_for(const Channel& ch, bool tx, const Region* region) const {
    using engine::OpPath;
    if (region == nullptr || region->kind != MemKind::kCuda) return OpPath::kHost;
    if ((props_.ptr_support & static_cast<int>(net::MemType::kCuda)) == 0) return OpPath::kStaged;
    if (!tx && ch.dev_handle.type == net::DeviceType::kUnpack) return OpPath::kUnpack;
    return OpPath::kDevice;
}

Status Endpoint::Impl::read_region(const Region* r, uint64_t offset, uint64_t len, void* out) {
    if (len == 0) return Status();
    if (r->kind == MemKind::kCuda) {
        ++sync_copies_;
        return cuda::device().copy_to_host(r->device, out, r->base + offset, len);
    }
    std::memcpy(out, r->base + offset, len);
    return Status();
}

Status Endpoint::Impl::write_region(Region* r, uint64_t offset, const void* src, uint64_t len) {
    if (len == 0) return Status();
    if (r->kind == MemKind::kCuda) {
        ++sync_copies_;
        return cuda::device().copy(r->device, r->base + offset, src, len);
    }
    std::memcpy(r->base + offset, src, len);
    return Status();
}

Status Endpoint::Impl::append_region(std::string* msg, const Region* r, uint64_t offset,
                                     uint64_t len) {
    if (len == 0) return Status();
    if (r->kind != MemKind::kCuda) {
        // Appended, not resized and then copied into: resize() first writes zeros over every
        // byte (a sixth of the CPU of a lone 128 KiB inline WRITE on two cores, with the copy).
        msg->append(reinterpret_cast<const char*>(r->base + offset), len);
        return Status();
    }
    const size_t at = msg->size();
    msg->resize(at + len);
    return read_region(r, offset, len, msg->data() + at);
}

void Endpoint::Impl::op_done(const Op& op) {
    --active_ops_;
    Xfer* x = op.xfer;
    --x->ops_left;
    // (op is off its channel's lists by now: cancel_settled does not count it)
    if (x->cancelled && x->user_id != 0 && op.region != nullptr && cancel_settled(*x)) {
        detach_cancelled(x);
    }
    if (x->ops_left == 0) maybe_finish(x);
}

bool Endpoint::Impl::cancel_settled(const Xfer& x) const {
    // A write's data is read from our memory until it has all been sent (the peer waits for
    // every chunk its request announced: none can be left out).
    if (x.kind == Xfer::Kind::kWrite) return x.ops_left == 0;
    // A read's chunks posted into our memory (or staged for it) land before it is let go; those
    // queued or cut after the cancel land in scratch.
    for (const Channel& ch : x.peer->rx) {
        for (const auto* list : {&ch.inflight, &ch.finishing}) {
            for (const Channel::InFlight& f : *list) {
                if (f.op.xfer == &x && f.op.region != nullptr) return false;
            }
        }
    }
    return true;
}

void Endpoint::Impl::detach_cancelled(Xfer* x) {
    let_read_notification_go(x);
    for (Xfer::Piece& piece : x->pieces) {
        if (piece.region != nullptr) registry_.unref(piece.region);
        piece.region = nullptr;  // (destroy() unrefs only what is left; make_op drains)
    }
    xfers_->finish(x->user_id, x->result);
    x->user_id = 0;
    ++detached_;
    wake_waiters();  // wait() for it, dereg() for a region it held
}

void Endpoint::Impl::let_read_notification_go(Xfer* x) {
    // Now (at the cancel, or once the target's answer is in), not once the rest has drained (a
    // whole read's worth, into scratch): the target's room for our notifications comes back at
    // once. It holds nothing else for the read.
    if (!x->read_done_owed || x->peer->state == Peer::State::kFailed) return;
    send_ctrl(*x->peer, wire::encode_read_done(wire::ReadDone{x->wire_id, false}));
    x->read_done_owed = false;
}

void Endpoint::Impl::count_finished(const Xfer& x) {
    Peer& p = *x.peer;
    if (x.served()) {
        count(p, &Stats::requests_served);
    } else {
        count(p, x.result.ok() ? &Stats::transfers_completed : &Stats::transfers_failed);
    }
    if (!x.result.ok()) return;
    uint64_t bytes = 0;
    for (const Xfer::Piece& piece : x.pieces) bytes += piece.len;
    const bool outgoing = x.kind == Xfer::Kind::kWrite || x.kind == Xfer::Kind::kSend ||
                          x.kind == Xfer::Kind::kServeRead;
    count(p, outgoing ? &Stats::bytes_sent : &Stats::bytes_received, bytes);
}

void Endpoint::Impl::maybe_finish(Xfer* x) {
    if (x->ops_left > 0 || x->waiting) return;
    Peer& p = *x->peer;
    count_finished(*x);
    switch (x->kind) {
        case Xfer::Kind::kServeWrite:
            // The data is in place (or the write was refused): notify, then acknowledge, so the
            // initiator learns of completion no earlier than our application could.
            if (x->result.ok() && x->has_notification) {
                queue_notification(p, std::move(x->notification), x->notification_held);
                x->notification_held = false;
            }
            send_reply(p, wire::encode_write_ack(x->wire_id, x->result));
            break;
        case Xfer::Kind::kServeRead:
            read_data_gone(p, x->wire_id);  // (its READ_DONE says whether the data arrived)
            break;
        case Xfer::Kind::kRead:
            // The data is in place here: now the peer may hear of it (it holds the notification
            // since it accepted the read), or let its room go if the read failed. Queued before
            // completion is reported, so nothing our application sends after seeing it done
            // overtakes it, and flushed by the same progress step.
            if (x->read_done_owed && p.state != Peer::State::kFailed) {
                send_ctrl(p, wire::encode_read_done(wire::ReadDone{x->wire_id, x->result.ok()}));
            }
            [[fallthrough]];
        default:
            // (0 once a cancel reported it: detach_cancelled)
            if (x->user_id != 0) xfers_->finish(x->user_id, x->result);
            break;
    }
    destroy(x);
}

// --- posting
// ---------------------------------------------------------------------------------------

// Checks every piece of a one-sided transfer before anything is sent: the local range against
// our registrations, the remote range against the descriptor (the target checks again).
StatusOr<std::vector<Region*>> Endpoint::Impl::resolve_pieces(const char* op,
                                                              std::span<const IoVec> iov) {
    if (iov.size() > wire::kMaxSegments) {
        return invalid_argument(strformat("%s: %zu pieces exceed the limit of %zu", op, iov.size(),
                                          wire::kMaxSegments));
    }
    std::vector<Region*> regions;
    regions.reserve(iov.size());
    uint64_t total = 0;
    for (size_t i = 0; i < iov.size(); ++i) {
        const IoVec& v = iov[i];
        auto r = registry_.resolve(v.mem, v.offset, v.len);
        if (!r.ok()) return Status(r.status()).with_context(strformat("%s: piece %zu", op, i));
        if (v.remote_offset > v.remote.len || v.len > v.remote.len - v.remote_offset) {
            return out_of_range(
                strformat("%s: piece %zu: [%llu, +%llu) is outside the remote region of %llu "
                          "bytes",
                          op, i, static_cast<unsigned long long>(v.remote_offset),
                          static_cast<unsigned long long>(v.len),
                          static_cast<unsigned long long>(v.remote.len)));
        }
        if (v.len > ~uint64_t{0} - total) {
            return out_of_range(strformat("%s: piece %zu: the lengths add up past 2^64", op, i));
        }
        total += v.len;
        regions.push_back(*r);
    }
    return regions;
}

Status Endpoint::Impl::check_notification_to_send(const char* op, size_t size) const {
    if (size > config_.max_notification_size) {
        return invalid_argument(strformat(
            "%s: a notification of %zu bytes exceeds TCPX_P2P_MAX_NOTIFICATION_SIZE (%llu)", op,
            size, static_cast<unsigned long long>(config_.max_notification_size)));
    }
    return Status();
}

Status Endpoint::Impl::check_request_fits(const char* op, size_t pieces,
                                          std::optional<std::string_view> notification) const {
    // The request must fit one control message (the peer refuses larger ones; a write's inline
    // data may come on top, see CtrlConn::set_max_message).
    const size_t notification_bytes = notification ? notification->size() : 0;
    const uint64_t request_bytes = 64 + 24 * uint64_t{pieces} + notification_bytes;
    if (request_bytes > config_.max_ctrl_message) {
        return invalid_argument(strformat(
            "%s: %zu pieces and a notification of %zu bytes exceed the %llu-byte limit of one "
            "request (TCPX_P2P_MAX_CTRL_MESSAGE); split it",
            op, pieces, notification_bytes,
            static_cast<unsigned long long>(config_.max_ctrl_message)));
    }
    return Status();
}

bool Endpoint::Impl::touches_gpu(std::span<const IoVec> iov, const std::vector<Region*>& regions) {
    for (size_t i = 0; i < iov.size(); ++i) {
        if (regions[i]->kind == MemKind::kCuda || iov[i].remote.kind == MemKind::kCuda) return true;
    }
    return false;
}

StatusOr<XferId> Endpoint::Impl::write(PeerId peer, std::span<const IoVec> iov,
                                       std::optional<std::string_view> notification) {
    TCPX_RETURN_IF_ERROR(
        check_notification_to_send("write", notification ? notification->size() : 0));
    auto lock = api_lock();
    TCPX_ASSIGN_OR_RETURN(Peer * p, postable_peer(peer));
    TCPX_RETURN_IF_ERROR(check_deferrable(*p));
    TCPX_ASSIGN_OR_RETURN(std::vector<Region*> regions, resolve_pieces("write", iov));
    uint64_t total = 0;
    for (const IoVec& v : iov) total += v.len;
    const bool gpu = touches_gpu(iov, regions);
    TCPX_RETURN_IF_ERROR(check_request_fits("write", iov.size(), notification));
    const bool is_inline =
        total <= inline_limit(*p, gpu) && (!gpu || iov.size() <= wire::kMaxInlineGpuPieces);
    std::string payload;  // an inline write's bytes, read before anything is sent
    if (is_inline) {
        payload.reserve(total);
        for (size_t i = 0; i < iov.size(); ++i) {
            Status st = append_region(&payload, regions[i], iov[i].offset, iov[i].len);
            if (!st.ok()) return st.with_context("write");
        }
    }
    TCPX_ASSIGN_OR_RETURN(Xfer * x, new_xfer(Xfer::Kind::kWrite, *p, true));
    const XferId id = x->user_id;
    // From here on the transfer exists (its id is the caller's): see guard_post.
    guard_post(*p, [&] {
        x->wire_id = next_wire_id_++;
        wire::WriteReq req;
        req.xfer = x->wire_id;
        req.segs = hold_pieces(x, iov, regions);
        if (notification) {
            req.flags |= wire::kFlagNotif;
            req.notification = *notification;
        }
        if (is_inline) req.flags |= wire::kFlagInline;
        std::string msg = wire::encode_write_req(req);
        wire::end_message(&msg, payload.size());
        // (An inline write's bytes were read above: what the region holds at the post is sent.)
        issue_or_defer(*p, [this, p, x, is_inline, total, gpu, msg = std::move(msg),
                            payload = std::move(payload)]() mutable {
            if (x->cancelled) {  // while its connection was being made: nothing went out
                maybe_finish(x);
                return;
            }
            // The chunk size is the peer's (known once connected), or less for a short GPU transfer
            // that has the peer to itself (under load, smaller chunks would only hold staging slots
            // with fewer bytes each).
            x->chunk = engine::packer::transfer_chunk(p->chunk, total, gpu && p->xfers.size() == 1);
            wire::set_request_chunk(&msg, x->chunk);
            send_ctrl(*p, std::move(msg), std::move(payload));
            if (!is_inline) queue_chunks(*p, true, x);
            x->waiting = true;
            await_reply(*p, x);
        });
        if (p->state == Peer::State::kReady) {
            progress_peer(*p, false, false);  // send the request (and first chunks) from here
        }
    });
    lock.unlock();
    wake();
    return id;
}

StatusOr<XferId> Endpoint::Impl::read(PeerId peer, std::span<const IoVec> iov,
                                      std::optional<std::string_view> notification) {
    // It travels in the request; the target holds it (or refuses the read when it has no room)
    // and delivers it on our READ_DONE, once the data is in place here.
    TCPX_RETURN_IF_ERROR(
        check_notification_to_send("read", notification ? notification->size() : 0));
    auto lock = api_lock();
    TCPX_ASSIGN_OR_RETURN(Peer * p, postable_peer(peer));
    TCPX_RETURN_IF_ERROR(check_deferrable(*p));
    TCPX_ASSIGN_OR_RETURN(std::vector<Region*> regions, resolve_pieces("read", iov));
    TCPX_RETURN_IF_ERROR(check_request_fits("read", iov.size(), notification));
    TCPX_ASSIGN_OR_RETURN(Xfer * x, new_xfer(Xfer::Kind::kRead, *p, true));
    const XferId id = x->user_id;
    // From here on the transfer exists (its id is the caller's): see guard_post.
    guard_post(*p, [&] {
        x->wire_id = next_wire_id_++;
        wire::ReadReq req;
        req.xfer = x->wire_id;
        req.segs = hold_pieces(x, iov, regions);
        if (notification) {
            // (Encoded into the request below; nothing of the read needs it after that.)
            x->has_notification = true;
            req.flags |= wire::kFlagNotif;
            req.notification = *notification;
        }
        uint64_t total = 0;
        for (const IoVec& v : iov) total += v.len;  // (no overflow: resolve_pieces checked)
        const bool gpu = touches_gpu(iov, regions);
        // Into host memory, and alone with the peer (x is all it has) or small enough for
        // XFER_INLINE_BUSY: the target may answer with the data inline (it checks its own
        // memory and limit).
        const bool alone =
            p->xfers.size() == 1 && config_.xfer_inline_alone_read > config_.xfer_inline_threshold;
        const bool busy = total <= config_.xfer_inline_busy &&
                          config_.xfer_inline_busy > config_.xfer_inline_threshold;
        if (all_host(regions) && (alone || busy)) req.flags |= wire::kFlagInline;
        x->asked_inline = (req.flags & wire::kFlagInline) != 0;
        issue_or_defer(*p, [this, p, x, total, gpu, msg = wire::encode_read_req(req)]() mutable {
            if (x->cancelled) {  // while its connection was being made: nothing went out
                maybe_finish(x);
                return;
            }
            x->chunk = engine::packer::transfer_chunk(p->chunk, total, gpu && p->xfers.size() == 1);
            wire::set_request_chunk(&msg, x->chunk);
            send_ctrl(*p, std::move(msg));
            x->waiting = true;
            await_reply(*p, x);
        });
        if (p->state == Peer::State::kReady) progress_peer(*p, false, false);
    });
    lock.unlock();
    wake();
    return id;
}

Status Endpoint::Impl::notify(PeerId peer, std::string_view payload) {
    TCPX_RETURN_IF_ERROR(check_notification_to_send("notify", payload.size()));
    auto lock = api_lock();
    TCPX_ASSIGN_OR_RETURN(Peer * p, postable_peer(peer));
    TCPX_RETURN_IF_ERROR(check_deferrable(*p));
    // A notification has no transfer to wait for: what waits to go out (on a slow wire, or to a
    // peer still connecting) is bounded here, or a loop of notify() would hold without bound.
    const uint64_t waiting = p->ctrl.unsent() + p->deferred_notif_bytes;
    if (waiting > 0 && waiting + payload.size() > config_.max_queued_notification_bytes) {
        return resource_exhausted(
            strformat("notify: %llu bytes wait to go to peer '%s' already "
                      "(TCPX_P2P_MAX_QUEUED_NOTIFICATION_BYTES); try again once they have gone",
                      static_cast<unsigned long long>(waiting), p->name.c_str()));
    }
    const bool deferred = p->state != Peer::State::kReady;
    issue_or_defer(*p, [this, p, deferred, size = payload.size(),
                        msg = wire::encode_notif(payload)]() mutable {
        if (deferred) p->deferred_notif_bytes -= size;
        send_ctrl(*p, std::move(msg));
    });
    if (deferred) p->deferred_notif_bytes += payload.size();  // once it waits (not out of memory)
    if (p->state == Peer::State::kReady) progress_peer(*p, false, false);
    lock.unlock();
    wake();
    return Status();
}

// The pieces' ranges by address (two registrations may cover the same memory): no destination
// may share a byte with any other range, its own piece's source included (a piece copied onto
// itself, exactly, is none: nothing moves). Pieces are copied one after another, each by the
// memory's own means (a CUDA copy between overlapping ranges is undefined), so an overlap would
// make the outcome depend on how the copy was carried out.
Status Endpoint::Impl::check_copy_overlaps(std::span<const LocalCopy> pieces,
                                           const std::vector<std::pair<Region*, Region*>>& held) {
    struct Range {
        uintptr_t lo, hi;  // [lo, hi)
        size_t piece;
        bool dst;
    };
    std::vector<Range> ranges;
    ranges.reserve(2 * held.size());
    for (size_t i = 0; i < held.size(); ++i) {
        const LocalCopy& c = pieces[i];
        if (c.len == 0) continue;
        const auto to = reinterpret_cast<uintptr_t>(held[i].first->base + c.dst_offset);
        const auto from = reinterpret_cast<uintptr_t>(held[i].second->base + c.src_offset);
        if (to == from) continue;  // onto itself: nothing to copy (skipped below)
        ranges.push_back(Range{to, to + c.len, i, true});
        ranges.push_back(Range{from, from + c.len, i, false});
    }
    std::sort(ranges.begin(), ranges.end(),
              [](const Range& a, const Range& b) { return a.lo < b.lo; });
    // Sweep in order of start: a range overlaps an earlier one iff that one reaches past its
    // start. Any earlier destination that does is an overlap, as is any earlier range when this
    // one is a destination: the earlier ones reaching furthest (of destinations, of all) tell.
    const Range* far_dst = nullptr;
    const Range* far_any = nullptr;
    for (const Range& r : ranges) {
        const Range* hit = far_dst != nullptr && far_dst->hi > r.lo            ? far_dst
                           : r.dst && far_any != nullptr && far_any->hi > r.lo ? far_any
                                                                               : nullptr;
        if (hit != nullptr) {
            const Range& d = hit->dst ? *hit : r;
            const Range& other = hit->dst ? r : *hit;
            return invalid_argument(strformat(
                "copy: piece %zu's destination overlaps %s %s (pieces must not overlap)", d.piece,
                other.piece == d.piece ? "its own" : strformat("piece %zu's", other.piece).c_str(),
                other.dst ? "destination" : "source"));
        }
        if (r.dst && (far_dst == nullptr || r.hi > far_dst->hi)) far_dst = &r;
        if (far_any == nullptr || r.hi > far_any->hi) far_any = &r;
    }
    return Status();
}

Status Endpoint::Impl::copy(std::span<const LocalCopy> pieces) {
    if (pieces.size() > wire::kMaxSegments) {
        return invalid_argument(strformat("copy: %zu pieces exceed the limit of %zu", pieces.size(),
                                          wire::kMaxSegments));
    }
    // Resolve and hold every region first (a concurrent dereg waits for us, as long as we take),
    // copy without the lock (the progress thread goes on), then let go, whatever happened.
    std::vector<std::pair<Region*, Region*>> held;
    struct Release {
        Impl* self;
        std::vector<std::pair<Region*, Region*>>* held;
        ~Release() {
            auto lock = self->api_lock();
            bool dying = false;
            for (auto [d, s] : *held) {
                for (Region* r : {d, s}) {
                    --r->copies;
                    dying |= r->dead;
                    self->registry_.unref(r);
                }
            }
            if (dying) self->wake_waiters();  // a dereg() waits for us
        }
    } release{this, &held};
    held.reserve(pieces.size());
    Status st;
    {
        auto lock = api_lock();
        for (const LocalCopy& c : pieces) {
            auto d = registry_.resolve(c.dst, c.dst_offset, c.len);
            auto s = registry_.resolve(c.src, c.src_offset, c.len);
            st = !d.ok() ? Status(d.status()) : !s.ok() ? Status(s.status()) : Status();
            if (!st.ok()) {
                st = st.with_context("copy");
                break;
            }
            for (Region* r : {*d, *s}) {
                registry_.ref(r);
                ++r->copies;
            }
            held.emplace_back(*d, *s);
        }
    }
    // (Outside the lock: up to 2^21 ranges sorted; the regions are held.)
    if (st.ok()) st = check_copy_overlaps(pieces, held);
    // Nothing is copied unless every piece resolved and none overlaps another.
    for (size_t i = 0; i < held.size() && st.ok(); ++i) {
        const LocalCopy& c = pieces[i];
        if (c.len == 0) continue;
        Region* d = held[i].first;
        Region* s = held[i].second;
        uint8_t* to = d->base + c.dst_offset;
        const uint8_t* from = s->base + c.src_offset;
        if (to == from) continue;  // the bytes are where they are to be
        if (d->kind == MemKind::kHost && s->kind == MemKind::kHost) {
            std::memmove(to, from, c.len);
        } else {
            const int gpu = d->kind == MemKind::kCuda ? d->device : s->device;
            st = cuda::device().copy(gpu, to, from, c.len).with_context("copy");
        }
    }
    return st;
}

std::vector<Notification> Endpoint::Impl::get_notifications(size_t max) {
    std::unique_lock<std::mutex> lock(mu_, std::try_to_lock);
    if (!lock.owns_lock()) lock.lock();
    api_progress();  // an application polling for notifications moves everything too
    // The records of senders whose notifications the previous calls took all: the caller has
    // judged those by now (peer_matches() answers for them until this call).
    std::erase_if(gone_, [](const auto& g) { return g.second.notifications == 0; });
    ++notification_calls_;
    std::vector<Notification> out;
    out.reserve(std::min<size_t>(max, notifications_.size()));  // (out of memory: none taken)
    while (out.size() < max && notifications_.size() > 0) {
        QueuedNotification q = notifications_.pop_front();  // (out has room: nothing lost)
        auto it = peers_.find(q.peer);
        if (it != peers_.end()) {
            --it->second->notif_count;
            it->second->notif_bytes -= q.notification.payload.size();
            it->second->notif_returned_in = notification_calls_;  // (reap_peers keeps who it was)
        } else if (auto g = gone_.find(q.peer); g != gone_.end()) {
            --g->second.notifications;
        }
        out.push_back(std::move(q.notification));
    }
    // Room again: peers whose notifications waited for it are read again (what they bring is
    // for the next call).
    if (!out.empty() && paused_peers_ > 0) resume_paused_peers();
    if (out.empty()) {
        lock.unlock();
        std::this_thread::yield();  // a target polling for news: as in poll()
    }
    return out;
}

StatusOr<XferId> Endpoint::Impl::send(PeerId peer, MemId mem, uint64_t offset, uint64_t len,
                                      uint64_t tag) {
    auto lock = api_lock();
    TCPX_ASSIGN_OR_RETURN(Peer * p, postable_peer(peer));
    TCPX_RETURN_IF_ERROR(check_deferrable(*p));
    auto r = registry_.resolve(mem, offset, len);
    if (!r.ok()) return Status(r.status()).with_context("send");
    TCPX_ASSIGN_OR_RETURN(Xfer * x, new_xfer(Xfer::Kind::kSend, *p, true));
    const XferId id = x->user_id;
    // From here on the transfer exists (its id is the caller's): see guard_post.
    guard_post(*p, [&] {
        x->wire_id = next_wire_id_++;
        x->tag = tag;
        x->len = len;
        hold(x, *r, offset, len);
        issue_or_defer(
            *p, [this, p, x,
                 msg = wire::encode_send_rts(wire::SendRts{x->wire_id, tag, len})]() mutable {
                send_ctrl(*p, std::move(msg));
                x->waiting = true;
                await_reply(*p, x);
            });
        if (p->state == Peer::State::kReady) progress_peer(*p, false, false);
    });
    lock.unlock();
    wake();
    return id;
}

StatusOr<XferId> Endpoint::Impl::recv(PeerId peer, MemId mem, uint64_t offset, uint64_t len,
                                      uint64_t tag) {
    auto lock = api_lock();
    TCPX_ASSIGN_OR_RETURN(Peer * p, postable_peer(peer));
    auto r = registry_.resolve(mem, offset, len);
    if (!r.ok()) return Status(r.status()).with_context("recv");
    TCPX_ASSIGN_OR_RETURN(Xfer * x, new_xfer(Xfer::Kind::kRecv, *p, true));
    const XferId id = x->user_id;
    // From here on the transfer exists (its id is the caller's): see guard_post.
    guard_post(*p, [&] {
        x->wire_id = next_wire_id_++;
        x->tag = tag;
        x->len = len;
        x->waiting = true;
        hold(x, *r, offset, len);
        if (std::optional<Peer::Rts> rts = p->unexpected.take(tag)) {
            --served_weight_;
            match(*p, x, *rts);
        } else {
            x->posted_seq = p->posted_recvs.push(tag, x).seq;
        }
        progress_peer(*p, false, false);
    });
    lock.unlock();
    wake();
    return id;
}

// A receive meets the send it takes: tell the sender to go ahead, or why not.
void Endpoint::Impl::match(Peer& p, Xfer* recv, const Peer::Rts& rts) {
    if (rts.len > recv->len) {
        Status st = out_of_range(strformat(
            "a send of %llu bytes does not fit the receive of %llu bytes (tag %llu)",
            static_cast<unsigned long long>(rts.len), static_cast<unsigned long long>(recv->len),
            static_cast<unsigned long long>(rts.tag)));
        send_reply(p, wire::encode_recv_cts(rts.send_xfer, recv->wire_id, st));
        recv->result = st;
        recv->waiting = false;
        maybe_finish(recv);
        return;
    }
    recv->len = rts.len;
    recv->pieces.front().len = rts.len;  // what arrives, and so what is cut into chunks
    await_reply(p, recv);
    send_reply(p, wire::encode_recv_cts(rts.send_xfer, recv->wire_id, Status()));
}

// --- completion
// ------------------------------------------------------------------------------------

void Endpoint::Impl::end_unmatched_recv(Xfer* x, Status why) {
    x->result = std::move(why);
    x->waiting = false;
    maybe_finish(x);  // reported as failed; its regions let go (a dereg() waiting is woken)
}

Status Endpoint::Impl::cancel(XferId xfer) {
    auto lock = api_lock();
    XferState state;
    if (!xfers_->allocated_state(xfer, &state)) {
        return invalid_argument(strformat("cancel: no transfer %016llx (unknown, or reported)",
                                          static_cast<unsigned long long>(xfer)));
    }
    if (state != XferState::kInProgress) {
        return failed_precondition(
            "cancel: the transfer has finished; poll() or wait() reports it");
    }
    Xfer* x = static_cast<Xfer*>(xfers_->owner(xfer));
    if (x == nullptr) return internal_error("cancel: a transfer in progress has no state");
    Peer& p = *x->peer;
    if (x->kind == Xfer::Kind::kRecv) {
        // Only a receive still waiting for its send holds nothing on the wire: the sender has not
        // been told to go ahead (no RECV_CTS), and a send that comes later meets another receive.
        if (!p.posted_recvs.erase({x->tag, x->posted_seq})) {
            return failed_precondition(
                "cancel: the receive has met its send, and its bytes are on the wire; it "
                "completes or fails on its own");
        }
        end_unmatched_recv(x, cancelled("the receive was cancelled"));
        return Status();
    }
    if (x->kind != Xfer::Kind::kWrite && x->kind != Xfer::Kind::kRead) {
        return failed_precondition(
            "cancel: a send cannot be cancelled (its receiver may have taken it); it completes "
            "or fails on its own");
    }
    bool told_target = false;
    if (!x->cancelled) {
        if (x->result.ok()) x->result = cancelled("the transfer was cancelled");
        x->cancelled = true;
        if (x->kind == Xfer::Kind::kRead) {
            // Its chunks queued but not posted land in scratch, in their places on the channels
            // (the target sends them all the same).
            for (Channel& ch : p.rx) {
                for (Op& op : ch.queued) {
                    if (op.xfer == x) op = Op{x, nullptr, nullptr, op.len};
                }
            }
            // Its notification will not be delivered: the target may let its room go now.
            let_read_notification_go(x);
            told_target = true;
        }
    }
    // The READ_DONE that lets it go goes out now (as a post's request does), not at the
    // progress thread's next tick: the target holds the room until then, and a notifying
    // transfer posted right after could be refused for the want of it.
    const auto send_now = [&] {
        if (told_target && p.state == Peer::State::kReady) progress_peer(p, false, false);
        lock.unlock();
        wake();
    };
    if (cancel_settled(*x)) {
        detach_cancelled(x);
        send_now();
        return Status();
    }
    // (x may be gone once the lock is let go, or once the pass below has landed its chunks)
    const bool read = x->kind == Xfer::Kind::kRead;
    send_now();
    return unavailable(read ? "cancel: the read's chunks already on their way into memory land "
                              "first; it reports CANCELLED once they have (the rest lands in "
                              "scratch)"
                            : "cancel: a write's data is read from memory until it has all been "
                              "sent (the peer waits for it); it reports CANCELLED once it has");
}

XferStatus Endpoint::Impl::poll(XferId xfer) {
    XferState state;
    // The caller polls in a loop: make progress here, progress thread or not (it stands back
    // while calls do, run_progress_thread). Never wait for the lock: whoever holds it is making
    // progress already.
    if (xfers_->state(xfer, &state) && state == XferState::kInProgress) {
        std::unique_lock<std::mutex> lock(mu_, std::try_to_lock);
        if (lock.owns_lock()) api_progress();
    }
    if (!xfers_->state(xfer, &state)) {
        auto lock = api_lock();
        return xfers_->take(xfer);  // reports INVALID_ARGUMENT
    }
    if (state == XferState::kInProgress) {
        // The caller polls in a loop, as NIXL's getXferStatus users do: give the core to whoever
        // does the work (our progress or I/O threads, or on a small machine the peer process)
        // rather than keep it until the time slice ends (milliseconds; engine.md, Progress).
        std::this_thread::yield();
        return XferStatus{};
    }
    auto lock = api_lock();
    return xfers_->take(xfer);
}

Status Endpoint::Impl::wait(XferId xfer, std::chrono::milliseconds timeout) {
    const auto deadline = engine::deadline_after(timeout);
    bool known = true;
    drive(
        [&] {
            XferState state;
            known = xfers_->state(xfer, &state);
            return !known || state != XferState::kInProgress;
        },
        deadline);
    auto lock = api_lock();
    XferStatus st = xfers_->take(xfer);
    if (st.state == XferState::kInProgress) {
        return timeout_error(strformat("transfer %016llx still in flight after %lld ms",
                                       static_cast<unsigned long long>(xfer),
                                       static_cast<long long>(timeout.count())));
    }
    return st.error;
}

}  // namespace tcpx
