// Round trips of the engine control protocol's messages (src/engine/ctrl_wire.h), shared by the
// decoder target and the stream target: a body that decodes must encode back to a message whose
// body decodes to the same fields, and encoding that again gives the same bytes.
#pragma once

#include <cstring>
#include <optional>
#include <string>
#include <string_view>

#include "engine/ctrl_wire.h"
#include "fuzz_check.h"

namespace tcpx::fuzz {

namespace w = tcpx::engine::wire;

// The body of an encoded message, after checking its header.
inline std::string_view body_of(const std::string& msg, w::MsgType type, uint16_t flags) {
    FUZZ_CHECK(msg.size() >= sizeof(w::Header));
    w::Header h;
    std::memcpy(&h, msg.data(), sizeof(h));
    FUZZ_CHECK(h.magic == w::kMagic);
    FUZZ_CHECK(h.type == static_cast<uint16_t>(type));
    FUZZ_CHECK(h.flags == flags);
    FUZZ_CHECK(h.length == msg.size() - sizeof(w::Header));
    return std::string_view(msg).substr(sizeof(w::Header));
}

// A message's tail (inline data) is appended by the caller; this closes it like the engine does.
inline std::string with_tail(std::string msg, std::string_view tail) {
    msg.append(tail);
    w::end_message(&msg);
    return msg;
}

// A peer's result as the Status our encoders take: code 0 is OK and carries no message.
inline Status status_of(const w::Result& r) {
    return Status(static_cast<StatusCode>(static_cast<int>(r.code)), r.message);
}

inline void check_result(const w::Result& got, const w::Result& want) {
    FUZZ_CHECK(got.code == want.code);
    FUZZ_CHECK(got.message == (want.code == 0 ? std::string_view() : want.message));
    // What the engine makes of it must not trip over any code or message.
    const Status st = w::to_status(got, "fuzz");
    FUZZ_CHECK(st.ok() == (got.code == 0));
}

inline bool same_segments(const std::vector<w::Segment>& a, const std::vector<w::Segment>& b) {
    if (a.size() != b.size()) return false;
    for (size_t i = 0; i < a.size(); ++i) {
        if (a[i].key != b[i].key || a[i].offset != b[i].offset || a[i].len != b[i].len) {
            return false;
        }
    }
    return true;
}

// Decodes `body` as a message of `type` with `flags`; when it decodes, checks the round trip.
// Returns whether it decoded.
inline bool check_message(w::MsgType type, uint16_t flags, std::string_view body) {
    switch (type) {
        case w::MsgType::kHello: {
            w::Hello m;
            if (!w::decode_hello(body, &m).ok()) return false;
            FUZZ_CHECK(m.version == w::kVersion);
            FUZZ_CHECK(m.channels > 0 && m.handles.size() == m.channels);
            FUZZ_CHECK(w::valid_name(m.name));
            FUZZ_CHECK(m.mac.empty() || m.mac.size() == w::kAuthBytes);
            FUZZ_CHECK(w::hello_signed_part(body, m).size() + m.mac.size() == body.size());
            const std::string msg = w::encode_hello(m);
            // The format has no slack: the re-encoding is the input.
            FUZZ_CHECK(body_of(msg, type, 0) == body);
            return true;
        }
        case w::MsgType::kWriteReq: {
            w::WriteReq m;
            if (!w::decode_write_req(body, flags, &m).ok()) return false;
            FUZZ_CHECK(m.segs.size() <= w::kMaxSegments);
            FUZZ_CHECK(m.chunk == 0 || m.chunk >= w::kMinChunk);
            FUZZ_CHECK(m.data.empty() || (flags & w::kFlagInline));
            FUZZ_CHECK(m.notification.empty() || (flags & w::kFlagNotif));
            if (flags & w::kFlagInline) {
                uint64_t total = 0;
                for (const w::Segment& s : m.segs) total += s.len;
                FUZZ_CHECK(total == m.data.size());
            }
            const std::string msg = with_tail(w::encode_write_req(m), m.data);
            FUZZ_CHECK(body_of(msg, type, flags) == body);
            return true;
        }
        case w::MsgType::kWriteAck: {
            w::WriteAck m;
            if (!w::decode_write_ack(body, &m).ok()) return false;
            const std::string msg = w::encode_write_ack(m.xfer, status_of(m.result));
            w::WriteAck again;
            FUZZ_CHECK(w::decode_write_ack(body_of(msg, type, 0), &again).ok());
            FUZZ_CHECK(again.xfer == m.xfer);
            check_result(again.result, m.result);
            FUZZ_CHECK(w::encode_write_ack(again.xfer, status_of(again.result)) == msg);
            if (m.result.code != 0 || m.result.message.empty()) {
                FUZZ_CHECK(body_of(msg, type, 0) == body);
            }
            return true;
        }
        case w::MsgType::kReadReq: {
            w::ReadReq m;
            if (!w::decode_read_req(body, flags, &m).ok()) return false;
            FUZZ_CHECK(m.segs.size() <= w::kMaxSegments);
            FUZZ_CHECK(m.chunk == 0 || m.chunk >= w::kMinChunk);
            FUZZ_CHECK(m.flags == (flags & (w::kFlagInline | w::kFlagNotif)));
            FUZZ_CHECK(m.notification.empty() || (flags & w::kFlagNotif));
            const std::string msg = w::encode_read_req(m);
            FUZZ_CHECK(body_of(msg, type, m.flags) == body);
            w::ReadReq again;
            FUZZ_CHECK(w::decode_read_req(body_of(msg, type, m.flags), m.flags, &again).ok());
            FUZZ_CHECK(again.xfer == m.xfer && again.chunk == m.chunk && again.flags == m.flags &&
                       same_segments(again.segs, m.segs) && again.notification == m.notification);
            return true;
        }
        case w::MsgType::kReadDone: {
            w::ReadDone m;
            if (!w::decode_read_done(body, &m).ok()) return false;
            const std::string msg = w::encode_read_done(m);
            FUZZ_CHECK(body_of(msg, type, 0) == body);
            return true;
        }
        case w::MsgType::kReadResp: {
            w::ReadResp m;
            if (!w::decode_read_resp(body, flags, &m).ok()) return false;
            FUZZ_CHECK(m.data.empty() || (flags & w::kFlagInline));
            const std::string msg =
                with_tail(w::encode_read_resp(m.xfer, flags, status_of(m.result)), m.data);
            w::ReadResp again;
            FUZZ_CHECK(w::decode_read_resp(body_of(msg, type, flags), flags, &again).ok());
            FUZZ_CHECK(again.xfer == m.xfer && again.flags == flags && again.data == m.data);
            check_result(again.result, m.result);
            if (m.result.code != 0 || m.result.message.empty()) {
                FUZZ_CHECK(body_of(msg, type, flags) == body);
            }
            return true;
        }
        case w::MsgType::kNotif: {
            std::string_view payload;
            if (!w::decode_notif(body, &payload).ok()) return false;
            const std::string msg = w::encode_notif(payload);
            FUZZ_CHECK(body_of(msg, type, 0) == body);
            return true;
        }
        case w::MsgType::kSendRts: {
            w::SendRts m;
            if (!w::decode_send_rts(body, &m).ok()) return false;
            const std::string msg = w::encode_send_rts(m);
            FUZZ_CHECK(body_of(msg, type, 0) == body);
            return true;
        }
        case w::MsgType::kRecvCts: {
            w::RecvCts m;
            if (!w::decode_recv_cts(body, &m).ok()) return false;
            const std::string msg =
                w::encode_recv_cts(m.send_xfer, m.recv_xfer, status_of(m.result));
            w::RecvCts again;
            FUZZ_CHECK(w::decode_recv_cts(body_of(msg, type, 0), &again).ok());
            FUZZ_CHECK(again.send_xfer == m.send_xfer && again.recv_xfer == m.recv_xfer);
            check_result(again.result, m.result);
            if (m.result.code != 0 || m.result.message.empty()) {
                FUZZ_CHECK(body_of(msg, type, 0) == body);
            }
            return true;
        }
        case w::MsgType::kSendData: {
            w::SendData m;
            if (!w::decode_send_data(body, flags, &m).ok()) return false;
            FUZZ_CHECK(m.data.empty() || (flags & w::kFlagInline));
            if (flags & w::kFlagInline) FUZZ_CHECK(m.data.size() == m.len);
            const std::string msg =
                with_tail(w::encode_send_data(m.recv_xfer, flags, m.len), m.data);
            FUZZ_CHECK(body_of(msg, type, flags) == body);
            return true;
        }
        case w::MsgType::kBye: {
            std::string_view reason;
            if (!w::decode_bye(body, &reason).ok()) return false;
            FUZZ_CHECK(reason.size() <= w::kMaxByeReason);
            FUZZ_CHECK(body_of(w::encode_bye(reason), type, 0) == body);
            return true;
        }
        case w::MsgType::kPing: {
            std::optional<uint64_t> moved;
            if (!w::decode_ping(body, &moved).ok()) return false;
            FUZZ_CHECK(moved.has_value() == !body.empty());
            const std::string msg = moved ? w::encode_ping(*moved) : w::encode_empty(type);
            FUZZ_CHECK(body_of(msg, type, 0) == body);
            return true;
        }
        case w::MsgType::kReady: {
            const std::string msg = w::encode_empty(type);
            FUZZ_CHECK(body_of(msg, type, 0).empty());
            return body.empty();
        }
        // The authentication's messages arrive before the peer has proved anything.
        case w::MsgType::kAuthInit: {
            w::AuthInit m;
            if (!w::decode_auth_init(body, &m).ok()) return false;
            FUZZ_CHECK(m.version == w::kVersion);
            FUZZ_CHECK(m.nonce.size() == w::kAuthBytes);
            FUZZ_CHECK(w::valid_name(m.name));
            FUZZ_CHECK(body_of(w::encode_auth_init(m), type, 0) == body);
            return true;
        }
        case w::MsgType::kAuthChallenge: {
            w::AuthChallenge m;
            if (!w::decode_auth_challenge(body, &m).ok()) return false;
            FUZZ_CHECK(m.nonce.size() == w::kAuthBytes);
            FUZZ_CHECK(w::valid_name(m.name));
            FUZZ_CHECK(!m.macs.empty() && m.macs.size() <= w::kMaxAuthMacs);
            for (std::string_view mac : m.macs) FUZZ_CHECK(mac.size() == w::kAuthBytes);
            FUZZ_CHECK(body_of(w::encode_auth_challenge(m), type, 0) == body);
            return true;
        }
        case w::MsgType::kAuthProof: {
            w::AuthProof m;
            if (!w::decode_auth_proof(body, &m).ok()) return false;
            FUZZ_CHECK(m.mac.size() == w::kAuthBytes);
            FUZZ_CHECK(body_of(w::encode_auth_proof(m), type, 0) == body);
            return true;
        }
        case w::MsgType::kAuthFail: {
            std::string_view reason;
            if (!w::decode_auth_fail(body, &reason).ok()) return false;
            FUZZ_CHECK(reason.size() <= w::kMaxAuthReason);
            FUZZ_CHECK(body_of(w::encode_auth_fail(reason), type, 0) == body);
            return true;
        }
    }
    return false;
}

}  // namespace tcpx::fuzz
