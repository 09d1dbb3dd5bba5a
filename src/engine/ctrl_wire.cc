#include "engine/ctrl_wire.h"

#include <algorithm>
#include <cstring>

#include "common/status_util.h"
#include "common/strings.h"

namespace tcpx::engine::wire {

const char* msg_type_name(MsgType type) {
    switch (type) {
        case MsgType::kHello:
            return "HELLO";
        case MsgType::kReady:
            return "READY";
        case MsgType::kPing:
            return "PING";
        case MsgType::kBye:
            return "BYE";
        case MsgType::kAuthInit:
            return "AUTH_INIT";
        case MsgType::kAuthChallenge:
            return "AUTH_CHALLENGE";
        case MsgType::kAuthProof:
            return "AUTH_PROOF";
        case MsgType::kAuthFail:
            return "AUTH_FAIL";
        case MsgType::kWriteReq:
            return "WRITE_REQ";
        case MsgType::kWriteAck:
            return "WRITE_ACK";
        case MsgType::kReadReq:
            return "READ_REQ";
        case MsgType::kReadResp:
            return "READ_RESP";
        case MsgType::kNotif:
            return "NOTIF";
        case MsgType::kReadDone:
            return "READ_DONE";
        case MsgType::kSendRts:
            return "SEND_RTS";
        case MsgType::kRecvCts:
            return "RECV_CTS";
        case MsgType::kSendData:
            return "SEND_DATA";
    }
    return "UNKNOWN";
}

std::string_view Reader::raw(size_t len) {
    if (failed_ || len > n_) {
        failed_ = true;
        n_ = 0;
        return {};
    }
    std::string_view out(p_, len);
    p_ += len;
    n_ -= len;
    return out;
}

std::string_view Reader::str(size_t max_len) {
    const uint32_t len = u32();
    if (len > max_len) {
        failed_ = true;
        return {};
    }
    return raw(len);
}

std::string begin_message(MsgType type, uint16_t flags) {
    std::string msg;
    const Header h{kMagic, static_cast<uint16_t>(type), flags, 0, 0};
    msg.append(reinterpret_cast<const char*>(&h), sizeof(h));
    return msg;
}

void end_message(std::string* msg, size_t trailing) {
    const uint32_t len = static_cast<uint32_t>(msg->size() - sizeof(Header) + trailing);
    std::memcpy(msg->data() + offsetof(Header, length), &len, sizeof(len));
}

namespace {

void put_segments(Writer* w, const std::vector<Segment>& segs) {
    w->u32(static_cast<uint32_t>(segs.size()));
    for (const Segment& s : segs) {
        w->u64(s.key);
        w->u64(s.offset);
        w->u64(s.len);
    }
}

bool get_segments(Reader* r, std::vector<Segment>* segs) {
    const uint32_t n = r->u32();
    // Each segment takes 24 bytes: a count beyond what arrived is malformed, checked before any
    // allocation so a forged count cannot make us reserve gigabytes.
    if (r->failed() || n > kMaxSegments || static_cast<uint64_t>(n) * 24 > r->left()) return false;
    segs->resize(n);
    for (Segment& s : *segs) {
        s.key = r->u64();
        s.offset = r->u64();
        s.len = r->u64();
    }
    return !r->failed();
}

void put_status(Writer* w, const Status& st) {
    w->u32(static_cast<uint32_t>(st.code()));
    w->str(st.message());
}

Result get_result(Reader* r) {
    Result out;
    out.code = r->u32();
    out.message = r->str(kMaxBody);
    return out;
}

// Whether the lengths of `segs` add up without overflow; their sum in `*total`.
bool sum_lengths(const std::vector<Segment>& segs, uint64_t* total) {
    *total = 0;
    for (const Segment& s : segs) {
        if (s.len > UINT64_MAX - *total) return false;
        *total += s.len;
    }
    return true;
}

Status malformed(MsgType type) {
    return protocol_error(strformat("malformed %s message", msg_type_name(type)));
}

std::string finish(std::string msg) {
    end_message(&msg);
    return msg;
}

}  // namespace

bool valid_name(std::string_view name) {
    if (name.size() > kMaxName) return false;
    return std::none_of(name.begin(), name.end(), [](char c) {
        const auto b = static_cast<unsigned char>(c);
        return b < 0x20 || b == 0x7f;
    });
}

std::string encode_auth_init(const AuthInit& m) {
    std::string msg = begin_message(MsgType::kAuthInit, 0);
    Writer w(&msg);
    w.u16(m.version);
    w.raw(m.nonce.data(), m.nonce.size());
    w.str(m.name);
    return finish(std::move(msg));
}

std::string encode_auth_challenge(const AuthChallenge& m) {
    std::string msg = begin_message(MsgType::kAuthChallenge, 0);
    Writer w(&msg);
    w.raw(m.nonce.data(), m.nonce.size());
    w.str(m.name);
    w.u8(static_cast<uint8_t>(m.macs.size()));
    for (std::string_view mac : m.macs) w.raw(mac.data(), mac.size());
    return finish(std::move(msg));
}

std::string encode_auth_proof(const AuthProof& m) {
    std::string msg = begin_message(MsgType::kAuthProof, 0);
    Writer w(&msg);
    w.raw(m.mac.data(), m.mac.size());
    return finish(std::move(msg));
}

std::string encode_auth_fail(std::string_view reason) {
    std::string msg = begin_message(MsgType::kAuthFail, 0);
    Writer w(&msg);
    w.str(reason.substr(0, kMaxAuthReason));
    return finish(std::move(msg));
}

std::string encode_hello(const Hello& m) {
    std::string msg = begin_message(MsgType::kHello, 0);
    Writer w(&msg);
    w.u16(m.version);
    w.u16(m.channels);
    w.u64(m.nonce);
    w.u64(m.chunk);
    w.str(m.name);
    w.u32(static_cast<uint32_t>(m.handles.size()));
    for (const net::Handle& h : m.handles) w.raw(h.bytes.data(), h.bytes.size());
    w.raw(m.mac.data(), m.mac.size());
    return finish(std::move(msg));
}

std::string encode_empty(MsgType type) { return finish(begin_message(type, 0)); }

std::string encode_bye(std::string_view reason) {
    if (reason.empty()) return encode_empty(MsgType::kBye);
    std::string msg = begin_message(MsgType::kBye, 0);
    Writer w(&msg);
    w.str(reason.substr(0, kMaxByeReason));
    return finish(std::move(msg));
}

std::string encode_ping(uint64_t moved) {
    std::string msg = begin_message(MsgType::kPing, 0);
    Writer w(&msg);
    w.u64(moved);
    return finish(std::move(msg));
}

std::string encode_write_req(const WriteReq& m) {
    std::string msg = begin_message(MsgType::kWriteReq, m.flags);
    Writer w(&msg);
    w.u64(m.xfer);
    w.u64(m.chunk);
    put_segments(&w, m.segs);
    if (m.flags & kFlagNotif) w.str(m.notification);
    return msg;  // inline data, if any, follows; the caller ends the message
}

void set_request_chunk(std::string* msg, uint64_t chunk) {
    constexpr size_t at = sizeof(Header) + sizeof(uint64_t);
    if (msg->size() >= at + sizeof(chunk)) std::memcpy(msg->data() + at, &chunk, sizeof(chunk));
}

std::string encode_write_ack(uint64_t xfer, const Status& st) {
    std::string msg = begin_message(MsgType::kWriteAck, 0);
    Writer w(&msg);
    w.u64(xfer);
    put_status(&w, st);
    return finish(std::move(msg));
}

std::string encode_read_req(const ReadReq& m) {
    std::string msg = begin_message(MsgType::kReadReq, m.flags & (kFlagInline | kFlagNotif));
    Writer w(&msg);
    w.u64(m.xfer);
    w.u64(m.chunk);
    put_segments(&w, m.segs);
    if (m.flags & kFlagNotif) w.str(m.notification);
    return finish(std::move(msg));
}

std::string encode_read_done(const ReadDone& m) {
    std::string msg = begin_message(MsgType::kReadDone, 0);
    Writer w(&msg);
    w.u64(m.xfer);
    w.u8(m.delivered ? 1 : 0);
    return finish(std::move(msg));
}

std::string encode_read_resp(uint64_t xfer, uint16_t flags, const Status& st) {
    std::string msg = begin_message(MsgType::kReadResp, flags);
    Writer w(&msg);
    w.u64(xfer);
    put_status(&w, st);
    return msg;
}

std::string encode_notif(std::string_view payload) {
    std::string msg = begin_message(MsgType::kNotif, 0);
    Writer w(&msg);
    w.str(payload);
    return finish(std::move(msg));
}

std::string encode_send_rts(const SendRts& m) {
    std::string msg = begin_message(MsgType::kSendRts, 0);
    Writer w(&msg);
    w.u64(m.send_xfer);
    w.u64(m.tag);
    w.u64(m.len);
    return finish(std::move(msg));
}

std::string encode_recv_cts(uint64_t send_xfer, uint64_t recv_xfer, const Status& st) {
    std::string msg = begin_message(MsgType::kRecvCts, 0);
    Writer w(&msg);
    w.u64(send_xfer);
    w.u64(recv_xfer);
    put_status(&w, st);
    return finish(std::move(msg));
}

std::string encode_send_data(uint64_t recv_xfer, uint16_t flags, uint64_t len) {
    std::string msg = begin_message(MsgType::kSendData, flags);
    Writer w(&msg);
    w.u64(recv_xfer);
    w.u64(len);
    return msg;
}

Status decode_auth_init(std::string_view body, AuthInit* m) {
    Reader r(body);
    m->version = r.u16();
    if (!r.failed() && m->version != kVersion) {
        return protocol_error(
            strformat("peer speaks engine protocol version %u, we speak %u", m->version, kVersion));
    }
    m->nonce = r.raw(kAuthBytes);
    m->name = r.str(kMaxName);
    if (r.failed() || r.left() != 0 || !valid_name(m->name)) return malformed(MsgType::kAuthInit);
    return Status();
}

Status decode_auth_challenge(std::string_view body, AuthChallenge* m) {
    Reader r(body);
    m->nonce = r.raw(kAuthBytes);
    m->name = r.str(kMaxName);
    const uint8_t n = r.u8();
    if (r.failed() || n < 1 || n > kMaxAuthMacs || r.left() != n * kAuthBytes ||
        !valid_name(m->name)) {
        return malformed(MsgType::kAuthChallenge);
    }
    m->macs.clear();
    for (uint8_t i = 0; i < n; ++i) m->macs.push_back(r.raw(kAuthBytes));
    return Status();
}

Status decode_auth_proof(std::string_view body, AuthProof* m) {
    Reader r(body);
    m->mac = r.raw(kAuthBytes);
    if (r.failed() || r.left() != 0) return malformed(MsgType::kAuthProof);
    return Status();
}

Status decode_auth_fail(std::string_view body, std::string_view* reason) {
    Reader r(body);
    *reason = r.str(kMaxAuthReason);
    if (r.failed() || r.left() != 0) return malformed(MsgType::kAuthFail);
    return Status();
}

Status decode_bye(std::string_view body, std::string_view* reason) {
    *reason = {};
    if (body.empty()) return Status();
    Reader r(body);
    *reason = r.str(kMaxByeReason);
    // No reason is an empty body, never an empty string: one encoding for each BYE.
    if (r.failed() || r.left() != 0 || reason->empty()) return malformed(MsgType::kBye);
    return Status();
}

Status decode_ping(std::string_view body, std::optional<uint64_t>* moved) {
    moved->reset();
    if (body.empty()) return Status();
    Reader r(body);
    const uint64_t v = r.u64();
    if (r.failed() || r.left() != 0) return malformed(MsgType::kPing);
    *moved = v;
    return Status();
}

Status decode_hello(std::string_view body, Hello* m) {
    Reader r(body);
    m->version = r.u16();
    if (!r.failed() && m->version != kVersion) {
        return protocol_error(
            strformat("peer speaks engine protocol version %u, we speak %u", m->version, kVersion));
    }
    m->channels = r.u16();
    m->nonce = r.u64();
    m->chunk = r.u64();
    m->name = std::string(r.str(kMaxName));
    const uint32_t n = r.u32();
    const uint64_t handles = static_cast<uint64_t>(n) * net::kHandleSize;
    if (r.failed() || n != m->channels || n == 0 ||
        (handles != r.left() && handles + kAuthBytes != r.left()) || !valid_name(m->name)) {
        return malformed(MsgType::kHello);
    }
    m->handles.resize(n);
    for (net::Handle& h : m->handles) {
        std::memcpy(h.bytes.data(), r.raw(net::kHandleSize).data(), net::kHandleSize);
    }
    m->mac = std::string(r.raw(r.left()));
    return Status();
}

Status decode_write_req(std::string_view body, uint16_t flags, WriteReq* m) {
    Reader r(body);
    m->flags = flags;
    m->xfer = r.u64();
    m->chunk = r.u64();
    if (m->chunk != 0 && m->chunk < kMinChunk) return malformed(MsgType::kWriteReq);
    if (!get_segments(&r, &m->segs)) return malformed(MsgType::kWriteReq);
    if (flags & kFlagNotif) m->notification = r.str(kMaxBody);
    if (r.failed()) return malformed(MsgType::kWriteReq);
    uint64_t total = 0;
    if (!sum_lengths(m->segs, &total)) return malformed(MsgType::kWriteReq);
    // Inline data is the request's tail, bounded by the body's size limit only as a whole: a
    // tiny request could carry tens of MiB, copied (into GPU memory: synchronously) under the
    // engine's lock. No sender of ours puts more than kMaxInlineData there.
    if (flags & kFlagInline) {
        if (total != r.left() || total > kMaxInlineData) return malformed(MsgType::kWriteReq);
        m->data = r.raw(total);
    } else if (r.left() != 0) {
        return malformed(MsgType::kWriteReq);
    }
    return Status();
}

Status decode_write_ack(std::string_view body, WriteAck* m) {
    Reader r(body);
    m->xfer = r.u64();
    m->result = get_result(&r);
    if (r.failed() || r.left() != 0) return malformed(MsgType::kWriteAck);
    return Status();
}

Status decode_read_req(std::string_view body, uint16_t flags, ReadReq* m) {
    Reader r(body);
    m->flags = flags & (kFlagInline | kFlagNotif);
    m->xfer = r.u64();
    m->chunk = r.u64();
    if (m->chunk != 0 && m->chunk < kMinChunk) return malformed(MsgType::kReadReq);
    if (!get_segments(&r, &m->segs)) return malformed(MsgType::kReadReq);
    if (flags & kFlagNotif) m->notification = r.str(kMaxBody);
    if (r.failed() || r.left() != 0) return malformed(MsgType::kReadReq);
    // The server adds the lengths up (inline or not): a sum that wraps would pass for a small one.
    uint64_t total = 0;
    if (!sum_lengths(m->segs, &total)) return malformed(MsgType::kReadReq);
    return Status();
}

Status decode_read_resp(std::string_view body, uint16_t flags, ReadResp* m) {
    Reader r(body);
    m->flags = flags;
    m->xfer = r.u64();
    m->result = get_result(&r);
    if (r.failed()) return malformed(MsgType::kReadResp);
    if (flags & kFlagInline) {
        if (r.left() > kMaxInlineData) return malformed(MsgType::kReadResp);
        m->data = r.raw(r.left());
    } else if (r.left() != 0) {
        return malformed(MsgType::kReadResp);
    }
    return Status();
}

Status decode_notif(std::string_view body, std::string_view* payload) {
    Reader r(body);
    *payload = r.str(kMaxBody);
    if (r.failed() || r.left() != 0) return malformed(MsgType::kNotif);
    return Status();
}

Status decode_read_done(std::string_view body, ReadDone* m) {
    Reader r(body);
    m->xfer = r.u64();
    const uint8_t delivered = r.u8();
    if (r.failed() || r.left() != 0 || delivered > 1) return malformed(MsgType::kReadDone);
    m->delivered = delivered == 1;
    return Status();
}

Status decode_send_rts(std::string_view body, SendRts* m) {
    Reader r(body);
    m->send_xfer = r.u64();
    m->tag = r.u64();
    m->len = r.u64();
    if (r.failed() || r.left() != 0) return malformed(MsgType::kSendRts);
    return Status();
}

Status decode_recv_cts(std::string_view body, RecvCts* m) {
    Reader r(body);
    m->send_xfer = r.u64();
    m->recv_xfer = r.u64();
    m->result = get_result(&r);
    if (r.failed() || r.left() != 0) return malformed(MsgType::kRecvCts);
    return Status();
}

Status decode_send_data(std::string_view body, uint16_t flags, SendData* m) {
    Reader r(body);
    m->flags = flags;
    m->recv_xfer = r.u64();
    m->len = r.u64();
    if (r.failed()) return malformed(MsgType::kSendData);
    if (flags & kFlagInline) {
        if (r.left() != m->len || m->len > kMaxInlineData) return malformed(MsgType::kSendData);
        m->data = r.raw(m->len);
    } else if (r.left() != 0) {
        return malformed(MsgType::kSendData);
    }
    return Status();
}

Status to_status(const Result& r, std::string_view context) {
    if (r.code == 0) return Status();
    StatusCode code = StatusCode::kRemote;
    if (r.code <= static_cast<uint32_t>(StatusCode::kInternal))
        code = static_cast<StatusCode>(r.code);
    // The peer's words: printable characters only, and no more of them than an error needs (a
    // transfer's status holds them until the application takes it, and logs print them).
    std::string message = printable(std::string_view(r.message).substr(0, kMaxPeerMessage));
    if (r.message.size() > kMaxPeerMessage) {
        message += strformat(" [%zu more bytes]", r.message.size() - kMaxPeerMessage);
    }
    return Status(code, std::move(message)).with_context(context);
}

}  // namespace tcpx::engine::wire
