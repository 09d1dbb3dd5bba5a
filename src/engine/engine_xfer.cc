// The engine's transfers: registration, posting, the control messages that drive them, the data
// channels, completion.
#include <algorithm>
#include <cstring>

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
    const cuda::PointerInfo info = cuda::classify(ptr);
    auto lock = api_lock();
    TCPX_ASSIGN_OR_RETURN(Region * r, registry_.add(ptr, len, info.kind, info.device));
    return r->id;
}

Status Endpoint::Impl::dereg(MemId mem) {
    Region* dying = nullptr;
    {
        auto lock = api_lock();
        TCPX_ASSIGN_OR_RETURN(dying, registry_.kill(mem));
        if (dying == nullptr) return Status();
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
    std::vector<Peer*> stuck;
    for (auto& [id, p] : peers_) {
        for (Xfer* x : p->xfers) {
            for (const Xfer::Piece& piece : x->pieces) {
                if (piece.region == dying) stuck.push_back(p.get());
            }
        }
    }
    for (Peer* p : stuck) {
        fail_peer(*p, timeout_error(strformat(
                          "a transfer did not complete within %lld ms while its region was "
                          "being deregistered",
                          static_cast<long long>(config_.peer_timeout_ms))));
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
        TCPX_ASSIGN_OR_RETURN(user_id, xfers_->allocate());
    }
    auto* x = new Xfer();
    x->kind = kind;
    x->peer = &p;
    x->user_id = user_id;
    p.xfers.insert(x);
    return x;
}

void Endpoint::Impl::hold(Xfer* x, Region* r, uint64_t offset, uint64_t len) {
    registry_.ref(r);
    x->pieces.push_back(Xfer::Piece{r, offset, len});
}

void Endpoint::Impl::destroy(Xfer* x) {
    for (const Xfer::Piece& piece : x->pieces) registry_.unref(piece.region);
    if (x->notification_held && x->peer != nullptr) {
        --x->peer->notif_count;
        x->peer->notif_bytes -= x->notification.size();
    }
    if (x->peer != nullptr) x->peer->xfers.erase(x);
    delete x;
}

void Endpoint::Impl::queue_chunks(Peer& p, bool tx, Xfer* x, Region* region, uint8_t* ptr,
                                  uint64_t len) {
    // Counted now, cut later (refill): what a transfer costs up front does not grow with its
    // length, whatever length a peer names.
    const uint64_t chunks = (len + p.chunk - 1) / p.chunk;
    x->ops_left += chunks;
    active_ops_ += chunks;
    if (len > 0) (tx ? p.tx_pending : p.rx_pending).push_back(engine::Extent{x, region, ptr, len});
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
        const uint64_t n = std::min(p.chunk, e.len - e.done);
        ch.queued.push_back(Op{e.xfer, e.region, e.ptr == nullptr ? nullptr : e.ptr + e.done, n,
                               path_for(ch, tx, e.region), -1});
        ++seq;
        e.done += n;
        if (e.done == e.len) pending.pop_front();
    }
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
    if (r->kind == MemKind::kCuda) return cuda::device().copy(out, r->base + offset, len);
    std::memcpy(out, r->base + offset, len);
    return Status();
}

Status Endpoint::Impl::write_region(Region* r, uint64_t offset, const void* src, uint64_t len) {
    if (len == 0) return Status();
    if (r->kind == MemKind::kCuda) return cuda::device().copy(r->base + offset, src, len);
    std::memcpy(r->base + offset, src, len);
    return Status();
}

Status Endpoint::Impl::append_region(std::string* msg, const Region* r, uint64_t offset,
                                     uint64_t len) {
    const size_t at = msg->size();
    msg->resize(at + len);
    return read_region(r, offset, len, msg->data() + at);
}

void Endpoint::Impl::op_done(const Op& op) {
    --active_ops_;
    if (--op.xfer->ops_left == 0) maybe_finish(op.xfer);
}

