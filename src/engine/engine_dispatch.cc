// The control messages of a ready peer: one handler per message, each validating what the
// peer sent before acting on it (the handshake's messages are in engine_handshake.cc).
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
using engine::Region;
namespace wire = engine::wire;

// --- control messages
// ------------------------------------------------------------------------------

Status Endpoint::Impl::dispatch(Peer& p, const wire::Header& h, std::string_view body) {
    // Only ready peers come here (engine_handshake.cc takes the rest).
    const auto type = static_cast<wire::MsgType>(h.type);
    switch (type) {
        case wire::MsgType::kPing: {
            std::optional<uint64_t> moved;
            TCPX_RETURN_IF_ERROR(wire::decode_ping(body, &moved));
            // Chunks moved on its side: it is serving what it owes us (step_peer's deadline).
            if (moved && *moved != p.peer_moved) {
                p.peer_moved = *moved;
                p.last_answer = Clock::now();
            }
            return Status();
        }
        case wire::MsgType::kBye: {
            std::string_view reason;
            TCPX_RETURN_IF_ERROR(wire::decode_bye(body, &reason));
            if (reason.empty()) return unavailable("peer disconnected");
            // The peer's words (printable characters only): why it ended the connection.
            return unavailable("peer disconnected: " + printable(reason));
        }
        case wire::MsgType::kWriteReq:
            return on_write_req(p, h.flags, body);
        case wire::MsgType::kWriteAck:
            return on_write_ack(p, body);
        case wire::MsgType::kReadReq:
            return on_read_req(p, h.flags, body);
        case wire::MsgType::kReadResp:
            return on_read_resp(p, h.flags, body);
        case wire::MsgType::kReadDone:
            return on_read_done(p, body);
        case wire::MsgType::kNotif: {
            std::string_view payload;
            TCPX_RETURN_IF_ERROR(wire::decode_notif(body, &payload));
            // Nothing answers a standalone notification, so there is no one to refuse: one
            // that finds no room waits, and we stop reading the peer until the application
            // makes room (read_control hands the message out again then). One that the
            // application's taking could never make room for fails the peer, as before.
            if (!fits_notification(p, payload.size())) {
                if (!fits_once_taken(p, payload.size())) {
                    Status room = notification_room(p, payload.size());
                    return room.ok() ? internal_error("notification room") : room;
                }
                return pause_control(p, payload.size());
            }
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

Status Endpoint::Impl::check_notification_size(uint64_t size) const {
    if (size > config_.max_notification_size) {
        return resource_exhausted(
            strformat("a notification of %llu bytes exceeds TCPX_P2P_MAX_NOTIFICATION_SIZE (%llu)",
                      static_cast<unsigned long long>(size),
                      static_cast<unsigned long long>(config_.max_notification_size)));
    }
    return Status();
}

bool Endpoint::Impl::within_peer_bound(engine::NotificationTally held,
                                       uint64_t size) const noexcept {
    return held.count + 1 <= static_cast<uint64_t>(config_.max_queued_notifications) &&
           held.bytes + size <= config_.max_queued_notification_bytes;
}

bool Endpoint::Impl::within_endpoint_bound(engine::NotificationTally held,
                                           uint64_t size) const noexcept {
    return held.count + 1 <= static_cast<uint64_t>(config_.max_queued_notifications_total) &&
           held.bytes + size <= config_.max_queued_notification_bytes_total;
}

engine::NotificationTally Endpoint::Impl::endpoint_held() const noexcept {
    return {notifications_.size() + held_notifications_.count,
            notifications_.bytes() + held_notifications_.bytes};
}

Status Endpoint::Impl::notification_room(const Peer& p, uint64_t size) const {
    TCPX_RETURN_IF_ERROR(check_notification_size(size));
    if (!within_peer_bound({p.notif_count, p.notif_bytes}, size)) {
        return resource_exhausted(strformat(
            "the application has not taken %llu notifications (%llu bytes) from this peer: "
            "TCPX_P2P_MAX_QUEUED_NOTIFICATIONS / _BYTES reached",
            static_cast<unsigned long long>(p.notif_count),
            static_cast<unsigned long long>(p.notif_bytes)));
    }
    // And for all peers together: the per-peer bound alone would multiply with the peers at
    // once, and with every peer that came and went leaving its notifications behind.
    const engine::NotificationTally all = endpoint_held();
    if (!within_endpoint_bound(all, size)) {
        return resource_exhausted(strformat(
            "the application has not taken %llu notifications (%llu bytes) from all peers: "
            "TCPX_P2P_MAX_QUEUED_NOTIFICATIONS_TOTAL / _BYTES_TOTAL reached",
            static_cast<unsigned long long>(all.count),
            static_cast<unsigned long long>(all.bytes)));
    }
    return Status();
}

bool Endpoint::Impl::fits_notification(const Peer& p, uint64_t size) const noexcept {
    return size <= config_.max_notification_size &&
           within_peer_bound({p.notif_count, p.notif_bytes}, size) &&
           within_endpoint_bound(endpoint_held(), size);
}

engine::NotificationTally Endpoint::Impl::read_room(const Peer& p) noexcept {
    engine::NotificationTally t;
    t.count = p.read_notifs.size();
    for (const auto& [id, held] : p.read_notifs) t.bytes += held.payload.size();
    return t;
}

bool Endpoint::Impl::fits_once_taken(const Peer& p, uint64_t size) const noexcept {
    // (The room held for writes in flight comes free with their data, on the data channels.)
    // Of the endpoint-wide room, the peers already waiting need theirs too (paused_need_):
    // room held for their reads is freed only behind their own notes.
    const engine::NotificationTally own = read_room(p);
    return size <= config_.max_notification_size && within_peer_bound(own, size) &&
           within_endpoint_bound({own.count + paused_need_.count, own.bytes + paused_need_.bytes},
                                 size);
}

Status Endpoint::Impl::on_read_done(Peer& p, std::string_view body) {
    wire::ReadDone m;
    TCPX_RETURN_IF_ERROR(wire::decode_read_done(body, &m));
    auto it = p.read_notifs.find(m.xfer);
    if (it == p.read_notifs.end()) {
        return protocol_error("READ_DONE for a read whose notification we do not hold");
    }
    // Queued (a copy: out of memory, nothing has changed) before the entry goes.
    if (m.delivered) {
        queue_notification(p, it->second.payload, /*held=*/true);
    } else {
        --p.notif_count;
        p.notif_bytes -= it->second.payload.size();
    }
    if (it->second.gone != Clock::time_point{}) p.read_done_due.erase({it->second.gone, m.xfer});
    p.read_notifs.erase(it);  // its endpoint-wide room goes back; the queue counts it from here
    --p.answers_owed;
    p.last_answer = Clock::now();
    return Status();
}

void Endpoint::Impl::drop_read_notifications(Peer& p) {
    for (const auto& [id, held] : p.read_notifs) {
        --p.notif_count;
        p.notif_bytes -= held.payload.size();
    }
    p.answers_owed -= std::min<uint64_t>(p.answers_owed, p.read_notifs.size());
    p.read_notifs.clear();
    p.read_done_due.clear();
}

void Endpoint::Impl::read_data_gone(Peer& p, uint64_t xfer) {
    auto it = p.read_notifs.find(xfer);
    if (it == p.read_notifs.end() || it->second.gone != Clock::time_point{}) return;
    const auto now = Clock::now();
    p.read_done_due.emplace(now, xfer);  // (out of memory: nothing changed)
    it->second.gone = now;
}

void Endpoint::Impl::queue_notification(Peer& p, std::string payload, bool held) {
    if (!held) {
        ++p.notif_count;
        p.notif_bytes += payload.size();
    }
    notifications_.push_back(
        QueuedNotification{p.id, Notification{p.name, std::move(payload), p.id}});
}

// A peer may not make us hold more of its requests at once than our own transfer limit. Only
// its requests count: our own transfers to it are the application's, bounded on their own.
Status Endpoint::Impl::check_serving_limit(const Peer& p) const {
    if (p.served >= static_cast<uint64_t>(config_.max_transfers)) {
        return resource_exhausted(
            strformat("the peer has more than %lld requests in flight (TCPX_P2P_MAX_TRANSFERS)",
                      static_cast<long long>(config_.max_transfers)));
    }
    return Status();
}

Status Endpoint::Impl::served_room(const Peer& p, uint64_t pieces) const {
    // Each request is bounded (wire::kMaxSegments pieces), but a peer may have MAX_TRANSFERS of
    // them served at once, each holding its list until its data has moved.
    if (p.served_pieces + pieces > static_cast<uint64_t>(config_.max_served_pieces)) {
        return resource_exhausted(strformat(
            "the peer's requests in flight name more than %lld pieces (TCPX_P2P_MAX_SERVED_PIECES)",
            static_cast<long long>(config_.max_served_pieces)));
    }
    return total_served_room(pieces + engine::kServedRecordWeight);
}

Status Endpoint::Impl::hold_served_pieces(Peer& p, Xfer* x, uint64_t pieces) {
    TCPX_RETURN_IF_ERROR(served_room(p, pieces));
    served_weight_ += pieces + engine::kServedRecordWeight;
    p.served_pieces += pieces;
    x->served_pieces = pieces;
    x->served_weight = pieces + engine::kServedRecordWeight;
    return Status();
}

Status Endpoint::Impl::total_served_room(uint64_t weight) const {
    const auto limit = static_cast<uint64_t>(config_.max_served_pieces_total);
    if (served_weight_ > limit || weight > limit - served_weight_) {
        return resource_exhausted(strformat(
            "the requests of all peers being served, and their sends waiting for a receive, "
            "would weigh more than %llu pieces (TCPX_P2P_MAX_SERVED_PIECES_TOTAL; %llu held)",
            static_cast<unsigned long long>(limit),
            static_cast<unsigned long long>(served_weight_)));
    }
    return Status();
}

Status Endpoint::Impl::take_served_weight(uint64_t weight) {
    TCPX_RETURN_IF_ERROR(total_served_room(weight));
    served_weight_ += weight;
    return Status();
}

Status Endpoint::Impl::check_request_chunk(const Peer& p, uint64_t chunk, const char* what) const {
    // Larger chunks than agreed would overrun the staging and scratch buffers sized by it.
    if (chunk > p.chunk) {
        return protocol_error(strformat("%s asks for chunks of %llu bytes; %llu were agreed", what,
                                        static_cast<unsigned long long>(chunk),
                                        static_cast<unsigned long long>(p.chunk)));
    }
    return Status();
}

Status Endpoint::Impl::on_write_req(Peer& p, uint16_t flags, std::string_view body) {
    wire::WriteReq req;
    TCPX_RETURN_IF_ERROR(wire::decode_write_req(body, flags, &req));
    TCPX_RETURN_IF_ERROR(check_serving_limit(p));
    TCPX_RETURN_IF_ERROR(check_request_chunk(p, req.chunk, "WRITE_REQ"));
    // A notification larger than any we accept fails the peer, as a standalone one does: its
    // write's data may still have to drain, and the peer would choose how long we hold it.
    TCPX_RETURN_IF_ERROR(check_notification_size(req.notification.size()));
    TCPX_ASSIGN_OR_RETURN(Xfer * x, new_xfer(Xfer::Kind::kServeWrite, p, false));
    TCPX_RETURN_IF_ERROR(hold_served_pieces(p, x, req.segs.size()));  // (fails the peer)
    x->wire_id = req.xfer;
    if (req.chunk != 0) x->chunk = req.chunk;
    x->has_notification = (flags & wire::kFlagNotif) != 0;
    // Every segment is checked before any byte lands.
    std::vector<Region*> regions;
    for (size_t i = 0; i < req.segs.size(); ++i) {
        const wire::Segment& s = req.segs[i];
        auto r = registry_.resolve_key(s.key, s.offset, s.len);
        if (!r.ok()) {
            x->result = Status(r.status()).with_context(strformat("write refused: piece %zu", i));
            break;
        }
        regions.push_back(*r);
    }
    // Its notification must have room before any byte lands; the room is held from now on.
    // Only a write that will deliver its notification keeps it: a refused one holds none while
    // its data drains.
    if (x->result.ok() && x->has_notification) {
        Status room = notification_room(p, req.notification.size());
        if (!room.ok()) {
            x->result = room.with_context("write refused");
        } else {
            x->notification = std::string(req.notification);
            ++p.notif_count;
            p.notif_bytes += x->notification.size();
            x->notification_held = true;
            x->endpoint_notification_room =
                engine::HeldNotificationRoom(&held_notifications_, x->notification.size());
        }
    }
    const bool ok = x->result.ok();
    if (ok) {
        for (size_t i = 0; i < req.segs.size(); ++i) {
            hold(x, regions[i], req.segs[i].offset, req.segs[i].len);
        }
    } else if (!(flags & wire::kFlagInline) && regions.size() != req.segs.size()) {
        // A refused write's data is on its way and must be drained to keep the channels in step;
        // past MAX_DRAIN_BYTES that is not worth it: the peer goes instead. Not so for a write
        // whose every piece is registered memory, refused only for its notification's room: its
        // bytes are no more than the peer could write by right, and failing the connection for
        // an application behind on its notifications would fail every transfer on it.
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
        if (const size_t on_gpu = gpu_pieces(regions); ok && on_gpu > wire::kMaxInlineGpuPieces) {
            x->result = invalid_argument(
                strformat("write refused: %zu pieces inline into GPU memory (at most %zu)", on_gpu,
                          wire::kMaxInlineGpuPieces));
        } else if (ok) {
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
        if (!ok) {
            // Pieces without a region: the same lengths, so the same chunks, into scratch.
            for (const wire::Segment& seg : req.segs) {
                x->pieces.push_back(Xfer::Piece{nullptr, 0, seg.len});
            }
        }
        queue_chunks(p, false, x);
    }
    maybe_finish(x);
    return Status();
}

// A send waits for its receive to be posted, which is the peer application's business and may
// take any time; a write's acknowledgement, a read's response and a matched receive's data the
// peer owes us at once (it serves them as soon as they arrive).
static bool owes_prompt_answer(engine::Xfer::Kind kind) {
    return kind != engine::Xfer::Kind::kSend;
}

void Endpoint::Impl::await_reply(Peer& p, Xfer* x) {
    p.awaiting.emplace(x->wire_id, x);
    if (!owes_prompt_answer(x->kind)) return;
    // The peer's answer clock starts when it comes to owe one (it owed nothing before).
    if (p.answers_owed++ == 0) p.last_answer = Clock::now();
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
    if (owes_prompt_answer(kind)) {
        --p.answers_owed;
        p.last_answer = Clock::now();
    }
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

Status Endpoint::Impl::on_read_req(Peer& p, uint16_t flags, std::string_view body) {
    wire::ReadReq req;
    TCPX_RETURN_IF_ERROR(wire::decode_read_req(body, flags, &req));
    TCPX_RETURN_IF_ERROR(check_request_chunk(p, req.chunk, "READ_REQ"));
    TCPX_RETURN_IF_ERROR(check_serving_limit(p));
    std::vector<Region*> regions;
    Status refused;
    uint64_t total = 0;
    for (size_t i = 0; i < req.segs.size(); ++i) {
        const wire::Segment& s = req.segs[i];
        auto r = registry_.resolve_key(s.key, s.offset, s.len);
        if (!r.ok()) {
            refused = Status(r.status()).with_context(strformat("read refused: piece %zu", i));
            break;
        }
        regions.push_back(*r);
        total += s.len;  // no overflow: decode checked
    }
    // Its notification, if any, must have room before any byte moves, as a write's: held from
    // the reply on until the reader's READ_DONE says the data reached it. A refused read holds
    // none. (The notification went after the data as a NOTIF of its own before: one we had no
    // room for then failed the peer after the reader had already seen its read succeed.)
    const bool notify = (req.flags & wire::kFlagNotif) != 0;
    if (notify) {
        // Larger than any we accept: fails the peer, as a write's does.
        TCPX_RETURN_IF_ERROR(check_notification_size(req.notification.size()));
        if (p.read_notifs.count(req.xfer) != 0) {
            return protocol_error("READ_REQ reuses the id of a read whose notification we hold");
        }
        if (refused.ok()) {
            Status room = notification_room(p, req.notification.size());
            if (!room.ok()) refused = room.with_context("read refused");
        }
    }
    // Its READ_DONE is an answer owed: a peer that never sends one (but heartbeats on) would
    // hold the room for ever. Past twice PEER_TIMEOUT_MS with nothing of ours pending it fails
    // as one that answers none of our requests does, and, whatever else it answers or claims,
    // twice PEER_TIMEOUT_MS after the read's data has left us (read_data_gone, step_peer).
    const auto hold_notification = [&] {
        if (!notify) return;
        std::string payload(req.notification);  // (out of memory: nothing changed yet)
        Peer::HeldReadNotification& held = p.read_notifs.try_emplace(req.xfer).first->second;
        held.payload = std::move(payload);
        held.room = engine::HeldNotificationRoom(&held_notifications_, held.payload.size());
        ++p.notif_count;
        p.notif_bytes += held.payload.size();
        if (p.answers_owed++ == 0) p.last_answer = Clock::now();
    };
    if (!refused.ok()) {
        std::string msg = wire::encode_read_resp(req.xfer, 0, refused);
        wire::end_message(&msg);
        send_reply(p, std::move(msg));
        count(p, &Stats::requests_served);
        return Status();
    }
    // Inline up to the threshold; a reader alone with us (it asks) into host memory, from host
    // memory here, up to XFER_INLINE_ALONE_READ. Unasked, only a read of few pieces (the reader
    // may read into GPU memory, a synchronous copy per piece there: kMaxInlineGpuPieces).
    const bool asked = (req.flags & wire::kFlagInline) != 0;
    const uint64_t limit = asked && all_host(regions)
                               ? std::max(inline_limit(), config_.xfer_inline_alone_read)
                           : asked || req.segs.size() <= wire::kMaxInlineGpuPieces ? inline_limit()
                                                                                   : 0;
    // Past the inline budget the read goes through the data channels: the reader takes a reply
    // without data as "the data follows there" (on_read_resp), so a legitimate burst of small
    // reads is served whole rather than taken for a peer that does not read its replies.
    // (And past half of what all peers' replies may hold together: the rest is for replies
    // without data, which a peer reading them takes at once.)
    if (total <= limit && p.ctrl.reply_bytes() + total <= engine::kInlineReplyBudget &&
        reply_room_.used + total <= reply_room_.limit / 2 &&
        gpu_pieces(regions) <= wire::kMaxInlineGpuPieces) {
        std::string payload;
        payload.reserve(total);
        Status st;
        for (size_t i = 0; i < req.segs.size() && st.ok(); ++i) {
            st = append_region(&payload, regions[i], req.segs[i].offset, req.segs[i].len);
        }
        std::string msg = st.ok()
                              ? wire::encode_read_resp(req.xfer, wire::kFlagInline, Status())
                              : wire::encode_read_resp(req.xfer, 0, st.with_context("read failed"));
        if (!st.ok()) payload.clear();
        if (st.ok()) {
            hold_notification();
            read_data_gone(p, req.xfer);
        }
        wire::end_message(&msg, payload.size());
        send_reply(p, std::move(msg), std::move(payload));
        count(p, &Stats::requests_served);
        if (st.ok()) count(p, &Stats::bytes_sent, total);
        return Status();
    }
    // Past the bounds on what is served (the peer's MAX_SERVED_PIECES, all peers'
    // MAX_SERVED_PIECES_TOTAL) a read is refused, the connection kept: unlike a write's, its
    // refusal leaves no data of the peer's to drain, and the peer that asks last, past a total
    // that others filled, may be an honest one.
    if (Status room = served_room(p, req.segs.size()); !room.ok()) {
        std::string no = wire::encode_read_resp(req.xfer, 0, room.with_context("read refused"));
        wire::end_message(&no);
        send_reply(p, std::move(no));
        count(p, &Stats::requests_served);
        return Status();
    }
    std::string msg = wire::encode_read_resp(req.xfer, 0, Status());
    wire::end_message(&msg);
    hold_notification();
    send_reply(p, std::move(msg));
    TCPX_ASSIGN_OR_RETURN(Xfer * x, new_xfer(Xfer::Kind::kServeRead, p, false));
    TCPX_RETURN_IF_ERROR(hold_served_pieces(p, x, req.segs.size()));  // (room checked above)
    x->wire_id = req.xfer;
    if (req.chunk != 0) x->chunk = req.chunk;
    for (size_t i = 0; i < req.segs.size(); ++i) {
        hold(x, regions[i], req.segs[i].offset, req.segs[i].len);
    }
    queue_chunks(p, true, x);
    maybe_finish(x);
    return Status();
}

Status Endpoint::Impl::on_read_resp(Peer& p, uint16_t flags, std::string_view body) {
    wire::ReadResp resp;
    TCPX_RETURN_IF_ERROR(wire::decode_read_resp(body, flags, &resp));
    TCPX_ASSIGN_OR_RETURN(Xfer * x, take_awaiting(p, resp.xfer, Xfer::Kind::kRead, "READ_RESP"));
    Status st = wire::to_status(resp.result, "peer '" + p.name + "'");
    // Accepted: the target holds the read's notification until our READ_DONE (at once for a
    // read cancel() has reported already).
    if (st.ok() && x->has_notification) x->read_done_owed = true;
    if (x->user_id == 0 && x->cancelled) let_read_notification_go(x);
    if (!st.ok()) {
        x->result = st;
    } else if (flags & wire::kFlagInline) {
        // Unasked, only for a read of few pieces: each of ours in GPU memory is a synchronous
        // copy, under our lock. (A read of no bytes costs no copy: a target answers one of
        // empty pieces inline whatever their count, its inline limit being no less than 0.)
        uint64_t total = 0;
        for (const Xfer::Piece& piece : x->pieces) total += piece.len;
        if (!x->asked_inline && x->pieces.size() > wire::kMaxInlineGpuPieces && total != 0) {
            return protocol_error(strformat(
                "READ_RESP carries the data of a read of %zu pieces inline, unasked (at most %zu)",
                x->pieces.size(), wire::kMaxInlineGpuPieces));
        }
        if (resp.data.size() != total) {
            return protocol_error(strformat("READ_RESP carries %zu bytes for a read of %llu",
                                            resp.data.size(),
                                            static_cast<unsigned long long>(total)));
        }
        uint64_t at = 0;
        for (const Xfer::Piece& piece : x->pieces) {
            if (x->cancelled) break;  // (its memory is not to be touched: detach_cancelled)
            Status copied =
                write_region(piece.region, piece.offset, resp.data.data() + at, piece.len);
            if (!copied.ok()) {
                x->result = copied.with_context("read");
                break;
            }
            at += piece.len;
        }
    } else {
        queue_chunks(p, false, x);
    }
    maybe_finish(x);
    return Status();
}

Status Endpoint::Impl::on_send_rts(Peer& p, std::string_view body) {
    wire::SendRts rts;
    TCPX_RETURN_IF_ERROR(wire::decode_send_rts(body, &rts));
    std::optional<Xfer*> recv = p.posted_recvs.take(rts.tag);
    if (!recv) {
        // Bounded: a peer cannot make us hold more unmatched sends than transfers it may have,
        // nor all peers more than MAX_SERVED_PIECES_TOTAL. Past either the send is refused, the
        // connection kept: its data comes only once we say go, so nothing is left to drain,
        // and the peer whose send comes last, past a total others filled, may be an honest one.
        // (Within the peer's bound it takes its weight of the total, given back when matched.)
        Status room =
            p.unexpected.size() < static_cast<size_t>(config_.max_transfers)
                ? take_served_weight(1)
                : resource_exhausted(strformat("the peer has %zu sends waiting for a receive "
                                               "(TCPX_P2P_MAX_TRANSFERS)",
                                               p.unexpected.size()));
        if (!room.ok()) {
            send_reply(p,
                       wire::encode_recv_cts(rts.send_xfer, 0, room.with_context("send refused")));
            return Status();
        }
        try {
            p.unexpected.push(rts.tag, Peer::Rts{rts.send_xfer, rts.tag, rts.len});
        } catch (...) {
            --served_weight_;
            throw;
        }
        return Status();
    }
    match(p, *recv, Peer::Rts{rts.send_xfer, rts.tag, rts.len});
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
    wire::end_message(&msg, payload.size());
    send_ctrl(p, std::move(msg), std::move(payload));
    if (!is_inline) {
        queue_chunks(p, true, x);
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
        queue_chunks(p, false, x);
    }
    maybe_finish(x);
    return Status();
}

}  // namespace tcpx
