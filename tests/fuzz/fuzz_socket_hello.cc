// The socket transport's handshake: the listener's check of a connecting socket's Hello
// (wire::check_hello) and the connecting side's check of the reply (wire::check_hello_reply).
// An accepted Hello must be safe to file: it asks for 1 to the listener's sockets and its index
// fits the comm's socket table.
// Input: Hello (32 bytes), HelloReply (8), the listener's nonce (8) and socket count (2);
// zero-padded when short.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "fuzz_check.h"
#include "net/socket/wire.h"

namespace wire = tcpx::net::wire;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    struct Input {
        wire::Hello hello;
        wire::HelloReply reply;
        uint64_t listen_nonce;
        uint16_t nsocks;
    } in{};
    static_assert(sizeof(wire::Hello) + sizeof(wire::HelloReply) + 8 + 2 <= sizeof(Input));
    std::memcpy(&in.hello, data, std::min(size, sizeof(in.hello)));
    if (size > 32) std::memcpy(&in.reply, data + 32, std::min(size - 32, sizeof(in.reply)));
    if (size > 40) std::memcpy(&in.listen_nonce, data + 40, std::min<size_t>(size - 40, 8));
    if (size > 48) std::memcpy(&in.nsocks, data + 48, std::min<size_t>(size - 48, 2));

    const auto verdict = wire::check_hello(in.hello, in.listen_nonce, in.nsocks);
    FUZZ_CHECK(verdict.has_value() == (in.hello.magic == wire::kHelloMagic));
    if (verdict) {
        FUZZ_CHECK(wire::reply_status_text(*verdict) != nullptr);
        if (*verdict == wire::ReplyStatus::kAccepted) {
            const wire::Hello& h = in.hello;
            FUZZ_CHECK(h.version == wire::kVersion && h.listen_nonce == in.listen_nonce);
            // A connector may open fewer sockets than the listener offers, never more.
            FUZZ_CHECK(h.nsocks >= 1 && h.nsocks <= in.nsocks);
            // The listener files the socket like this (socket_net.cc, accept: a comm's table
            // has the size its first Hello asks for, and later ones must ask the same).
            std::vector<int> table(h.nsocks);
            int control = 0;
            int& slot =
                h.role == static_cast<uint16_t>(wire::Role::kControl) ? control : table.at(h.index);
            FUZZ_CHECK(h.role == static_cast<uint16_t>(wire::Role::kControl) ? h.index == 0
                                                                             : h.index < h.nsocks);
            slot = 1;
        }
    }

    const tcpx::Status st = wire::check_hello_reply(in.reply);
    const bool accepted = in.reply.magic == wire::kReplyMagic &&
                          in.reply.status == static_cast<uint16_t>(wire::ReplyStatus::kAccepted);
    FUZZ_CHECK(st.ok() == accepted);
    FUZZ_CHECK(st.ok() || !st.message().empty());
    return 0;
}