void Endpoint::Impl::maybe_finish(Xfer* x) {
    if (x->ops_left > 0 || x->waiting) return;
    Peer& p = *x->peer;
    switch (x->kind) {
        case Xfer::Kind::kServeWrite:
            // The data is in place (or the write was refused): notify, then acknowledge, so the
            // initiator learns of completion no earlier than our application could.
            if (x->result.ok() && x->has_notification) {
                queue_notification(p, std::move(x->notification), x->notification_held);
                x->notification_held = false;
            }
            send_ctrl(p, wire::encode_write_ack(x->wire_id, x->result));
            break;
        case Xfer::Kind::kServeRead:
            break;
        case Xfer::Kind::kRead:
            // The data is in place here: now the peer may hear of it. Queued before completion is
            // reported, so nothing our application sends after seeing it done overtakes it, and
            // flushed by the same progress step.
            if (x->result.ok() && x->has_notification) {
                send_ctrl(p, wire::encode_notif(x->notification));
            }
            [[fallthrough]];
        default:
            xfers_->finish(x->user_id, x->result);
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
    for (const IoVec& v : iov) {
        auto r = registry_.resolve(v.mem, v.offset, v.len);
        if (!r.ok()) return Status(r.status()).with_context(op);
        if (v.remote_offset > v.remote.len || v.len > v.remote.len - v.remote_offset) {
            return out_of_range(
                strformat("%s: [%llu, +%llu) is outside the remote region of %llu "
                          "bytes",
                          op, static_cast<unsigned long long>(v.remote_offset),
                          static_cast<unsigned long long>(v.len),
                          static_cast<unsigned long long>(v.remote.len)));
        }
        regions.push_back(*r);
    }
    return regions;
}

StatusOr<XferId> Endpoint::Impl::write(PeerId peer, std::span<const IoVec> iov,
                                       std::optional<std::string_view> notification) {
    if (notification && notification->size() > config_.max_notification_size) {
        return invalid_argument(strformat(
            "write: a notification of %zu bytes exceeds TCPX_P2P_MAX_NOTIFICATION_SIZE (%llu)",
            notification->size(), static_cast<unsigned long long>(config_.max_notification_size)));
    }
    auto lock = api_lock();
    TCPX_ASSIGN_OR_RETURN(Peer * p, postable_peer(peer));
    TCPX_RETURN_IF_ERROR(check_deferrable(*p));
    TCPX_ASSIGN_OR_RETURN(std::vector<Region*> regions, resolve_pieces("write", iov));
    uint64_t total = 0;
    for (const IoVec& v : iov) total += v.len;
    // The request must fit one control message (the peer refuses larger ones).
    const uint64_t request_bytes = 64 + 24 * iov.size() +
                                   (notification ? notification->size() : 0) +
                                   (total <= inline_limit() ? total : 0);
    if (request_bytes > config_.max_ctrl_message) {
        return invalid_argument(strformat(
            "write: %zu pieces and a notification of %zu bytes exceed the %llu-byte limit of one "
            "request (TCPX_P2P_MAX_CTRL_MESSAGE); split it",
            iov.size(), notification ? notification->size() : size_t{0},
            static_cast<unsigned long long>(config_.max_ctrl_message)));
    }
    const bool is_inline = total <= inline_limit();
    std::string payload;  // an inline write's bytes, read before anything is sent
    if (is_inline) {
        for (size_t i = 0; i < iov.size(); ++i) {
            Status st = append_region(&payload, regions[i], iov[i].offset, iov[i].len);
            if (!st.ok()) return st.with_context("write");
        }
    }
    TCPX_ASSIGN_OR_RETURN(Xfer * x, new_xfer(Xfer::Kind::kWrite, *p, true));
    x->wire_id = next_wire_id_++;
    wire::WriteReq req;
    req.xfer = x->wire_id;
    for (size_t i = 0; i < iov.size(); ++i) {
        hold(x, regions[i], iov[i].offset, iov[i].len);
        req.segs.push_back(wire::Segment{iov[i].remote.key, iov[i].remote_offset, iov[i].len});
    }
    if (notification) {
        req.flags |= wire::kFlagNotif;
        req.notification = *notification;
    }
    if (is_inline) req.flags |= wire::kFlagInline;
    std::string msg = wire::encode_write_req(req);
    msg.append(payload);
    wire::end_message(&msg);
    const XferId id = x->user_id;
    // (An inline write's bytes were read above: what the region holds at the post is sent.)
    issue_or_defer(*p, [this, p, x, is_inline, msg = std::move(msg)]() mutable {
        send_ctrl(*p, std::move(msg));
        if (!is_inline) {
            for (const Xfer::Piece& piece : x->pieces) {
                queue_chunks(*p, true, x, piece.region, piece.region->base + piece.offset,
                             piece.len);
            }
        }
        x->waiting = true;
        p->awaiting.emplace(x->wire_id, x);
    });
    if (p->state == Peer::State::kReady) {
        progress_peer(*p, false, false);  // send the request (and first chunks) from here
    }
    lock.unlock();
    wake();
    return id;
}

StatusOr<XferId> Endpoint::Impl::read(PeerId peer, std::span<const IoVec> iov,
                                      std::optional<std::string_view> notification) {
    // It travels as a NOTIF message of its own once the read is complete (as notify() sends it).
    if (notification && notification->size() > config_.max_notification_size) {
        return invalid_argument(strformat(
            "read: a notification of %zu bytes exceeds TCPX_P2P_MAX_NOTIFICATION_SIZE (%llu)",
            notification->size(), static_cast<unsigned long long>(config_.max_notification_size)));
    }
    auto lock = api_lock();
    TCPX_ASSIGN_OR_RETURN(Peer * p, postable_peer(peer));
    TCPX_RETURN_IF_ERROR(check_deferrable(*p));
    TCPX_ASSIGN_OR_RETURN(std::vector<Region*> regions, resolve_pieces("read", iov));
    if (64 + 24 * iov.size() > config_.max_ctrl_message) {
        return invalid_argument(
            strformat("read: %zu pieces exceed the %llu-byte limit of one request "
                      "(TCPX_P2P_MAX_CTRL_MESSAGE); split it",
                      iov.size(), static_cast<unsigned long long>(config_.max_ctrl_message)));
    }
    TCPX_ASSIGN_OR_RETURN(Xfer * x, new_xfer(Xfer::Kind::kRead, *p, true));
    x->wire_id = next_wire_id_++;
    wire::ReadReq req;
    req.xfer = x->wire_id;
    for (size_t i = 0; i < iov.size(); ++i) {
        hold(x, regions[i], iov[i].offset, iov[i].len);
        req.segs.push_back(wire::Segment{iov[i].remote.key, iov[i].remote_offset, iov[i].len});
    }
    if (notification) {
        x->has_notification = true;
        x->notification = std::string(*notification);
    }
    const XferId id = x->user_id;
    issue_or_defer(*p, [this, p, x, msg = wire::encode_read_req(req)]() mutable {
        send_ctrl(*p, std::move(msg));
        x->waiting = true;
        p->awaiting.emplace(x->wire_id, x);
    });
    if (p->state == Peer::State::kReady) progress_peer(*p, false, false);
    lock.unlock();
    wake();
    return id;
}

Status Endpoint::Impl::notify(PeerId peer, std::string_view payload) {
    if (payload.size() > config_.max_notification_size) {
        return invalid_argument(strformat(
            "notify: a notification of %zu bytes exceeds TCPX_P2P_MAX_NOTIFICATION_SIZE (%llu)",
            payload.size(), static_cast<unsigned long long>(config_.max_notification_size)));
    }
    auto lock = api_lock();
    TCPX_ASSIGN_OR_RETURN(Peer * p, postable_peer(peer));
    TCPX_RETURN_IF_ERROR(check_deferrable(*p));
    issue_or_defer(*p, [this, p, msg = wire::encode_notif(payload)]() mutable {
        send_ctrl(*p, std::move(msg));
    });
    if (p->state == Peer::State::kReady) progress_peer(*p, false, false);
    lock.unlock();
    wake();
    return Status();
}

Status Endpoint::Impl::copy(std::span<const LocalCopy> pieces) {
    if (pieces.size() > wire::kMaxSegments) {
        return invalid_argument(strformat("copy: %zu pieces exceed the limit of %zu", pieces.size(),
                                          wire::kMaxSegments));
    }
    // Resolve and hold every region first (a concurrent dereg waits for us), copy without the
    // lock (the progress thread goes on), then let go.
    std::vector<std::pair<Region*, Region*>> held;
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
            registry_.ref(*d);
            registry_.ref(*s);
            held.emplace_back(*d, *s);
        }
    }
    // Nothing is copied unless every piece resolved.
    for (size_t i = 0; i < held.size() && st.ok(); ++i) {
        const LocalCopy& c = pieces[i];
        if (c.len == 0) continue;
        Region* d = held[i].first;
        Region* s = held[i].second;
        uint8_t* to = d->base + c.dst_offset;
        const uint8_t* from = s->base + c.src_offset;
        if (d->kind == MemKind::kHost && s->kind == MemKind::kHost) {
            std::memmove(to, from, c.len);
        } else {
            st = cuda::device().copy(to, from, c.len).with_context("copy");
        }
    }
    auto lock = api_lock();
    for (auto [d, s] : held) {
        registry_.unref(d);
        registry_.unref(s);
    }
    return st;
}

