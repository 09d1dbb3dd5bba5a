#include "tests/support/engine_test_util.h"

#include <gtest/gtest.h>

#include <cstdlib>

namespace tcpx::testing {

Config engine_test_config() {
    Config c;
    c.socket_ifname = "=lo";
    c.socket_family = "ipv4";
    c.nsocks = 2;
    c.io_threads = 2;
    c.channels = 2;
    c.xfer_chunk_size = 256 * 1024;
    c.peer_timeout_ms = 5000;
    c.connect_timeout_ms = 5000;
    c.handshake_timeout_ms = 5000;
    // Who does the socket I/O (auto by default): set to run the tests in either mode.
    if (const char* io = std::getenv("TCPX_P2P_SOCKET_IO"); io != nullptr) c.socket_io = io;
    // Where CTest says the plugin probe is (the test binaries are not where the loader looks).
    if (const char* probe = std::getenv("TCPX_P2P_PLUGIN_PROBE_PATH"); probe != nullptr) {
        c.plugin_probe_path = probe;
    }
    return c;
}

std::unique_ptr<Endpoint> make_endpoint(const std::string& name, const Config& config) {
    auto ep = Endpoint::create(config, name);
    EXPECT_TRUE(ep.ok()) << ep.status().to_string();
    return ep.ok() ? std::move(ep).value() : nullptr;
}

Link link(Endpoint* a, Endpoint* b) {
    Link out;
    auto id = a->connect(b->metadata());
    EXPECT_TRUE(id.ok()) << id.status().to_string();
    if (!id.ok()) return out;
    out.a_to_b = *id;
    auto back = b->accept(std::chrono::seconds(5));
    EXPECT_TRUE(back.ok()) << back.status().to_string();
    if (back.ok()) out.b_to_a = *back;
    return out;
}

GuardedBuffer::GuardedBuffer(size_t size, uint8_t fill)
    : size_(size), storage_(size + 2 * kCanary, 0xa5) {
    std::fill(storage_.begin() + kCanary, storage_.begin() + kCanary + size, fill);
}

bool GuardedBuffer::canaries_intact() const {
    for (size_t i = 0; i < kCanary; ++i) {
        if (storage_[i] != 0xa5 || storage_[kCanary + size_ + i] != 0xa5) return false;
    }
    return true;
}

}  // namespace tcpx::testing
