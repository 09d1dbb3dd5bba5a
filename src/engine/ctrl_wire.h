// The engine's control protocol (version 3): framed messages on one TCP connection per peer pair.
//
// Every message is a 16-byte header (magic, type, flags, body length) and a body of little-endian
// fields. Decoding checks every length against what arrived, so a malformed message is a
// protocol error, never an out-of-bounds read.
//
//   AUTH_INIT / AUTH_CHALLENGE / AUTH_PROOF / AUTH_FAIL   with a shared secret, before anything
//              else: the mutual challenge-response of auth.h
//   HELLO      both ways, first (after authentication): version, name, channel count, chunk
//              size, the sender's listen handles; after authentication, a MAC of all that
//   READY      both ways: the sender's data channels are all up
//   PING       heartbeat, with how many chunks the sender has moved on its data channels with
//              us (the progress of what it serves, which the other side cannot see); BYE: the
//              sender is disconnecting
//   WRITE_REQ  initiator -> target: the chunk size, segments (key, offset, len), optional
//              notification, and either the data inline or "chunks follow on the data channels"
//   WRITE_ACK  target -> initiator: the write's data is in place (or why it was refused)
//   READ_REQ   initiator -> target: the chunk size, segments to read
//   READ_RESP  target -> initiator: accepted (data inline, or chunks follow) or refused
//   NOTIF      a standalone notification
//   SEND_RTS / RECV_CTS / SEND_DATA   two-sided: ready to send; matched by a receive; the data
//
// Data chunks on the channels carry no header of their own: both sides derive the channel and
// order of every chunk from the order of these messages (see engine.h).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "net/net.h"
#include "tcpx/status.h"

namespace tcpx::engine::wire {

inline constexpr uint32_t kMagic = 0x45585054;  // "TPXE"
// 2: a transfer's pieces are cut into chunks by packer.h (1 cut every piece on its own).
// 3: a HELLO after authentication carries a MAC (auth::hello_mac).
// 4: a READ_REQ carries its notification (the target holds room for it, or refuses the read);
//    READ_DONE, not NOTIF, delivers it once the reader has the data.
// 5: a READ_RESP carries a read's data inline unasked (XFER_INLINE_THRESHOLD) only for a read of
//    at most kMaxInlineGpuPieces pieces (the reader may read into GPU memory: each piece is a
//    synchronous copy there), or of no bytes at all; more is a protocol error.
inline constexpr uint16_t kVersion = 5;
inline constexpr uint32_t kMaxBody = 64u << 20;  // larger messages are refused
// The most of a peer's error message (in a reply) that reaches a transfer's status.
inline constexpr size_t kMaxPeerMessage = 1024;
// The most bytes a transfer carries inside its control message (the upper bound of
// XFER_INLINE_THRESHOLD, XFER_INLINE_ALONE and XFER_INLINE_ALONE_READ): accepted beyond
// MAX_CTRL_MESSAGE (ctrl_conn.h); more in one WRITE_REQ, READ_RESP or SEND_DATA is malformed.
inline constexpr uint32_t kMaxInlineData = 1u << 20;
// Before a peer is ready (authenticated, HELLO exchanged) no message may be larger than this: a
// HELLO with 16 handles is under 3 KiB.
inline constexpr uint32_t kHandshakeMessage = 64u << 10;
inline constexpr size_t kMaxName = 256;
// Whether `name` may name an endpoint: at most kMaxName bytes, none an ASCII control character
// (NUL, ESC, line breaks, DEL). A peer's name goes into our logs and errors and into the
// application's Notification::peer: one that could drive a terminal or cut a C string short is
// refused. Other bytes (UTF-8) are fine.
bool valid_name(std::string_view name);
inline constexpr size_t kMaxSegments = 1u << 20;  // per transfer
// The most pieces in GPU memory that one message's inline data may be copied into or out of
// (an inline WRITE's or READ's): each is a synchronous CUDA copy at the target, under its lock, so
// a request of many tiny pieces would hold the target's endpoint for milliseconds. A WRITE with
// more goes through the data channels (a gather kernel); one sent inline is refused. A READ's
// reply carries its data inline unasked only for reads of at most this many pieces (the target
// cannot tell which of the reader's are GPU memory); one with more is refused by the reader.
inline constexpr size_t kMaxInlineGpuPieces = 16;
// The smallest chunk a request may ask its data to be cut by (WriteReq/ReadReq::chunk).
inline constexpr uint64_t kMinChunk = 4096;

enum class MsgType : uint16_t {
    kHello = 1,
    kReady = 2,
    kPing = 3,
    kBye = 4,
    kAuthInit = 5,
    kAuthChallenge = 6,
    kAuthProof = 7,
    kAuthFail = 8,
    kWriteReq = 10,
    kWriteAck = 11,
    kReadReq = 12,
    kReadResp = 13,
    kNotif = 14,
    kReadDone = 15,
    kSendRts = 20,
    kRecvCts = 21,
    kSendData = 22,
};
const char* msg_type_name(MsgType type);

struct Header {
    uint32_t magic;
    uint16_t type;
    uint16_t flags;
    uint32_t length;  // body bytes
    uint32_t reserved;
};
static_assert(sizeof(Header) == 16);

// Appends little-endian fields to a message body.
class Writer {
 public:
    explicit Writer(std::string* out) : out_(out) {}
    void u8(uint8_t v) { out_->push_back(static_cast<char>(v)); }
    void u16(uint16_t v) { raw(&v, sizeof(v)); }
    void u32(uint32_t v) { raw(&v, sizeof(v)); }
    void u64(uint64_t v) { raw(&v, sizeof(v)); }
    void raw(const void* data, size_t len) { out_->append(static_cast<const char*>(data), len); }
    // u32 length, then the bytes.
    void str(std::string_view s) {
        u32(static_cast<uint32_t>(s.size()));
        raw(s.data(), s.size());
    }

