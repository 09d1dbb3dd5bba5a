// On-the-wire formats of the socket transport (protocol version 1).
//
// A comm is one control socket plus `nsocks` data sockets, all opened by the sending side:
//
//   every socket, first bytes   Hello        sender -> receiver   (magic, version, comm nonce,
//   role) control, once               HelloReply   receiver -> sender   (accepted, or why not)
//   control, per small message  MsgHeader    sender -> receiver   (seq, tag, size) + payload
//   data, per chunk             ChunkHeader  sender -> receiver   (seq, tag, size, offset,
//                                                                  length) + payload
//
// Messages are numbered by the sender in posting order (seq) and bound by the receiver to its
// posted receives in the same order. A small message travels whole on the control socket; a
// larger one is cut into chunks that may travel on any data socket (the sender hands the next
// chunk to whichever socket drains first); each socket carries its messages in seq order. Every
// header describes its whole message, so whichever socket sees message `seq` first binds it, as
// soon as every earlier message is bound: no socket waits on another to learn where data goes.
// Every header starts with a magic number so a desynchronized or foreign stream is caught at once.
//
// Fields are little-endian (the x86-64 and Arm64 hosts this runs on); a peer of the other
// endianness fails the magic check.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>

#include "tcpx/status.h"

namespace tcpx::net::wire {

inline constexpr uint16_t kVersion = 1;

inline constexpr uint32_t kHandleMagic = 0x48585054;  // "TPXH"
inline constexpr uint32_t kHelloMagic = 0x31585054;   // "TPX1"
inline constexpr uint32_t kReplyMagic = 0x52585054;   // "TPXR"
inline constexpr uint32_t kMsgMagic = 0x4d585054;     // "TPXM"
inline constexpr uint32_t kChunkMagic = 0x43585054;   // "TPXC"

enum class Role : uint16_t { kControl = 1, kData = 2 };

// The listen handle, inside the 128-byte ncclNet handle.
struct HandleBlob {
    uint32_t magic;
    uint16_t version;
    uint16_t family;  // AF_INET / AF_INET6
    uint8_t addr[16];
    uint32_t scope_id;
    uint16_t port;    // host order
    uint16_t nsocks;  // data sockets the listener expects per comm
    uint64_t listen_nonce;
    // connect() progress, kept in the caller's handle as ncclNet allows: a key into the
    // provider's table of connects in progress (never a pointer, so a stale or foreign handle
    // cannot make us dereference garbage). 0 when no connect is in progress.
    uint64_t connect_key;
};
static_assert(sizeof(HandleBlob) == 48);

struct Hello {
    uint32_t magic;
    uint16_t version;
    uint16_t role;  // Role
    uint64_t listen_nonce;
    uint64_t comm_nonce;  // identifies the connecting comm; all its sockets carry it
    uint16_t index;       // data socket index (0 for control)
    uint16_t nsocks;
    uint32_t reserved;
};
static_assert(sizeof(Hello) == 32);

enum class ReplyStatus : uint16_t {
    kAccepted = 0,
    kVersionMismatch = 1,
    kWrongListener = 2,  // the handle's listen nonce is not this listener's (stale handle)
    kBadHello = 3,       // role, index or socket count not acceptable
    kBusy = 4,           // the listener has as many comms being set up as it takes
};

struct HelloReply {
    uint32_t magic;
    uint16_t version;  // the replier's version
    uint16_t status;   // ReplyStatus
};
static_assert(sizeof(HelloReply) == 8);

// A whole message on the control socket; `size` payload bytes follow.
struct MsgHeader {
    uint32_t magic;
    uint32_t reserved;
    uint64_t seq;
    uint64_t size;
    int32_t tag;
    uint32_t reserved2;
};
static_assert(sizeof(MsgHeader) == 32);
// The largest message that travels on the control socket: INLINE_THRESHOLD's maximum (larger
// ones go to the data sockets). The receiver refuses a larger size as a protocol error, so a
// peer cannot keep one service of its control socket reading for as long as it keeps sending.
inline constexpr uint64_t kMaxInlineSize = 256 * 1024;
// The most bytes of a message that cannot land (larger than its buffer, or no buffer has its tag)
// that the receiver reads and drops, failing only that receive; a larger one fails the comm.
inline constexpr uint64_t kMaxDropBytes = 64ull << 20;

// One chunk of message `seq` (of `size` bytes in all) on a data socket; `length` bytes follow,
// which belong at `offset` in the message.
struct ChunkHeader {
    uint32_t magic;
    uint32_t length;
    uint64_t seq;
    uint64_t size;
    uint64_t offset;
    int32_t tag;
    uint32_t reserved;
};
static_assert(sizeof(ChunkHeader) == 40);

// A chunk starts at a multiple of kChunkAlign in its message and is a multiple of it long, unless
// it ends the message. The receiver keeps a bit per kChunkAlign bytes of each message it is
// receiving, and refuses a chunk whose bytes were claimed by another: chunks that overlap could
// otherwise add up to the message's size and complete a receive with bytes never written, or
// while another socket was still writing into the buffer that the receive had handed back.
inline constexpr uint64_t kChunkAlign = 4096;

const char* reply_status_text(ReplyStatus status);

// The listener's verdict on a complete Hello: nullopt when it is not a tcpx-p2p handshake at all
// (closed without a reply), else kAccepted or the refusal to send back. Accepted means the role is
// kControl with index 0, or kData with index < the Hello's nsocks, which is 1 to the listener's
// own `nsocks`.
std::optional<ReplyStatus> check_hello(const Hello& hello, uint64_t listen_nonce, uint16_t nsocks);

// The connecting side's reading of the listener's complete reply: OK when it accepted.
Status check_hello_reply(const HelloReply& reply);

}  // namespace tcpx::net::wire
