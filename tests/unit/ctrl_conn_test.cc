// The control connection's framing limits: what a peer's message may weigh before and after the
// handshake, with and without a transfer's bytes inline.
#include "engine/ctrl_conn.h"

#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "common/status_util.h"

namespace tcpx::engine {
namespace {

// A message of `type` whose body is `body_bytes` long, flagged `flags`.
std::string message(wire::MsgType type, uint16_t flags, size_t body_bytes) {
    std::string msg = wire::begin_message(type, flags);
    msg.append(body_bytes, 'x');
    wire::end_message(&msg);
    return msg;
}

// `conn` reading one end of a socket pair whose other end, `peer`, writes into buffers of 8 MiB.
void connect_pair(CtrlConn* conn, Fd* peer) {
    int fds[2];
    ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, fds), 0);
    conn->reset(Fd(fds[0]));
    *peer = Fd(fds[1]);
    int big = 8 << 20;
    ::setsockopt(fds[1], SOL_SOCKET, SO_SNDBUF, &big, sizeof(big));
    ::setsockopt(fds[0], SOL_SOCKET, SO_RCVBUF, &big, sizeof(big));
}

class CtrlConnLimits : public ::testing::Test {
 protected:
    void SetUp() override { connect_pair(&conn_, &peer_); }

    // Sends `msg` from the peer's end and reads until the message is whole, refused, or the
    // stream ends. True: handed out whole, with its body's size in *body_bytes.
    StatusOr<bool> deliver(const std::string& msg, size_t* body_bytes) {
        size_t sent = 0;
        while (true) {
            if (sent < msg.size()) {
                const ssize_t n = ::send(peer_.get(), msg.data() + sent, msg.size() - sent, 0);
                if (n > 0) sent += static_cast<size_t>(n);
            }
            bool eof = false;
            TCPX_RETURN_IF_ERROR(conn_.read(&eof));
            wire::Header h;
            std::string_view body;
            TCPX_ASSIGN_OR_RETURN(bool whole, conn_.next_message(&h, &body));
            if (whole) {
                *body_bytes = body.size();
                return true;
            }
            if (eof) return false;
        }
    }

    CtrlConn conn_;
    Fd peer_;
};

TEST_F(CtrlConnLimits, BeforeTheHandshakeInlineDataGetsNoAllowance) {
    size_t got = 0;
    // Before the handshake: kHandshakeMessage, inline flag or not.
    auto r = deliver(
        message(wire::MsgType::kWriteReq, wire::kFlagInline, wire::kHandshakeMessage + 1), &got);
    EXPECT_EQ(r.status().code(), StatusCode::kProtocol) << r.status().to_string();
}

TEST_F(CtrlConnLimits, AfterTheHandshakeAnInlineMessageMayCarryItsData) {
    constexpr uint32_t kLimit = 64 * 1024;
    conn_.set_max_message(kLimit, wire::kMaxInlineData);
    size_t got = 0;
    // A 64 KiB write with its request: over MAX_CTRL_MESSAGE, taken because it is inline.
    auto r = deliver(message(wire::MsgType::kWriteReq, wire::kFlagInline, kLimit + 200), &got);
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    EXPECT_TRUE(*r);
    EXPECT_EQ(got, kLimit + 200);
    // Up to the allowance exactly.
    r = deliver(message(wire::MsgType::kReadResp, wire::kFlagInline, kLimit + wire::kMaxInlineData),
                &got);
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    EXPECT_EQ(got, kLimit + wire::kMaxInlineData);
}

TEST_F(CtrlConnLimits, PastTheAllowanceOrWithoutTheFlagIsRefused) {
    constexpr uint32_t kLimit = 64 * 1024;
    conn_.set_max_message(kLimit, wire::kMaxInlineData);
    size_t got = 0;
    auto r = deliver(message(wire::MsgType::kWriteReq, 0, kLimit + 1), &got);
    EXPECT_EQ(r.status().code(), StatusCode::kProtocol) << r.status().to_string();
}

TEST_F(CtrlConnLimits, PastTheAllowanceWithTheFlagIsRefused) {
    constexpr uint32_t kLimit = 64 * 1024;
    conn_.set_max_message(kLimit, wire::kMaxInlineData);
    size_t got = 0;
    auto r = deliver(
        message(wire::MsgType::kWriteReq, wire::kFlagInline, kLimit + wire::kMaxInlineData + 1),
        &got);
    EXPECT_EQ(r.status().code(), StatusCode::kProtocol) << r.status().to_string();
}

