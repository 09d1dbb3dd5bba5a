// The check of Google's TCPX plugin handles received from a peer (net::check_tcpx_handle, used
// by V7Net::check_peer_handle). A handle it passes may only send us to the peer's own host
// (127.0.0.1 here, or, the peer being on loopback, another address of this host), has both
// addresses with a port, socket and thread counts within the plugin's limits, no connect state
// (connect_args, a pointer the plugin would follow), redirect_ctrl as 0 or 1 and an empty tail.
// Input: the 128-byte handle (shorter inputs are zero-padded, longer ones cut).
#include <netinet/in.h>
#include <sys/socket.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "common/socket.h"
#include "fuzz_check.h"
#include "net/plugin/tcpx_layout.h"
#include "net/plugin/v7_net.h"

namespace {

namespace gt = tcpx::net::google_tcpx;

tcpx::SocketAddress address_of(const gt::SocketAddress& a) {
    const socklen_t len = a.sa.sa_family == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6);
    auto addr = tcpx::SocketAddress::from_sockaddr(&a.sa, len);
    FUZZ_CHECK(addr.ok());
    FUZZ_CHECK(addr->port() != 0);
    return *addr;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    static const tcpx::SocketAddress peer = *tcpx::SocketAddress::parse("127.0.0.1", 40000);
    tcpx::net::Handle handle;
    std::memcpy(handle.bytes.data(), data, std::min(size, handle.bytes.size()));
    if (!tcpx::net::check_tcpx_handle(&handle, peer).ok()) return 0;

    gt::Handle h;
    std::memcpy(&h, handle.bytes.data(), sizeof(h));
    FUZZ_CHECK(h.connect_args == nullptr);
    FUZZ_CHECK(h.num_socks >= 1 && h.num_socks <= gt::kMaxSockets);
    FUZZ_CHECK(h.num_threads >= 1 && h.num_threads <= gt::kMaxThreads);
    FUZZ_CHECK(h.num_socks % h.num_threads == 0);
    // redirect_ctrl is a bool to the plugin: 0 or 1, whatever the wire held.
    FUZZ_CHECK(handle.bytes[offsetof(gt::Handle, redirect_ctrl)] <= 1);
    for (const gt::SocketAddress* a : {&h.connect_addr, &h.ctrl_addr}) {
        FUZZ_CHECK(a->sa.sa_family == AF_INET || a->sa.sa_family == AF_INET6);
        const tcpx::SocketAddress addr = address_of(*a);
        // Never a third host: the peer's address, or one of this host's own.
        FUZZ_CHECK(addr.same_host(peer) || (tcpx::is_own_address(addr) && !addr.is_loopback()));
    }
    for (size_t i = sizeof(h); i < handle.bytes.size(); ++i) FUZZ_CHECK(handle.bytes[i] == 0);
    // With our own thread count lower: lowered to a divisor of num_socks within it, nothing else
    // changed.
    const int ours = 1 + (size > 0 ? data[0] : 0) % gt::kMaxThreads;
    tcpx::net::Handle fewer = handle;
    FUZZ_CHECK(tcpx::net::check_tcpx_handle(&fewer, peer, ours).ok());
    gt::Handle f;
    std::memcpy(&f, fewer.bytes.data(), sizeof(f));
    FUZZ_CHECK(f.num_threads >= 1 && f.num_threads <= std::min(ours, h.num_threads));
    FUZZ_CHECK(f.num_socks == h.num_socks && f.num_socks % f.num_threads == 0);
    // Checking again changes nothing: the check is idempotent.
    tcpx::net::Handle copy = handle;
    FUZZ_CHECK(tcpx::net::check_tcpx_handle(&copy, peer).ok());
    FUZZ_CHECK(copy.bytes == handle.bytes);
    return 0;
}
