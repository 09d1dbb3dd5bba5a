// The control connection's framing limits: what a peer's message may weigh before and after the
// handshake, with and without a transfer's bytes inline.
#include "engine/ctrl_conn.h"

#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>

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

class CtrlConnLimits : public ::testing::Test {
 protected:
    void SetUp() override {
        int fds[2];
        ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, fds), 0);
        conn_.reset(Fd(fds[0]));
        peer_ = Fd(fds[1]);
        int big = 8 << 20;
        ::setsockopt(fds[1], SOL_SOCKET, SO_SNDBUF, &big, sizeof(big));
        ::setsockopt(fds[0], SOL_SOCKET, SO_RCVBUF, &big, sizeof(big));
    }

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

}  // namespace
}  // namespace tcpx::engine