// A message that grew the buffer within the connection's own 1 MiB (an inline write of 700 KiB)
// leaves it at one read's worth once trim() finds it empty (the engine's tick): kept, every peer
// that ever sent one held about 1 MiB for good, MAX_PEERS times. trim() never drops bytes not yet
// handed out: a message half here when it runs arrives whole after it.
TEST_F(CtrlConnLimits, ABufferGrownForOneMessageIsTrimmedOnceEmpty) {
    constexpr size_t kRead = 256 * 1024;
    conn_.set_max_message(64 * 1024, wire::kMaxInlineData);
    size_t got = 0;
    auto r = deliver(message(wire::MsgType::kWriteReq, wire::kFlagInline, 700 * 1024), &got);
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    ASSERT_TRUE(*r);
    EXPECT_EQ(got, 700u * 1024);
    EXPECT_GT(conn_.buffer_capacity(), 700u * 1024);  // (it held the message whole)
    EXPECT_LE(conn_.room_held(), 0u);                 // within the own buffer
    conn_.trim();  // the message was handed out, not yet dropped (next_message does): kept
    EXPECT_GT(conn_.buffer_capacity(), 700u * 1024);
    wire::Header h;
    std::string_view body;
    auto more = conn_.next_message(&h, &body);  // all handled
    ASSERT_TRUE(more.ok());
    EXPECT_FALSE(*more);
    conn_.trim();
    EXPECT_LE(conn_.buffer_capacity(), kRead);
    // Half a message here: trim() keeps it.
    const std::string half_sent = message(wire::MsgType::kWriteReq, wire::kFlagInline, 600 * 1024);
    const size_t half = half_sent.size() / 2;
    size_t sent = 0;
    while (sent < half) {
        const ssize_t n = ::send(peer_.get(), half_sent.data() + sent, half - sent, 0);
        ASSERT_GT(n, 0);
        sent += static_cast<size_t>(n);
    }
    for (int i = 0; i < 50 && conn_.buffered() < half; ++i) {
        bool eof = false;
        ASSERT_TRUE(conn_.read(&eof).ok());
        more = conn_.next_message(&h, &body);
        ASSERT_TRUE(more.ok());
        ASSERT_FALSE(*more);
    }
    ASSERT_EQ(conn_.buffered(), half);
    conn_.trim();
    EXPECT_EQ(conn_.buffered(), half);
    r = deliver(half_sent.substr(half), &got);
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    ASSERT_TRUE(*r);
    EXPECT_EQ(got, 600u * 1024);
}

// A peer that sends faster than we handle cannot make us buffer more than one maximal message
// and one read (256 KiB) of its stream, whatever it has sent: here three maximal messages are
// waiting in the socket. (Before: two maximal messages read ahead, and the vector's own doubling
// on top, about four times MAX_CTRL_MESSAGE per peer.) Every message then arrives whole.
TEST_F(CtrlConnLimits, ReadAheadHoldsOneMaximalMessage) {
    constexpr uint32_t kLimit = 1 << 20;
    constexpr size_t kRead = 256 * 1024;
    conn_.set_max_message(kLimit, 0);
    const std::string msg = message(wire::MsgType::kWriteReq, 0, kLimit);
    size_t sent = 0;
    const std::string all = msg + msg + msg;
    while (sent < all.size()) {
        const ssize_t n = ::send(peer_.get(), all.data() + sent, all.size() - sent, 0);
        ASSERT_GT(n, 0) << "the socket pair's buffers hold less than three messages";
        sent += static_cast<size_t>(n);
    }
    bool eof = false;
    ASSERT_TRUE(conn_.read(&eof).ok());
    const size_t bound = sizeof(wire::Header) + kLimit;
    EXPECT_GE(conn_.buffered(), bound);  // the first message is whole
    EXPECT_LT(conn_.buffered(), bound + kRead);
    EXPECT_LE(conn_.buffer_capacity(), bound + kRead);
    for (int i = 0; i < 3; ++i) {
        wire::Header h;
        std::string_view body;
        bool whole = false;
        for (int tries = 0; !whole && tries < 1000; ++tries) {
            ASSERT_TRUE(conn_.read(&eof).ok());
            auto r = conn_.next_message(&h, &body);
            ASSERT_TRUE(r.ok()) << r.status().to_string();
            whole = *r;
            EXPECT_LE(conn_.buffer_capacity(), bound + kRead);
        }
        ASSERT_TRUE(whole) << "message " << i;
        EXPECT_EQ(body.size(), kLimit);
    }
}

