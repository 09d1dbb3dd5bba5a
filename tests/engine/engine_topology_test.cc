// An endpoint serving a GPU uses the NIC closest to it (net/nic_select.h, common/topology.h):
// with the device emulation giving the GPUs PCI bus ids and a fake sysfs tree in which the
// loopback interface sits on the GPU's PCIe switch, the socket transport (and the control
// listener) land on lo; the static map, SOCKET_IFNAME and a plugin's devices likewise.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <memory>
#include <string>

#include "net/plugin/plugin_loader.h"
#include "tests/support/engine_test_util.h"
#include "tests/support/host_device.h"
#include "tests/support/log_capture.h"
#include "tests/support/sysfs_tree.h"

namespace tcpx::testing {
namespace {

constexpr const char* kSwitch = "pci0000:10/0000:10:01.0/0000:11:00.0/0000:12:0";

class EngineTopology : public ::testing::Test {
 protected:
    void SetUp() override {
        emu_ = std::make_unique<ScopedHostDevice>(2);
        (*emu_)->set_pci_bus_ids({"0000:13:00.0", "0000:14:00.0"});
        // GPUs 0 and 1 on one switch with lo; another NIC on another root complex.
        tree_.add_gpu(std::string(kSwitch) + "0.0/0000:13:00.0", 0);
        tree_.add_gpu(std::string(kSwitch) + "1.0/0000:14:00.0", 0);
        tree_.add_nic("lo", std::string(kSwitch) + "2.0/0000:15:00.0", 0);
        tree_.add_nic("eth7", "pci0000:90/0000:90:01.0/0000:95:00.0", 1);
        ::setenv("FAKETCPX_MEMORY", "host", 1);
    }
    void TearDown() override { emu_.reset(); }

    Config config(int gpu) const {
        Config c = engine_test_config();
        c.socket_ifname.clear();
        c.sysfs_root = tree_.root();
        c.gpu_index = gpu;
        return c;
    }

    std::unique_ptr<ScopedHostDevice> emu_;
    SysfsTree tree_;
};

TEST_F(EngineTopology, SocketTransportUsesTheGpusClosestNic) {
    LogCapture log;
    auto a = make_endpoint("alpha", config(1));
    auto b = make_endpoint("beta", config(0));
    ASSERT_TRUE(a && b) << log.all();
    EXPECT_TRUE(log.contains("GPU 1 (0000:14:00.0) -> lo (0000:15:00.0), same PCIe switch"))
        << log.all();
    EXPECT_TRUE(log.contains("GPU 0 (0000:13:00.0) -> lo (0000:15:00.0), same PCIe switch"))
        << log.all();
    EXPECT_EQ(Endpoint::parse_metadata(a->metadata())->host, "127.0.0.1");
    const Link l = link(a.get(), b.get());
    EXPECT_NE(l.a_to_b, 0u);
}

TEST_F(EngineTopology, TheMapWinsOverSysfsAndSocketIfnameOverBoth) {
    {
        LogCapture log;
        Config c = config(0);
        c.sysfs_root = tree_.root() + "/nonexistent";
        c.gpu_nic_map = "0:lo,1:eth7";
        auto e = make_endpoint("mapped", c);
        ASSERT_NE(e, nullptr) << log.all();
        EXPECT_TRUE(log.contains("GPU 0 (0000:13:00.0) -> lo, from TCPX_P2P_GPU_NIC_MAP"))
            << log.all();
        EXPECT_EQ(Endpoint::parse_metadata(e->metadata())->host, "127.0.0.1");
    }
    {  // A map naming an interface this host lacks stops the endpoint, saying why.
        Config c = config(0);
        c.gpu_nic_map = "0:nosuchif0";
        auto e = Endpoint::create(c, "bad");
        ASSERT_FALSE(e.ok());
        EXPECT_NE(e.status().to_string().find("TCPX_P2P_GPU_NIC_MAP: GPU 0 (0000:13:00.0) -> "
                                              "nosuchif0"),
                  std::string::npos)
            << e.status().to_string();
    }
    {  // An explicit SOCKET_IFNAME wins.
        LogCapture log;
        Config c = config(0);
        c.gpu_nic_map = "0:nosuchif0";
        c.socket_ifname = "=lo";
        auto e = make_endpoint("explicit", c);
        ASSERT_NE(e, nullptr) << log.all();
        EXPECT_TRUE(log.contains("TCPX_P2P_SOCKET_IFNAME==lo is set")) << log.all();
    }
}

// A NIC that sysfs puts next to the GPU but that is not usable here (no such interface, no
// address) is logged and the endpoint goes on with the interfaces SOCKET_IFNAME selects.
TEST_F(EngineTopology, AnUnusableClosestNicFallsBackToTheDefault) {
    tree_.remove("class/net/lo");
    tree_.add_nic("nosuchif0", std::string(kSwitch) + "3.0/0000:16:00.0", 0);
    LogCapture log;
    auto e = make_endpoint("fallback", config(0));
    ASSERT_NE(e, nullptr) << log.all();
    EXPECT_TRUE(log.contains("-> nosuchif0 (0000:16:00.0), same PCIe switch, but")) << log.all();
    // A GPU sysfs does not know: nothing chosen, nothing refused.
    (*emu_)->set_pci_bus_ids({});
    auto f = make_endpoint("unknown", config(1));
    ASSERT_NE(f, nullptr) << log.all();
    EXPECT_TRUE(log.contains("GPU 1 -> no NIC known")) << log.all();
}

// A plugin's device is chosen by the map (or by pciPath, which the emulated plugin leaves out:
// then device 0).
TEST_F(EngineTopology, PluginDeviceFromTheMap) {
    Config c = config(0);
    c.net_plugin = TCPX_FAKE_TCPX_PATH;
    auto net = net::load_net_plugin(c.net_plugin, c);
    ASSERT_TRUE(net.ok()) << net.status().to_string();
    const int last = (*net)->device_count() - 1;
    net::Properties props;
    ASSERT_TRUE((*net)->get_properties(last, &props).ok());
    net->reset();
    {
        LogCapture log;
        auto e = make_endpoint("pathless", c);
        ASSERT_NE(e, nullptr) << log.all();
        EXPECT_TRUE(
            log.contains("GPU 0 (0000:13:00.0) -> no NIC known: GPUDirectTCPX_v7_emulated "
                         "device 0"))
            << log.all();
    }
    {
        LogCapture log;
        c.gpu_nic_map = "0:nosuchif0+" + props.name;
        auto e = make_endpoint("mapped", c);
        ASSERT_NE(e, nullptr) << log.all();
        EXPECT_TRUE(log.contains(props.name +
                                 ", from TCPX_P2P_GPU_NIC_MAP: "
                                 "GPUDirectTCPX_v7_emulated device " +
                                 std::to_string(last)))
            << log.all();
    }
    c.gpu_nic_map = "0:nosuchif0";
    auto bad = Endpoint::create(c, "bad");
    ASSERT_FALSE(bad.ok());
    EXPECT_NE(bad.status().to_string().find("names no device of this transport for GPU 0"),
              std::string::npos)
        << bad.status().to_string();
}

}  // namespace
}  // namespace tcpx::testing