std::vector<Notification> Endpoint::Impl::get_notifications() {
    std::unique_lock<std::mutex> lock(mu_, std::try_to_lock);
    if (!lock.owns_lock()) lock.lock();
    if (!own_progress_thread_) progress_once();
    std::vector<Notification> out;
    out.reserve(notifications_.size());
    for (QueuedNotification& q : notifications_) {
        auto it = peers_.find(q.peer);
        if (it != peers_.end()) {
            --it->second->notif_count;
            it->second->notif_bytes -= q.notification.payload.size();
        }
        out.push_back(std::move(q.notification));
    }
    notifications_.clear();
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
    x->wire_id = next_wire_id_++;
    x->tag = tag;
    x->len = len;
    hold(x, *r, offset, len);
    const XferId id = x->user_id;
    issue_or_defer(
        *p,
        [this, p, x, msg = wire::encode_send_rts(wire::SendRts{x->wire_id, tag, len})]() mutable {
            send_ctrl(*p, std::move(msg));
            x->waiting = true;
            p->awaiting.emplace(x->wire_id, x);
        });
    if (p->state == Peer::State::kReady) progress_peer(*p, false, false);
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
    x->wire_id = next_wire_id_++;
    x->tag = tag;
    x->len = len;
    x->waiting = true;
    hold(x, *r, offset, len);
    const XferId id = x->user_id;
    auto it = std::find_if(p->unexpected.begin(), p->unexpected.end(),
                           [&](const Peer::Rts& rts) { return rts.tag == tag; });
    if (it != p->unexpected.end()) {
        const Peer::Rts rts = *it;
        p->unexpected.erase(it);
        match(*p, x, rts);
    } else {
        p->posted_recvs.push_back(x);
    }
    progress_peer(*p, false, false);
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
        send_ctrl(p, wire::encode_recv_cts(rts.send_xfer, recv->wire_id, st));
        recv->result = st;
        recv->waiting = false;
        maybe_finish(recv);
        return;
    }
    recv->len = rts.len;
    p.awaiting.emplace(recv->wire_id, recv);
    send_ctrl(p, wire::encode_recv_cts(rts.send_xfer, recv->wire_id, Status()));
}

// --- completion
// ------------------------------------------------------------------------------------