// Small messages streamed at us are read a part at a time (about 256 KiB), not up to the
// maximal message's bound: what the engine has not handled yet stays in the socket, where TCP
// holds the sender back. Every message still comes, in order, and read() says when it stopped
// with more waiting.
TEST_F(CtrlConnLimits, ManySmallMessagesAreReadAPartAtATime) {
    constexpr uint32_t kLimit = 16 << 20;
    constexpr size_t kRead = 256 * 1024;
    conn_.set_max_message(kLimit, 0);
    std::string all;
    constexpr int kCount = 4000;  // 4 MiB
    for (int i = 0; i < kCount; ++i) {
        std::string msg = wire::begin_message(wire::MsgType::kNotif, 0);
        msg.append(reinterpret_cast<const char*>(&i), sizeof(i));
        msg.append(1024 - sizeof(i), 'n');
        wire::end_message(&msg);
        all += msg;
    }
    size_t sent = 0;
    while (sent < all.size()) {
        const ssize_t n = ::send(peer_.get(), all.data() + sent, all.size() - sent, 0);
        ASSERT_GT(n, 0) << "the socket pair's buffers hold less than 4 MiB";
        sent += static_cast<size_t>(n);
    }
    int next = 0;
    bool stopped_with_more = false;
    for (int rounds = 0; next < kCount && rounds < 1000; ++rounds) {
        bool eof = false, more = false;
        ASSERT_TRUE(conn_.read(&eof, &more).ok());
        ASSERT_FALSE(eof);
        stopped_with_more = stopped_with_more || more;
        EXPECT_LT(conn_.buffered(), kRead + 2048);
        EXPECT_LE(conn_.buffer_capacity(), 2 * kRead);
        wire::Header h;
        std::string_view body;
        while (true) {
            auto whole = conn_.next_message(&h, &body);
            ASSERT_TRUE(whole.ok()) << whole.status().to_string();
            if (!*whole) break;
            int i = -1;
            std::memcpy(&i, body.data(), sizeof(i));
            ASSERT_EQ(i, next);
            ++next;
        }
    }
    EXPECT_EQ(next, kCount);
    EXPECT_TRUE(stopped_with_more);
}

// unread_message(): the message handed out last comes again, whole, before the next.
TEST_F(CtrlConnLimits, AnUnreadMessageComesAgain) {
    conn_.set_max_message(1 << 20, 0);
    const std::string first = message(wire::MsgType::kNotif, 0, 10);
    const std::string second = message(wire::MsgType::kPing, 0, 3);
    const std::string both = first + second;
    ASSERT_EQ(::send(peer_.get(), both.data(), both.size(), 0), static_cast<ssize_t>(both.size()));
    bool eof = false;
    ASSERT_TRUE(conn_.read(&eof).ok());
    wire::Header h;
    std::string_view body;
    ASSERT_TRUE(*conn_.next_message(&h, &body));
    EXPECT_EQ(h.type, static_cast<uint16_t>(wire::MsgType::kNotif));
    conn_.unread_message();
    ASSERT_TRUE(conn_.read(&eof).ok());
    ASSERT_TRUE(*conn_.next_message(&h, &body));
    EXPECT_EQ(h.type, static_cast<uint16_t>(wire::MsgType::kNotif));
    EXPECT_EQ(body.size(), 10u);
    ASSERT_TRUE(*conn_.next_message(&h, &body));
    EXPECT_EQ(h.type, static_cast<uint16_t>(wire::MsgType::kPing));
    EXPECT_EQ(body.size(), 3u);
    EXPECT_FALSE(*conn_.next_message(&h, &body));
}

