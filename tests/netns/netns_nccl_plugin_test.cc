// The NCCL plugin (libnccl-net-tcpxp2p.so) between two "hosts": two network namespaces joined by
// two veth pairs, the plugin loaded in a forked child in each, as NCCL loads it (dlopen, the v11
// table). Each namespace's two links are the plugin's two NCCL devices; a comm is opened on each
// device and carries messages of mixed sizes, every byte checked, each over its own link. On
// loopback the handles' addresses and the devices' links are all 127.0.0.1 and lo: here a handle
// that named the wrong address, or a device whose traffic took another link, fails.
//
// Needs root and iproute2 (`ip netns`): elsewhere the test skips, saying why.
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "tests/support/net_test_util.h"
#include "tests/support/netns_pair.h"

namespace tcpx::testing {
namespace {

using namespace std::chrono_literals;

constexpr int kDevices = 2;
constexpr size_t kSizes[] = {1, 100, 4096, 65536 + 7, 1 << 20, (4 << 20) + 3, 0, 333333};

class NetnsNcclPlugin : public ::testing::Test {
 protected:
    void SetUp() override {
        bool skip = false;
        const std::string why = pair_.make(kDevices, &skip);
        if (!why.empty() && skip) GTEST_SKIP() << why;
        ASSERT_EQ(why, "");
    }

    // The plugin in this child, over both links of `side`, as NCCL would load it.
    std::unique_ptr<net::Net> plugin(int side) const {
        Settings s = loopback_settings();
        s.socket_ifname = "=" + pair_.link(side, 0) + "," + pair_.link(side, 1);
        s.connect_timeout_ms = 10000;
        set_socket_env(s);
        return make_net(Provider::kNcclPluginV11, s);
    }

    // Side 1: listens on every device, hands the handles over `sock`, accepts, receives and checks
    // every message. Returns "" or what went wrong.
    std::string receiver(int sock) const {
        auto net = plugin(1);
        if (net == nullptr) return "no plugin";
        if (net->device_count() != kDevices)
            return "devices: " + std::to_string(net->device_count());
        net::ListenComm* listen[kDevices] = {};
        for (int d = 0; d < kDevices; ++d) {
            net::Handle h;
            Status st = net->listen(d, &h, &listen[d]);
            if (!st.ok()) return "listen: " + st.to_string();
            send_msg(sock,
                     std::string(reinterpret_cast<const char*>(h.bytes.data()), h.bytes.size()));
        }
        for (int d = 0; d < kDevices; ++d) {
            net::RecvComm* comm = nullptr;
            const auto deadline = std::chrono::steady_clock::now() + 15s;
            while (comm == nullptr && std::chrono::steady_clock::now() < deadline) {
                Status st = net->accept(listen[d], &comm, nullptr);
                if (!st.ok()) return "accept: " + st.to_string();
            }
            if (comm == nullptr) return "accept on device " + std::to_string(d) + ": timed out";
            for (size_t i = 0; i < std::size(kSizes); ++i) {
                std::vector<uint8_t> buf(kSizes[i] + 64, 0xee);
                net::Request* r = nullptr;
                Status st =
                    post_recv(net.get(), comm, buf.data(), kSizes[i] + 64, static_cast<int>(i), &r);
                size_t got = 0;
                if (st.ok()) st = wait_request(net.get(), r, &got);
                if (!st.ok()) return "recv " + std::to_string(i) + ": " + st.to_string();
                if (got != kSizes[i])
                    return "recv " + std::to_string(i) + ": " + std::to_string(got) + " bytes";
                if (find_pattern_mismatch(buf.data(), got, d * 100 + i) != -1)
                    return "recv " + std::to_string(i) + ": corrupt";
                for (size_t k = got; k < buf.size(); ++k) {
                    if (buf[k] != 0xee)
                        return "recv " + std::to_string(i) + ": wrote past its message";
                }
            }
            if (Status st = net->close_recv(comm); !st.ok()) return "close_recv: " + st.to_string();
            if (Status st = net->close_listen(listen[d]); !st.ok())
                return "close_listen: " + st.to_string();
            send_msg(sock, "received");  // every byte of this device's comm is here
        }
        return "";
    }

