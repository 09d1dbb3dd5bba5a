// An installed tcpx-p2p used from C++: two endpoints over loopback, a 1 MiB WRITE and a READ
// back, every byte checked. Exit code 0 and "consumer_cxx: ok" when it all worked.
#include <tcpx/config.h>
#include <tcpx/endpoint.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <vector>

namespace {

int fail(const char* what, const tcpx::Status& st) {
    std::fprintf(stderr, "consumer_cxx: %s: %s\n", what, st.to_string().c_str());
    return 1;
}

}  // namespace

int main() {
    tcpx::Config config;
    if (auto st = config.set("SOCKET_IFNAME", "=lo"); !st.ok()) return fail("config", st);
    if (auto st = config.set("NSOCKS", "2"); !st.ok()) return fail("config", st);
    auto a = tcpx::Endpoint::create(config, "consumer-a");
    auto b = tcpx::Endpoint::create(config, "consumer-b");
    if (!a.ok()) return fail("endpoint a", a.status());
    if (!b.ok()) return fail("endpoint b", b.status());
    auto peer = (*a)->connect((*b)->metadata());
    if (!peer.ok()) return fail("connect", peer.status());

    constexpr size_t kLen = 1 << 20;
    std::vector<uint8_t> src(kLen), dst(kLen, 0), back(kLen, 0);
    for (size_t i = 0; i < kLen; ++i) src[i] = static_cast<uint8_t>(i * 7 + 3);
    auto src_mem = (*a)->reg(src.data(), kLen);
    auto back_mem = (*a)->reg(back.data(), kLen);
    auto dst_mem = (*b)->reg(dst.data(), kLen);
    if (!src_mem.ok() || !back_mem.ok() || !dst_mem.ok()) {
        return fail("reg", !src_mem.ok() ? src_mem.status() : dst_mem.status());
    }
    auto remote = (*b)->describe(*dst_mem);
    if (!remote.ok()) return fail("describe", remote.status());

    auto w = (*a)->write(*peer, *src_mem, 0, *remote, 0, kLen);
    if (!w.ok()) return fail("write", w.status());
    if (auto st = (*a)->wait(*w, std::chrono::seconds(30)); !st.ok()) return fail("write", st);
    auto r = (*a)->read(*peer, *back_mem, 0, *remote, 0, kLen);
    if (!r.ok()) return fail("read", r.status());
    if (auto st = (*a)->wait(*r, std::chrono::seconds(30)); !st.ok()) return fail("read", st);
    if (dst != src || back != src) {
        std::fprintf(stderr, "consumer_cxx: the bytes differ\n");
        return 1;
    }
    std::printf("consumer_cxx: ok\n");
    return 0;
}