 private:
    std::string* out_;
};

// Reads fields back; any read past the end sets failed() and yields zeros.
class Reader {
 public:
    explicit Reader(std::string_view body) : p_(body.data()), n_(body.size()) {}
    uint8_t u8() { return get<uint8_t>(); }
    uint16_t u16() { return get<uint16_t>(); }
    uint32_t u32() { return get<uint32_t>(); }
    uint64_t u64() { return get<uint64_t>(); }
    std::string_view raw(size_t len);
    std::string_view str(size_t max_len);
    bool failed() const { return failed_; }
    size_t left() const { return n_; }

 private:
    template <typename T>
    T get() {
        T v{};
        std::string_view bytes = raw(sizeof(T));
        if (!failed_) __builtin_memcpy(&v, bytes.data(), sizeof(T));
        return v;
    }
    const char* p_;
    size_t n_;
    bool failed_ = false;
};

struct Segment {
    uint64_t key = 0;
    uint64_t offset = 0;  // from the registration's start
    uint64_t len = 0;
};

struct Hello {
    uint16_t version = kVersion;
    uint16_t channels = 0;
    uint64_t nonce = 0;  // the sending endpoint's, for logs
    // Bytes per data-channel chunk: the connecting side offers its own, the answer is the one both
    // sides cut transfers by (they must agree, or chunks would not match receives).
    uint64_t chunk = 0;
    std::string name;
    std::vector<net::Handle> handles;  // one per channel: where to connect to reach its receiver
    // Empty, or after authentication kAuthBytes: the MAC of the message's other bytes (its body
    // up to here), auth::hello_mac. The last field.
    std::string mac;
};

// Authentication (auth.h). Nonces and MACs are 32 bytes.
inline constexpr size_t kAuthBytes = 32;
inline constexpr size_t kMaxAuthMacs = 2;  // one per secret the listener holds (rotation)
inline constexpr size_t kMaxAuthReason = 256;
// BYE: the sender closes the connection. Its body is empty, or the reason when an error ends it
// (at most this many bytes; a reason of no bytes is sent as an empty body).
inline constexpr size_t kMaxByeReason = 512;

struct AuthInit {  // connector -> listener
    uint16_t version = kVersion;
    std::string_view nonce;  // kAuthBytes
    std::string_view name;   // the connector's endpoint name
};

struct AuthChallenge {                   // listener -> connector
    std::string_view nonce;              // kAuthBytes
    std::string_view name;               // the listener's endpoint name
    std::vector<std::string_view> macs;  // 1..kMaxAuthMacs MACs of kAuthBytes
};

struct AuthProof {         // connector -> listener
    std::string_view mac;  // kAuthBytes
};

inline constexpr uint16_t kFlagNotif = 0x1;   // WRITE_REQ, READ_REQ carry a notification
inline constexpr uint16_t kFlagInline = 0x2;  // the data follows in this message

struct WriteReq {
    uint64_t xfer = 0;
    uint16_t flags = 0;
    // The chunk size this transfer's data is cut by (packer.h): 0 for the size agreed in HELLO,
    // else kMinChunk up to it (smaller chunks pipeline a short GPU transfer's staging).
    uint64_t chunk = 0;
    std::vector<Segment> segs;
    std::string_view notification;  // with kFlagNotif
    std::string_view data;          // with kFlagInline: every segment's bytes, in order
};

// The status a peer reports: a StatusCode and its message.
struct Result {
    uint32_t code = 0;
    std::string_view message;
};

struct WriteAck {
    uint64_t xfer = 0;
    Result result;
};

struct ReadReq {
    // kFlagInline: the reader is alone with us and reads into host memory: data up to our
    // XFER_INLINE_ALONE_READ is welcome inside the READ_RESP. kFlagNotif: a notification for
    // us follows the segments, delivered on the reader's READ_DONE. Other bits are ignored.
    uint16_t flags = 0;
    uint64_t xfer = 0;
    uint64_t chunk = 0;  // as WriteReq::chunk
    std::vector<Segment> segs;
    std::string_view notification;  // with kFlagNotif
};

// The reader of a READ_REQ with a notification, once its read has ended (an accepted one only:
// its READ_RESP was not an error): `delivered` when the data is in place, and the target queues
// the notification it held; else the target lets the room go.
struct ReadDone {
    uint64_t xfer = 0;
    bool delivered = false;
};

struct ReadResp {
    uint64_t xfer = 0;
    uint16_t flags = 0;
    Result result;
    std::string_view data;  // with kFlagInline
};

struct SendRts {
    uint64_t send_xfer = 0;
    uint64_t tag = 0;
    uint64_t len = 0;
};

struct RecvCts {
    uint64_t send_xfer = 0;
    uint64_t recv_xfer = 0;
    Result result;
};

struct SendData {
    uint64_t recv_xfer = 0;
    uint16_t flags = 0;
    uint64_t len = 0;
    std::string_view data;  // with kFlagInline
};

// A whole message (header + body) ready to queue. Inline data is appended by the caller after
// encode_*() for messages that carry it (it is the body's tail).
std::string begin_message(MsgType type, uint16_t flags);
// Fixes the header's length once the body is complete: what `msg` holds after the header, and
// `trailing` bytes that follow it on the wire (inline data queued on its own, CtrlConn::queue).
void end_message(std::string* msg, size_t trailing = 0);

std::string encode_auth_init(const AuthInit& m);
std::string encode_auth_challenge(const AuthChallenge& m);
std::string encode_auth_proof(const AuthProof& m);
std::string encode_auth_fail(std::string_view reason);
std::string encode_hello(const Hello& m);
std::string encode_empty(MsgType type);
std::string encode_bye(std::string_view reason);
// PING carrying the count of chunks the sender has moved with us (a counter that wraps).
std::string encode_ping(uint64_t moved);
// WRITE_REQ without its inline data: append it (or queue it after), then end_message().
std::string encode_write_req(const WriteReq& m);
// Sets the chunk field of an encoded WRITE_REQ or READ_REQ (it follows the transfer id), for a
// request encoded before the peer's chunk size was known.
void set_request_chunk(std::string* msg, uint64_t chunk);
std::string encode_write_ack(uint64_t xfer, const Status& st);
std::string encode_read_req(const ReadReq& m);
// READ_RESP without its inline data: append it (or queue it after), then end_message().
std::string encode_read_resp(uint64_t xfer, uint16_t flags, const Status& st);
std::string encode_notif(std::string_view payload);
std::string encode_read_done(const ReadDone& m);
std::string encode_send_rts(const SendRts& m);
std::string encode_recv_cts(uint64_t send_xfer, uint64_t recv_xfer, const Status& st);
// SEND_DATA without its inline data: append it (or queue it after), then end_message().
std::string encode_send_data(uint64_t recv_xfer, uint16_t flags, uint64_t len);

// The views point into `body`.
Status decode_auth_init(std::string_view body, AuthInit* m);
Status decode_auth_challenge(std::string_view body, AuthChallenge* m);
Status decode_auth_proof(std::string_view body, AuthProof* m);
Status decode_auth_fail(std::string_view body, std::string_view* reason);
Status decode_bye(std::string_view body, std::string_view* reason);
// The count a PING carries; an empty PING (a heartbeat during the handshake) carries none.
Status decode_ping(std::string_view body, std::optional<uint64_t>* moved);
Status decode_hello(std::string_view body, Hello* m);
// The bytes of a HELLO's body its MAC covers: all but the MAC.
inline std::string_view hello_signed_part(std::string_view body, const Hello& m) {
    return body.substr(0, body.size() - m.mac.size());
}
Status decode_write_req(std::string_view body, uint16_t flags, WriteReq* m);
Status decode_write_ack(std::string_view body, WriteAck* m);
Status decode_read_req(std::string_view body, uint16_t flags, ReadReq* m);
Status decode_read_resp(std::string_view body, uint16_t flags, ReadResp* m);
Status decode_notif(std::string_view body, std::string_view* payload);
Status decode_read_done(std::string_view body, ReadDone* m);
Status decode_send_rts(std::string_view body, SendRts* m);
Status decode_recv_cts(std::string_view body, RecvCts* m);
Status decode_send_data(std::string_view body, uint16_t flags, SendData* m);

// A Result as a Status; `context` is prepended to a failure's message.
Status to_status(const Result& r, std::string_view context);

}  // namespace tcpx::engine::wire