    // Side 0: connects to each device's handle from its own device, sends, and checks that the
    // bytes left through that device's link.
    std::string sender(int sock) const {
        auto net = plugin(0);
        if (net == nullptr) return "no plugin";
        if (net->device_count() != kDevices)
            return "devices: " + std::to_string(net->device_count());
        for (int d = 0; d < kDevices; ++d) {
            net::Properties props;
            Status st = net->get_properties(d, &props);
            if (!st.ok() || props.name != pair_.link(0, d))
                return "device " + std::to_string(d) + " is '" + props.name + "'";
        }
        net::Handle handles[kDevices];
        for (net::Handle& h : handles) {
            std::string bytes;
            if (!recv_msg(sock, &bytes) || bytes.size() != h.bytes.size()) return "no handle";
            std::memcpy(h.bytes.data(), bytes.data(), bytes.size());
        }
        uint64_t total = 0;
        for (size_t n : kSizes) total += n;
        for (int d = 0; d < kDevices; ++d) {
            const uint64_t tx0[kDevices] = {tx_bytes(pair_.link(0, 0)), tx_bytes(pair_.link(0, 1))};
            net::SendComm* comm = nullptr;
            const auto deadline = std::chrono::steady_clock::now() + 15s;
            while (comm == nullptr && std::chrono::steady_clock::now() < deadline) {
                Status st = net->connect(d, &handles[d], &comm, nullptr);
                if (!st.ok()) return "connect: " + st.to_string();
            }
            if (comm == nullptr) return "connect on device " + std::to_string(d) + ": timed out";
            std::vector<std::vector<uint8_t>> bufs;
            std::vector<net::Request*> reqs;
            for (size_t i = 0; i < std::size(kSizes); ++i) {
                bufs.emplace_back(kSizes[i]);
                fill_pattern(bufs.back().data(), kSizes[i], d * 100 + i);
                net::Request* r = nullptr;
                Status st = post_send(net.get(), comm, bufs.back().data(), kSizes[i],
                                      static_cast<int>(i), &r);
                if (!st.ok()) return "send " + std::to_string(i) + ": " + st.to_string();
                reqs.push_back(r);
            }
            for (net::Request* r : reqs) {
                Status st = wait_request(net.get(), r);
                if (!st.ok()) return "send: " + st.to_string();
            }
            if (Status st = net->close_send(comm); !st.ok()) return "close_send: " + st.to_string();
            // A completed send has only handed its bytes to the kernel: count what left once
            // the receiver has them all.
            std::string received;
            if (!recv_msg(sock, &received)) return "no word from the receiver";
            const uint64_t out = tx_bytes(pair_.link(0, d)) - tx0[d];
            const uint64_t other = tx_bytes(pair_.link(0, 1 - d)) - tx0[1 - d];
            if (out < total || other >= total / 4) {
                return "device " + std::to_string(d) + ": " + std::to_string(out) +
                       " bytes out of its link, " + std::to_string(other) + " out of the other";
            }
        }
        return "";
    }

    // Runs `fn` in namespace `side`; what it reports comes back over `report`.
    pid_t run_in(int side, int report, const std::function<std::string()>& fn) {
        return pair_.fork_in(side, [report, fn] {
            send_msg(report, fn());
            return 0;
        });
    }

    NetnsPair pair_;
};

TEST_F(NetnsNcclPlugin, EachDeviceCarriesItsCommsOverItsOwnLink) {
    int sv[2], rep[2][2];
    ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    ASSERT_EQ(::pipe(rep[0]), 0);
    ASSERT_EQ(::pipe(rep[1]), 0);
    // Each child keeps only its own ends: one left holding the other's would never see it go,
    // and wait for ever on a sender that failed.
    const pid_t rx = run_in(1, rep[1][1], [&] {
        for (int fd : {sv[0], rep[0][0], rep[0][1], rep[1][0]}) ::close(fd);
        return receiver(sv[1]);
    });
    const pid_t tx = run_in(0, rep[0][1], [&] {
        for (int fd : {sv[1], rep[1][0], rep[1][1], rep[0][0]}) ::close(fd);
        return sender(sv[0]);
    });
    ::close(sv[0]);
    ::close(sv[1]);
    std::string report[2];
    for (int side = 0; side < 2; ++side) {
        ::close(rep[side][1]);
        if (!recv_msg(rep[side][0], &report[side])) report[side] = "no report (the child died)";
        ::close(rep[side][0]);
    }
    int st_tx = 0, st_rx = 0;
    ::waitpid(tx, &st_tx, 0);
    ::waitpid(rx, &st_rx, 0);
    EXPECT_EQ(report[0], "") << "sender";
    EXPECT_EQ(report[1], "") << "receiver";
    EXPECT_TRUE(WIFEXITED(st_tx) && WEXITSTATUS(st_tx) == 0) << st_tx;
    EXPECT_TRUE(WIFEXITED(st_rx) && WEXITSTATUS(st_rx) == 0) << st_rx;
}

}  // namespace
}  // namespace tcpx::testing
