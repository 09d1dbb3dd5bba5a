// Loading the test plugins by path, as a user loads a real one: shared by the plugin tests (one
// binary; the paths are its compile definitions).
#pragma once

#include <gtest/gtest.h>
#include <stdlib.h>

#include <memory>
#include <string>

#include "common/params.h"
#include "net/net.h"
#include "net/plugin/plugin_loader.h"

namespace tcpx::testing {

// The emulated GPUDirect-TCPX plugin over loopback, two sockets and two I/O threads. It builds its
// transport from the environment, like the real one from NCCL_*. Its "CUDA" memory is host memory
// here, GPU or not (the GPU mode runs in tcpx_gpu_tests).
inline std::unique_ptr<net::Net> load_fake() {
    setenv("TCPX_P2P_SOCKET_IFNAME", "=lo", 1);
    setenv("TCPX_P2P_SOCKET_FAMILY", "ipv4", 1);
    setenv("TCPX_P2P_NSOCKS", "2", 1);
    setenv("TCPX_P2P_IO_THREADS", "2", 1);
    setenv("FAKETCPX_MEMORY", "host", 1);
    auto settings = Settings::from_env();
    EXPECT_TRUE(settings.ok()) << settings.status().to_string();
    if (!settings.ok()) return nullptr;
    auto net = net::load_net_plugin(TCPX_FAKE_TCPX_PATH, *settings);
    EXPECT_TRUE(net.ok()) << net.status().to_string();
    return net.ok() ? std::move(net).value() : nullptr;
}

// The built test plugin libnccl-net-<stem>.so (tests/fakes).
inline std::string test_net_path(const std::string& stem) {
    return std::string(TCPX_TEST_NET_DIR) + "/libnccl-net-" + stem + ".so";
}

}  // namespace tcpx::testing
