// The socket transport's check of a connection handle received from a peer
// (net::SocketNet::check_peer_handle). A handle it passes may only send us back to the peer's
// own host (127.0.0.1 here, or, the peer being on loopback, another address of this host),
// carries no connect progress key, and has an empty tail.
// Input: the 128-byte handle (shorter inputs are zero-padded, longer ones cut).
#include <netinet/in.h>
#include <sys/socket.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "common/params.h"
#include "fuzz_check.h"
#include "net/socket/socket_net.h"
#include "net/socket/wire.h"

namespace {

struct World {
    tcpx::net::SocketNet* net = nullptr;  // lives for the whole run (its I/O threads too)
    tcpx::SocketAddress peer;
};

const World& world() {
    static const World w = [] {
        World out;
        auto net = tcpx::net::SocketNet::create(tcpx::Settings{});
        FUZZ_CHECK(net.ok());
        out.net = std::move(net).value().release();
        auto peer = tcpx::SocketAddress::parse("127.0.0.1", 40000);
        FUZZ_CHECK(peer.ok());
        out.peer = *peer;
        return out;
    }();
    return w;
}

bool names_127_0_0_1(const tcpx::net::wire::HandleBlob& b) {
    static const uint8_t v4[4] = {127, 0, 0, 1};
    static const uint8_t mapped[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 127, 0, 0, 1};
    if (b.family == AF_INET) return std::memcmp(b.addr, v4, 4) == 0;
    if (b.family == AF_INET6) return std::memcmp(b.addr, mapped, 16) == 0;
    return false;
}

// Whether the blob names a non-loopback address of this host.
bool names_own_address(const tcpx::net::wire::HandleBlob& b) {
    sockaddr_storage ss{};
    socklen_t len = 0;
    if (b.family == AF_INET) {
        auto* sin = reinterpret_cast<sockaddr_in*>(&ss);
        sin->sin_family = AF_INET;
        std::memcpy(&sin->sin_addr, b.addr, 4);
        len = sizeof(*sin);
    } else if (b.family == AF_INET6) {
        auto* sin6 = reinterpret_cast<sockaddr_in6*>(&ss);
        sin6->sin6_family = AF_INET6;
        std::memcpy(&sin6->sin6_addr, b.addr, 16);
        len = sizeof(*sin6);
    } else {
        return false;
    }
    auto addr = tcpx::SocketAddress::from_sockaddr(reinterpret_cast<sockaddr*>(&ss), len);
    return addr.ok() && !addr->is_loopback() && tcpx::is_own_address(*addr);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    const World& w = world();
    tcpx::net::Handle handle;
    std::memcpy(handle.bytes.data(), data, std::min(size, handle.bytes.size()));
    if (!w.net->check_peer_handle(&handle, w.peer).ok()) return 0;

    tcpx::net::wire::HandleBlob blob;
    std::memcpy(&blob, handle.bytes.data(), sizeof(blob));
    FUZZ_CHECK(blob.magic == tcpx::net::wire::kHandleMagic);
    FUZZ_CHECK(blob.version == tcpx::net::wire::kVersion);
    FUZZ_CHECK(blob.connect_key == 0);
    FUZZ_CHECK(blob.port != 0);
    // A handle may offer up to 64 sockets; connect() opens at most NSOCKS of them.
    FUZZ_CHECK(blob.nsocks >= 1 && blob.nsocks <= 64);
    // Never a third host: the peer's address, or (the peer being on loopback) another of ours.
    FUZZ_CHECK(names_127_0_0_1(blob) || names_own_address(blob));
    for (size_t i = sizeof(blob); i < handle.bytes.size(); ++i) FUZZ_CHECK(handle.bytes[i] == 0);
    // Checking again changes nothing: the check is idempotent.
    tcpx::net::Handle copy = handle;
    FUZZ_CHECK(w.net->check_peer_handle(&copy, w.peer).ok());
    FUZZ_CHECK(copy.bytes == handle.bytes);
    return 0;
}
