#include <gtest/gtest.h>

#include "net/socket/wire.h"

namespace tcpx::net::wire {
namespace {

constexpr uint64_t kNonce = 0x1234;
constexpr uint16_t kSocks = 4;

Hello hello(Role role, uint16_t index) {
    return Hello{kHelloMagic, kVersion, static_cast<uint16_t>(role), kNonce, 77, index, kSocks, 0};
}

TEST(SocketHandshake, AcceptsEverySocketOfAComm) {
    EXPECT_EQ(check_hello(hello(Role::kControl, 0), kNonce, kSocks), ReplyStatus::kAccepted);
    for (uint16_t i = 0; i < kSocks; ++i) {
        EXPECT_EQ(check_hello(hello(Role::kData, i), kNonce, kSocks), ReplyStatus::kAccepted);
    }
}

TEST(SocketHandshake, ForeignBytesGetNoReply) {
    Hello h = hello(Role::kControl, 0);
    h.magic = kReplyMagic;
    EXPECT_FALSE(check_hello(h, kNonce, kSocks).has_value());
}

TEST(SocketHandshake, RefusalsSayWhy) {
    Hello h = hello(Role::kControl, 0);
    h.version = kVersion + 1;
    EXPECT_EQ(check_hello(h, kNonce, kSocks), ReplyStatus::kVersionMismatch);
    EXPECT_EQ(check_hello(hello(Role::kControl, 0), kNonce + 1, kSocks),
              ReplyStatus::kWrongListener);
    // More sockets than the listener's: refused; fewer (a connector with a smaller NSOCKS): a
    // comm of that many.
    EXPECT_EQ(check_hello(hello(Role::kControl, 0), kNonce, kSocks - 1), ReplyStatus::kBadHello);
    EXPECT_EQ(check_hello(hello(Role::kControl, 0), kNonce, kSocks + 1), ReplyStatus::kAccepted);
    h = hello(Role::kControl, 0);
    h.nsocks = 0;
    EXPECT_EQ(check_hello(h, kNonce, kSocks), ReplyStatus::kBadHello);
    EXPECT_EQ(check_hello(hello(Role::kControl, 1), kNonce, kSocks), ReplyStatus::kBadHello);
    EXPECT_EQ(check_hello(hello(Role::kData, kSocks), kNonce, kSocks), ReplyStatus::kBadHello);
    h = hello(Role::kData, 0);
    h.role = 3;
    EXPECT_EQ(check_hello(h, kNonce, kSocks), ReplyStatus::kBadHello);
}

TEST(SocketHandshake, OnlyAnAcceptanceLetsTheConnectorOn) {
    EXPECT_TRUE(check_hello_reply(HelloReply{kReplyMagic, kVersion, 0}).ok());
    const Status refused = check_hello_reply(
        HelloReply{kReplyMagic, 7, static_cast<uint16_t>(ReplyStatus::kWrongListener)});
    EXPECT_EQ(refused.code(), StatusCode::kUnavailable);
    EXPECT_NE(refused.message().find("another listener"), std::string_view::npos);
    EXPECT_NE(refused.message().find("version 7"), std::string_view::npos);
    EXPECT_EQ(check_hello_reply(HelloReply{kReplyMagic, kVersion, 999}).code(),
              StatusCode::kUnavailable);
    EXPECT_EQ(check_hello_reply(HelloReply{kHelloMagic, kVersion, 0}).code(),
              StatusCode::kProtocol);
}

}  // namespace
}  // namespace tcpx::net::wire