// A connection and the socket its peer writes into, drawing on `room`.
struct RoomConn {
    explicit RoomConn(CtrlRoom* room, uint32_t limit) {
        connect_pair(&conn, &peer);
        conn.set_max_message(limit, 0);
        conn.set_room(room);
    }
    void send(std::string_view bytes) {
        while (!bytes.empty()) {
            const ssize_t n = ::send(peer.get(), bytes.data(), bytes.size(), 0);
            ASSERT_GT(n, 0) << "the socket pair's buffers are too small";
            bytes.remove_prefix(static_cast<size_t>(n));
        }
    }
    // Reads until a message is whole (its body's size) or nothing more comes (-1).
    long next() {
        for (int tries = 0; tries < 1000; ++tries) {
            bool eof = false;
            if (!conn.read(&eof).ok()) return -2;
            wire::Header h;
            std::string_view body;
            auto whole = conn.next_message(&h, &body);
            if (!whole.ok()) return -3;
            if (*whole) return static_cast<long>(body.size());
            if (conn.starved()) return -1;
        }
        return -1;
    }
    CtrlConn conn;
    Fd peer;
};

// Connections share one room for messages larger than their own 1 MiB buffers: the first 2 MiB
// message takes room for itself whole and a read past it (about 1.25 MiB), the second finds
// too little left, reads nothing more and says so (starved), until the first is handled and its
// room given back; then it comes whole. (Before, each connection held up to one maximal message
// of its own: MAX_CTRL_MESSAGE times the peers.)
TEST(CtrlConnRoom, LargeMessagesWaitForTheSharedRoom) {
    CtrlRoom room;
    room.limit = 2 << 20;
    RoomConn a(&room, 4 << 20), b(&room, 4 << 20);
    constexpr size_t kBody = 2 << 20;
    const std::string msg = message(wire::MsgType::kWriteReq, 0, kBody);
    a.send(msg);
    b.send(msg);
    const uint64_t need = sizeof(wire::Header) + kBody + 256 * 1024 - CtrlConn::kOwnBuffer;
    bool eof = false;
    ASSERT_TRUE(a.conn.read(&eof).ok());
    EXPECT_EQ(room.used, need);
    EXPECT_EQ(a.conn.room_held(), need);
    ASSERT_TRUE(b.conn.read(&eof).ok());
    EXPECT_TRUE(b.conn.starved());
    EXPECT_FALSE(b.conn.room_fits());
    EXPECT_LE(b.conn.buffer_capacity(), CtrlConn::kOwnBuffer);
    EXPECT_EQ(room.used, need);
    // The first is handled: its room comes back as soon as nothing is left to hand out.
    EXPECT_EQ(a.next(), static_cast<long>(kBody));
    wire::Header h;
    std::string_view body;
    EXPECT_FALSE(*a.conn.next_message(&h, &body));
    EXPECT_EQ(room.used, 0u);
    EXPECT_EQ(a.conn.room_held(), 0u);
    EXPECT_LE(a.conn.buffer_capacity(), CtrlConn::kOwnBuffer);
    EXPECT_TRUE(b.conn.room_fits());
    EXPECT_EQ(b.next(), static_cast<long>(kBody));
    EXPECT_FALSE(*b.conn.next_message(&h, &body));
    EXPECT_EQ(room.used, 0u);
}

// The room a large message took goes back once it is handled even when the next message has
// begun behind it: a peer that sends a 2 MiB message followed by part of a heartbeat, and the
// heartbeat's rest with the next one's beginning a little later, and so on, never leaves the
// buffer empty. Its part of a message moves to the own buffer, the room comes back at once, and
// the heartbeat still arrives whole. trim() (the engine's tick) then leaves one read's worth.
TEST(CtrlConnRoom, RoomIsGivenBackWithTheNextMessageBegunBehindTheLargeOne) {
    CtrlRoom room;
    RoomConn a(&room, 4 << 20);
    const std::string big = message(wire::MsgType::kWriteReq, 0, 2 << 20);
    const std::string ping = message(wire::MsgType::kPing, 0, 8);
    a.send(big + ping.substr(0, 10));
    EXPECT_EQ(a.next(), 2 << 20);
    EXPECT_GT(room.used, 0u);  // (the large message is handed out, not yet dropped)
    wire::Header h;
    std::string_view body;
    auto more = a.conn.next_message(&h, &body);  // dropped; the heartbeat's beginning is left
    ASSERT_TRUE(more.ok());
    EXPECT_FALSE(*more);
    EXPECT_EQ(room.used, 0u);
    EXPECT_EQ(a.conn.room_held(), 0u);
    EXPECT_EQ(a.conn.buffered(), 10u);
    EXPECT_LE(a.conn.buffer_capacity(), CtrlConn::kOwnBuffer);
    a.conn.trim();
    EXPECT_LE(a.conn.buffer_capacity(), 256u * 1024);
    EXPECT_EQ(a.conn.buffered(), 10u);
    a.send(std::string_view(ping).substr(10));
    EXPECT_EQ(a.next(), 8);
    EXPECT_EQ(room.used, 0u);
}