XferStatus Endpoint::Impl::poll(XferId xfer) {
    XferState state;
    if (xfers_->state(xfer, &state) && state == XferState::kInProgress && !own_progress_thread_) {
        std::unique_lock<std::mutex> lock(mu_, std::try_to_lock);
        if (lock.owns_lock()) progress_once();
    }
    if (!xfers_->state(xfer, &state)) {
        auto lock = api_lock();
        return xfers_->take(xfer);  // reports NOT_FOUND
    }
    if (state == XferState::kInProgress) return XferStatus{};
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

// --- the data channels
// -----------------------------------------------------------------------------

bool Endpoint::Impl::progress_channel(Peer& p, Channel& ch, bool tx) {
    using engine::OpPath;
    const char* what = tx ? "data channel send" : "data channel receive";
    auto failed = [&](Status st) {
        fail_peer(p, st.with_context(what));
        return true;
    };
    bool did = false;
    // Completions, oldest first (some transports require that order).
    while (!ch.inflight.empty()) {
        bool done = false;
        size_t size = 0;
        Status st = net_->test(ch.inflight.front().req, &done, &size);
        if (!st.ok()) {
            // The request is gone with its error (the Net contract): it must not be tested
            // again when the peer's channels are wound down.
            ch.inflight.pop_front();
            --active_ops_;
            return failed(st);
        }
        if (!done) break;
        Channel::InFlight f = ch.inflight.front();
        ch.inflight.pop_front();
        ch.last_progress = Clock::now();
        did = true;
        // Both sides cut the same chunks: a receive of any other size means the streams are out
        // of step (or the transport is broken), and no later chunk can be trusted to land right.
        if (!tx && props_.reports_sizes && size != f.op.len) {
            return failed(
                protocol_error(strformat("received %zu bytes where the chunk has %llu", size,
                                         static_cast<unsigned long long>(f.op.len))));
        }
        if (tx) {
            // The transport is done with the bytes: a staging slot can take the next chunk.
            if (f.op.slot >= 0) ch.ring->release(f.op.slot);
            op_done(f.op);
            continue;
        }
        st = start_finishing(ch, f);
        if (!st.ok()) return failed(st);
        ch.finishing.push_back(f);
    }
    // Receives are handed back to the transport oldest first, once their bytes are where they
    // belong (Google's TCPX recycles the pages an unpack reads at irecv_consumed()).
    while (!ch.finishing.empty()) {
        const Channel::InFlight f = ch.finishing.front();
        if (f.op.slot >= 0) {
            auto ready = ch.ring->ready(f.op.slot);
            if (!ready.ok()) return failed(ready.status());
            if (!*ready) break;
            ch.ring->release(f.op.slot);
        }
        ch.finishing.pop_front();
        ch.last_progress = Clock::now();
        Status st = net_->irecv_consumed(ch.recv, 1, f.req);
        if (!st.ok()) return failed(st);
        if (f.op.ptr == nullptr) ch.scratch_busy = false;
        did = true;
        op_done(f.op);
    }
    // Sends from GPU memory through staging: copy chunks into free slots ahead of the wire, so
    // the copy of one chunk overlaps the sending of the previous ones.
    while (tx && ch.staged_ahead < ch.queued.size()) {
        Op& op = ch.queued[ch.staged_ahead];
        if (op.path == OpPath::kStaged) {
            Status st = ensure_ring(ch, tx, op);
            if (!st.ok()) return failed(st);
            if (!ch.ring->has_free()) break;
            op.slot = ch.ring->acquire();
            st = ch.ring->copy_in(op.slot, op.ptr, op.len);
            if (!st.ok()) return failed(st);
            did = true;
        }
        ++ch.staged_ahead;
    }
    while (!ch.queued.empty() &&
           ch.inflight.size() + ch.finishing.size() < static_cast<size_t>(window_)) {
        Op& op = ch.queued.front();
        uint8_t* ptr = op.ptr;
        net::MemHandle* mh = nullptr;
        int rx_slot = -1;
        if (tx && ch.staged_ahead == 0) break;  // its staging slot is not free yet
        if (op.path == OpPath::kStaged) {
            if (tx) {
                auto ready = ch.ring->ready(op.slot);
                if (!ready.ok()) return failed(ready.status());
                if (!*ready) break;  // the copy into the slot is still running
                ptr = ch.ring->slot(op.slot);
            } else {
                Status st = ensure_ring(ch, tx, op);
                if (!st.ok()) return failed(st);
                if (!ch.ring->has_free()) break;
                rx_slot = ch.ring->next();
                ptr = ch.ring->slot(rx_slot);
            }
            mh = ch.ring_mr;
        } else {
            if (ptr == nullptr) {
                // Draining a refused write: one scratch receive at a time per channel, so no two
                // transport requests ever write the scratch buffer at once.
                if (ch.scratch_busy) break;
                if (!ch.scratch) ch.scratch.reset(new uint8_t[p.chunk]);
                ptr = ch.scratch.get();
            }
            if (op.path == OpPath::kUnpack) {
                // Read the plugin's unpack queue before the first receive needs it.
                Status st = ensure_ring(ch, tx, op);
                if (!st.ok()) return failed(st);
            }
            auto mr = mr_for(ch, tx, op, p.chunk);
            if (!mr.ok()) {
                return failed(Status(mr.status()).with_context("registering memory"));
            }
            mh = *mr;
        }
        net::Request* req = nullptr;
        Status st;
        if (tx) {
            st = net_->isend(ch.send, ptr, op.len, 0, mh, &req);
        } else {
            void* data = ptr;
            size_t size = op.len;
            int tag = 0;
            st = net_->irecv(ch.recv, 1, &data, &size, &tag, &mh, &req);
        }
        if (!st.ok()) return failed(st);
        if (req == nullptr) break;  // the transport is full: later
        if (rx_slot >= 0) op.slot = ch.ring->acquire();
        if (op.ptr == nullptr) ch.scratch_busy = true;
        if (ch.inflight.empty()) ch.last_progress = Clock::now();
        ch.inflight.push_back(Channel::InFlight{op, req});
        ch.queued.pop_front();
        if (tx) --ch.staged_ahead;
        did = true;
    }
    return did;
}

Status Endpoint::Impl::start_finishing(Channel& ch, Channel::InFlight& f) {
    using engine::OpPath;
    switch (f.op.path) {
        case OpPath::kStaged:
            return ch.ring->copy_out(f.op.slot, f.op.ptr, f.op.len);
        case OpPath::kUnpack: {
            // The plugin wrote the count when test() reported the receive: read it and the list
            // here, and hand them to the GPU in one copy.
            TCPX_ASSIGN_OR_RETURN(net::UnpackSlot q, net_->unpack_slot(ch.recv, f.req));
            if (!ch.ring->has_free()) return internal_error("no unpack slot free in the window");
            f.op.slot = ch.ring->acquire();
            return ch.ring->unpack(f.op.slot, static_cast<const cuda::LoadMeta*>(q.entries),
                                   *q.count, ch.unpack.bounce_buf, f.op.ptr, f.op.len);
        }
        default:
            return Status();
    }
}

Status Endpoint::Impl::ensure_ring(Channel& ch, bool tx, const Op& op) {
    using engine::OpPath;
    const int device = op.region->device;
    if (ch.ring) {
        if (op.path == OpPath::kUnpack && ch.ring->device() != device) {
            return failed_precondition(strformat(
                "a receive into GPU %d on a channel whose receives land on GPU %d: register "
                "memory of the GPU the endpoint serves",
                device, ch.ring->device()));
        }
        return Status();
    }
    void* comm = tx ? static_cast<void*>(ch.send) : static_cast<void*>(ch.recv);
    if (op.path == OpPath::kStaged) {
        TCPX_ASSIGN_OR_RETURN(ch.ring, cuda::device().make_ring(device, chunk_, staging_slots_));
        Status st =
            net_->reg_mr(comm, ch.ring->base(), ch.ring->bytes(), net::MemType::kHost, &ch.ring_mr);
        if (!st.ok()) {
            ch.ring.reset();
            return st.with_context("registering the staging slots");
        }
        return Status();
    }
    // UNPACK: the device handle points to the plugin's unpack queue descriptor, in GPU memory.
    const net::DeviceHandle& h = ch.dev_handle;
    if (h.version != cuda::kUnpackVersion || h.handle == nullptr ||
        h.size < sizeof(cuda::UnpackHandle)) {
        return unimplemented(strformat(
            "the transport hands CUDA receives over as UNPACK version %d (handle %p, %zu bytes); "
            "tcpx-p2p reads version %d",
            h.version, h.handle, h.size, cuda::kUnpackVersion));
    }
    TCPX_RETURN_IF_ERROR(cuda::device().copy(&ch.unpack, h.handle, sizeof(cuda::UnpackHandle)));
    if (ch.unpack.meta == nullptr || ch.unpack.bounce_buf == nullptr) {
        return protocol_error("the transport's unpack queue has no metadata or bounce buffer");
    }
    const cuda::PointerInfo bounce = cuda::classify(ch.unpack.bounce_buf);
    if (bounce.kind == MemKind::kCuda && bounce.device != device) {
        return failed_precondition(strformat(
            "receives land on GPU %d but the registration is on GPU %d: set GPU_INDEX to the "
            "GPU whose memory the endpoint moves",
            bounce.device, device));
    }
    TCPX_ASSIGN_OR_RETURN(ch.ring, cuda::device().make_ring(device, 0, window_));
    return Status();
}

StatusOr<net::MemHandle*> Endpoint::Impl::mr_for(Channel& ch, bool tx, const Op& op,
                                                 uint64_t scratch_len) {
    using engine::OpPath;
    void* comm = tx ? static_cast<void*>(ch.send) : static_cast<void*>(ch.recv);
    if (op.region == nullptr) {
        if (ch.scratch_mr == nullptr) {
            TCPX_RETURN_IF_ERROR(net_->reg_mr(comm, ch.scratch.get(), scratch_len,
                                              net::MemType::kHost, &ch.scratch_mr));
        }
        return ch.scratch_mr;
    }
    // A region larger than the transport registers at once is registered in windows, each on
    // first use; the one chosen holds all of this request's bytes, so the handle covers them.
    const bool page_cover = op.path == OpPath::kDevice || op.path == OpPath::kUnpack;
    TCPX_ASSIGN_OR_RETURN(
        const engine::RegWindows windows,
        engine::RegWindows::make(reinterpret_cast<uintptr_t>(op.region->base), op.region->len,
                                 props_.max_reg_size, chunk_, page_cover));
    TCPX_ASSIGN_OR_RETURN(const size_t index,
                          windows.find(reinterpret_cast<uintptr_t>(op.ptr), op.len));
    auto& by_window = ch.mrs[op.region];
    auto it = by_window.find(index);
    if (it != by_window.end()) return it->second;
    // Google's TCPX registers GPU memory by whole 4 KiB pages from an aligned pointer: GPU windows
    // are cut from the page-aligned cover of the region (inside the same allocation, whose
    // granularity is coarser). Only the region's own bytes are ever sent or received.
    const engine::RegWindows::Window w = windows.window(index);
    const net::MemType type = page_cover ? net::MemType::kCuda : net::MemType::kHost;
    net::MemHandle* mh = nullptr;
    Status st = net_->reg_mr(comm, reinterpret_cast<void*>(w.base), w.len, type, &mh);
    if (!st.ok()) {
        if (by_window.empty()) ch.mrs.erase(op.region);
        return st;
    }
    by_window.emplace(index, mh);
    return mh;
}

void Endpoint::Impl::drop_mrs(Channel& ch, bool tx) {
    void* comm = tx ? static_cast<void*>(ch.send) : static_cast<void*>(ch.recv);
    if (comm == nullptr) return;
    for (auto& [region, by_window] : ch.mrs) {
        for (auto& [index, mh] : by_window) (void)net_->dereg_mr(comm, mh);
    }
    ch.mrs.clear();
    if (ch.scratch_mr != nullptr) (void)net_->dereg_mr(comm, ch.scratch_mr);
    ch.scratch_mr = nullptr;
    if (ch.ring_mr != nullptr) (void)net_->dereg_mr(comm, ch.ring_mr);
    ch.ring_mr = nullptr;
}

// A region is being freed: no request uses it any more (its transfers held references), so its
// registrations with every comm can go.
void Endpoint::Impl::forget_region(Region* r) {
    for (auto& [id, p] : peers_) {
        for (bool tx : {true, false}) {
            for (Channel& ch : tx ? p->tx : p->rx) {
                auto it = ch.mrs.find(r);
                if (it == ch.mrs.end()) continue;
                void* comm = tx ? static_cast<void*>(ch.send) : static_cast<void*>(ch.recv);
                if (comm != nullptr) {
                    for (auto& [index, mh] : it->second) (void)net_->dereg_mr(comm, mh);
                }
                ch.mrs.erase(it);
            }
        }
    }
}

// --- control messages
// ------------------------------------------------------------------------------

Status Endpoint::Impl::dispatch(Peer& p, const wire::Header& h, std::string_view body) {
    // Only ready peers come here (engine_handshake.cc takes the rest).
    const auto type = static_cast<wire::MsgType>(h.type);
    switch (type) {
        case wire::MsgType::kPing:
            return Status();
        case wire::MsgType::kBye:
            return unavailable("peer disconnected");
        case wire::MsgType::kWriteReq:
            return on_write_req(p, h.flags, body);
        case wire::MsgType::kWriteAck:
            return on_write_ack(p, body);
        case wire::MsgType::kReadReq:
            return on_read_req(p, body);
        case wire::MsgType::kReadResp:
            return on_read_resp(p, h.flags, body);
        case wire::MsgType::kNotif: {
            std::string_view payload;
            TCPX_RETURN_IF_ERROR(wire::decode_notif(body, &payload));
            // Nothing answers a standalone notification: one we cannot hold fails the peer.
            TCPX_RETURN_IF_ERROR(notification_room(p, payload.size()));
            queue_notification(p, std::string(payload), false);
            return Status();
        }
        case wire::MsgType::kSendRts:
            return on_send_rts(p, body);
        case wire::MsgType::kRecvCts:
            return on_recv_cts(p, body);
        case wire::MsgType::kSendData:
            return on_send_data(p, h.flags, body);
        default:
            return protocol_error(
                strformat("unexpected %s (type %u)", wire::msg_type_name(type), h.type));
    }
}

Status Endpoint::Impl::notification_room(const Peer& p, uint64_t size) const {
    if (size > config_.max_notification_size) {
        return resource_exhausted(
            strformat("a notification of %llu bytes exceeds TCPX_P2P_MAX_NOTIFICATION_SIZE (%llu)",
                      static_cast<unsigned long long>(size),
                      static_cast<unsigned long long>(config_.max_notification_size)));
    }
    if (p.notif_count + 1 > static_cast<uint64_t>(config_.max_queued_notifications) ||
        p.notif_bytes + size > config_.max_queued_notification_bytes) {
        return resource_exhausted(strformat(
            "the application has not taken %llu notifications (%llu bytes) from this peer: "
            "TCPX_P2P_MAX_QUEUED_NOTIFICATIONS / _BYTES reached",
            static_cast<unsigned long long>(p.notif_count),
            static_cast<unsigned long long>(p.notif_bytes)));
    }
    return Status();
}

void Endpoint::Impl::queue_notification(Peer& p, std::string payload, bool held) {
    if (!held) {
        ++p.notif_count;
        p.notif_bytes += payload.size();
    }
    notifications_.push_back(QueuedNotification{p.id, Notification{p.name, std::move(payload)}});
}

// A peer may not make us hold more of its requests at once than our own transfer limit.
Status Endpoint::Impl::check_serving_limit(const Peer& p) const {
    if (p.xfers.size() >= static_cast<size_t>(config_.max_transfers)) {
        return resource_exhausted(
            strformat("the peer has more than %lld requests in flight (TCPX_P2P_MAX_TRANSFERS)",
                      static_cast<long long>(config_.max_transfers)));
    }
    return Status();
}

Status Endpoint::Impl::on_write_req(Peer& p, uint16_t flags, std::string_view body) {
    wire::WriteReq req;
    TCPX_RETURN_IF_ERROR(wire::decode_write_req(body, flags, &req));
    TCPX_RETURN_IF_ERROR(check_serving_limit(p));
    TCPX_ASSIGN_OR_RETURN(Xfer * x, new_xfer(Xfer::Kind::kServeWrite, p, false));
    x->wire_id = req.xfer;
    x->has_notification = (flags & wire::kFlagNotif) != 0;
    x->notification = std::string(req.notification);
    // Every segment is checked before any byte lands.
    std::vector<Region*> regions;
    for (const wire::Segment& s : req.segs) {
        auto r = registry_.resolve_key(s.key, s.offset, s.len);
        if (!r.ok()) {
            x->result = Status(r.status()).with_context("write refused");
            break;
        }
        regions.push_back(*r);
    }
    // Its notification must have room before any byte lands; the room is held from now on.
    if (x->result.ok() && x->has_notification) {
        Status room = notification_room(p, x->notification.size());
        if (!room.ok()) {
            x->result = room.with_context("write refused");
        } else {
            ++p.notif_count;
            p.notif_bytes += x->notification.size();
            x->notification_held = true;
        }
    }
    const bool ok = x->result.ok();
    if (ok) {
        for (size_t i = 0; i < req.segs.size(); ++i) {
            hold(x, regions[i], req.segs[i].offset, req.segs[i].len);
        }
    } else if (!(flags & wire::kFlagInline)) {
        // A refused write's data is on its way and must be drained to keep the channels in step;
        // past MAX_DRAIN_BYTES that is not worth it: the peer goes instead.
        uint64_t total = 0;
        for (const wire::Segment& s : req.segs) total += s.len;  // no overflow: decode checked
        if (total > config_.max_drain_bytes) {
            Status why = x->result;
            destroy(x);
            return why.with_context(
                strformat("and its %llu bytes exceed TCPX_P2P_MAX_DRAIN_BYTES (%llu)",
                          static_cast<unsigned long long>(total),
                          static_cast<unsigned long long>(config_.max_drain_bytes)));
        }
    }
    if (flags & wire::kFlagInline) {
        if (ok) {
            uint64_t at = 0;
            for (const Xfer::Piece& piece : x->pieces) {
                Status st =
                    write_region(piece.region, piece.offset, req.data.data() + at, piece.len);
                if (!st.ok()) {
                    x->result = st.with_context("write failed");
                    break;
                }
                at += piece.len;
            }
        }
    } else {
        // The data is on its way whatever we think of the request: receive it where it belongs,
        // or into scratch if refused, so the channels stay in step.
        for (size_t i = 0; i < req.segs.size(); ++i) {
            Region* r = ok ? regions[i] : nullptr;
            uint8_t* dst = ok ? regions[i]->base + req.segs[i].offset : nullptr;
            queue_chunks(p, false, x, r, dst, req.segs[i].len);
        }
    }
    maybe_finish(x);
    return Status();
}

// The transfer of ours that a reply names: it must be waiting for exactly that kind of reply.
StatusOr<Endpoint::Impl::Xfer*> Endpoint::Impl::take_awaiting(Peer& p, uint64_t wire_id,
                                                              Xfer::Kind kind, const char* what) {
    auto it = p.awaiting.find(wire_id);
    if (it == p.awaiting.end() || it->second->kind != kind) {
        return protocol_error(strformat("%s for unknown transfer %llu", what,
                                        static_cast<unsigned long long>(wire_id)));
    }
    Xfer* x = it->second;
    p.awaiting.erase(it);
    x->waiting = false;
    return x;
}

Status Endpoint::Impl::on_write_ack(Peer& p, std::string_view body) {
    wire::WriteAck ack;
    TCPX_RETURN_IF_ERROR(wire::decode_write_ack(body, &ack));
    TCPX_ASSIGN_OR_RETURN(Xfer * x, take_awaiting(p, ack.xfer, Xfer::Kind::kWrite, "WRITE_ACK"));
    if (x->result.ok()) x->result = wire::to_status(ack.result, "peer '" + p.name + "'");
    maybe_finish(x);
    return Status();
}

Status Endpoint::Impl::on_read_req(Peer& p, std::string_view body) {
    wire::ReadReq req;
    TCPX_RETURN_IF_ERROR(wire::decode_read_req(body, &req));
    TCPX_RETURN_IF_ERROR(check_serving_limit(p));
    std::vector<Region*> regions;
    Status refused;
    uint64_t total = 0;
    for (const wire::Segment& s : req.segs) {
        auto r = registry_.resolve_key(s.key, s.offset, s.len);
        if (!r.ok()) {
            refused = Status(r.status()).with_context("read refused");
            break;
        }
        regions.push_back(*r);
        total += s.len;
    }
    if (!refused.ok()) {
        std::string msg = wire::encode_read_resp(req.xfer, 0, refused);
        wire::end_message(&msg);
        send_ctrl(p, std::move(msg));
        return Status();
    }
    if (total <= inline_limit()) {
        std::string payload;
        Status st;
        for (size_t i = 0; i < req.segs.size() && st.ok(); ++i) {
            st = append_region(&payload, regions[i], req.segs[i].offset, req.segs[i].len);
        }
        std::string msg = st.ok()
                              ? wire::encode_read_resp(req.xfer, wire::kFlagInline, Status())
                              : wire::encode_read_resp(req.xfer, 0, st.with_context("read failed"));
        if (st.ok()) msg.append(payload);
        wire::end_message(&msg);
        send_ctrl(p, std::move(msg));
        return Status();
    }
    std::string msg = wire::encode_read_resp(req.xfer, 0, Status());
    wire::end_message(&msg);
    send_ctrl(p, std::move(msg));
    TCPX_ASSIGN_OR_RETURN(Xfer * x, new_xfer(Xfer::Kind::kServeRead, p, false));
    x->wire_id = req.xfer;
    for (size_t i = 0; i < req.segs.size(); ++i) {
        hold(x, regions[i], req.segs[i].offset, req.segs[i].len);
        queue_chunks(p, true, x, regions[i], regions[i]->base + req.segs[i].offset,
                     req.segs[i].len);
    }
    maybe_finish(x);
    return Status();
}

Status Endpoint::Impl::on_read_resp(Peer& p, uint16_t flags, std::string_view body) {
    wire::ReadResp resp;
    TCPX_RETURN_IF_ERROR(wire::decode_read_resp(body, flags, &resp));
    TCPX_ASSIGN_OR_RETURN(Xfer * x, take_awaiting(p, resp.xfer, Xfer::Kind::kRead, "READ_RESP"));
    Status st = wire::to_status(resp.result, "peer '" + p.name + "'");
    if (!st.ok()) {
        x->result = st;
    } else if (flags & wire::kFlagInline) {
        uint64_t total = 0;
        for (const Xfer::Piece& piece : x->pieces) total += piece.len;
        if (resp.data.size() != total) {
            return protocol_error(strformat("READ_RESP carries %zu bytes for a read of %llu",
                                            resp.data.size(),
                                            static_cast<unsigned long long>(total)));
        }
        uint64_t at = 0;
        for (const Xfer::Piece& piece : x->pieces) {
            Status copied =
                write_region(piece.region, piece.offset, resp.data.data() + at, piece.len);
            if (!copied.ok()) {
                x->result = copied.with_context("read");
                break;
            }
            at += piece.len;
        }
    } else {
        for (const Xfer::Piece& piece : x->pieces) {
            queue_chunks(p, false, x, piece.region, piece.region->base + piece.offset, piece.len);
        }
    }
    maybe_finish(x);
    return Status();
}

Status Endpoint::Impl::on_send_rts(Peer& p, std::string_view body) {
    wire::SendRts rts;
    TCPX_RETURN_IF_ERROR(wire::decode_send_rts(body, &rts));
    auto it = std::find_if(p.posted_recvs.begin(), p.posted_recvs.end(),
                           [&](const Xfer* x) { return x->tag == rts.tag; });
    if (it == p.posted_recvs.end()) {
        // Bounded: a peer cannot make us hold more unmatched sends than transfers it may have.
        if (p.unexpected.size() >= static_cast<size_t>(config_.max_transfers)) {
            return resource_exhausted("too many unmatched sends from the peer");
        }
        p.unexpected.push_back(Peer::Rts{rts.send_xfer, rts.tag, rts.len});
        return Status();
    }
    Xfer* recv = *it;
    p.posted_recvs.erase(it);
    match(p, recv, Peer::Rts{rts.send_xfer, rts.tag, rts.len});
    return Status();
}

Status Endpoint::Impl::on_recv_cts(Peer& p, std::string_view body) {
    wire::RecvCts cts;
    TCPX_RETURN_IF_ERROR(wire::decode_recv_cts(body, &cts));
    TCPX_ASSIGN_OR_RETURN(Xfer * x, take_awaiting(p, cts.send_xfer, Xfer::Kind::kSend, "RECV_CTS"));
    Status st = wire::to_status(cts.result, "peer '" + p.name + "'");
    if (!st.ok()) {
        x->result = st;
        maybe_finish(x);
        return Status();
    }
    const Xfer::Piece& piece = x->pieces.front();
    const bool is_inline = x->len <= inline_limit();
    std::string payload;
    if (is_inline) {
        Status copied = append_region(&payload, piece.region, piece.offset, x->len);
        if (!copied.ok()) {
            // The receiver expects SEND_DATA for this send: without its bytes the pair cannot
            // complete, so the connection goes.
            return copied.with_context("send");
        }
    }
    std::string msg =
        wire::encode_send_data(cts.recv_xfer, is_inline ? wire::kFlagInline : 0, x->len);
    msg.append(payload);
    wire::end_message(&msg);
    send_ctrl(p, std::move(msg));
    if (!is_inline) {
        queue_chunks(p, true, x, piece.region, piece.region->base + piece.offset, x->len);
    }
    maybe_finish(x);
    return Status();
}

Status Endpoint::Impl::on_send_data(Peer& p, uint16_t flags, std::string_view body) {
    wire::SendData data;
    TCPX_RETURN_IF_ERROR(wire::decode_send_data(body, flags, &data));
    auto it = p.awaiting.find(data.recv_xfer);
    if (it != p.awaiting.end() && it->second->kind == Xfer::Kind::kRecv &&
        data.len != it->second->len) {
        return protocol_error(strformat("SEND_DATA of %llu bytes for a send of %llu",
                                        static_cast<unsigned long long>(data.len),
                                        static_cast<unsigned long long>(it->second->len)));
    }
    TCPX_ASSIGN_OR_RETURN(Xfer * x,
                          take_awaiting(p, data.recv_xfer, Xfer::Kind::kRecv, "SEND_DATA"));
    const Xfer::Piece& piece = x->pieces.front();
    if (flags & wire::kFlagInline) {
        Status st = write_region(piece.region, piece.offset, data.data.data(), data.len);
        if (!st.ok()) x->result = st.with_context("recv");
    } else {
        queue_chunks(p, false, x, piece.region, piece.region->base + piece.offset, data.len);
    }
    maybe_finish(x);
    return Status();
}

}  // namespace tcpx