// A header whose length its limit refuses takes no room and no memory: next_message says why.
TEST(CtrlConnRoom, AMessagePastItsLimitTakesNoRoom) {
    CtrlRoom room;
    room.limit = 64 << 20;
    RoomConn a(&room, 1 << 20);
    std::string msg = message(wire::MsgType::kWriteReq, 0, 8 << 20);
    msg.resize(512 * 1024);
    a.send(msg);
    EXPECT_EQ(a.next(), -3);
    EXPECT_EQ(room.used, 0u);
    EXPECT_LE(a.conn.buffer_capacity(), CtrlConn::kOwnBuffer);
}

// Room held for a message that has not come whole stays held (the engine fails a peer that sends
// nothing whole for PEER_TIMEOUT_MS); once the message is whole and handled, nothing is held.
TEST(CtrlConnRoom, RoomHeldForAPartialMessageIsGivenBackOnceItIsHandled) {
    CtrlRoom room;
    RoomConn a(&room, 4 << 20);
    const std::string msg = message(wire::MsgType::kWriteReq, 0, 2 << 20);
    a.send(std::string_view(msg).substr(0, 600 * 1024));
    EXPECT_EQ(a.next(), -1);
    EXPECT_GT(a.conn.room_held(), 0u);
    EXPECT_EQ(room.used, a.conn.room_held());
    EXPECT_EQ(a.conn.front_lacks(), msg.size() - 600 * 1024);
    a.send(std::string_view(msg).substr(600 * 1024));
    EXPECT_EQ(a.next(), 2 << 20);
    wire::Header h;
    std::string_view body;
    EXPECT_FALSE(*a.conn.next_message(&h, &body));
    EXPECT_EQ(a.conn.room_held(), 0u);
    EXPECT_EQ(room.used, 0u);
    // Closed with room held: given back too.
    a.send(std::string_view(msg).substr(0, 600 * 1024));
    EXPECT_EQ(a.next(), -1);
    EXPECT_GT(room.used, 0u);
    a.conn.close();
    EXPECT_EQ(room.used, 0u);
}

// A message queued with its inline bytes apart (queue(msg, tail)) goes out as one message, in
// order with the others, byte for byte, also when the socket takes it a piece at a time.
TEST(CtrlConnQueue, AMessageAndItsInlineBytesGoOutAsOne) {
    int fds[2];
    ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, fds), 0);
    CtrlConn out(Fd{fds[0]}), in(Fd{fds[1]});
    in.set_max_message(1 << 20, 1 << 20);
    std::string tail(300 * 1024, '\0');
    for (size_t i = 0; i < tail.size(); ++i) tail[i] = static_cast<char>(i * 7 + i / 4096);
    std::string head = wire::begin_message(wire::MsgType::kWriteReq, wire::kFlagInline);
    head.append("head");
    wire::end_message(&head, tail.size());
    out.queue(message(wire::MsgType::kPing, 0, 0));
    out.queue(head, tail);
    out.queue(message(wire::MsgType::kNotif, 0, 5));
    std::vector<std::pair<uint16_t, std::string>> got;
    for (int rounds = 0; got.size() < 3 && rounds < 100000; ++rounds) {
        ASSERT_TRUE(out.flush().ok());
        bool eof = false;
        ASSERT_TRUE(in.read(&eof).ok());
        ASSERT_FALSE(eof);
        wire::Header h;
        std::string_view body;
        while (true) {
            auto whole = in.next_message(&h, &body);
            ASSERT_TRUE(whole.ok()) << whole.status().to_string();
            if (!*whole) break;
            got.emplace_back(h.type, std::string(body));
        }
    }
    ASSERT_EQ(got.size(), 3u);
    EXPECT_EQ(got[0].first, static_cast<uint16_t>(wire::MsgType::kPing));
    EXPECT_EQ(got[1].first, static_cast<uint16_t>(wire::MsgType::kWriteReq));
    EXPECT_EQ(got[1].second, "head" + tail);
    EXPECT_EQ(got[2].first, static_cast<uint16_t>(wire::MsgType::kNotif));
    EXPECT_EQ(got[2].second.size(), 5u);
    EXPECT_FALSE(out.has_output());
}

}  // namespace
}  // namespace tcpx::engine
