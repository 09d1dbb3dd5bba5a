// The GPU-to-NIC choice (common/topology.h) on fake sysfs trees built by the test
// (tests/support/sysfs_tree.h): A3-high's shape, a flat VM, the static map, and sysfs trees with
// missing or garbled parts.
#include "common/topology.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstring>

#include <map>
#include <string>
#include <vector>

#include "common/params.h"
#include "tests/support/sysfs_tree.h"

namespace tcpx::topo {
namespace {

using testing::SysfsTree;

// GPU index -> its NIC names joined by '+'.
std::map<int, std::string> names(const std::vector<NicChoice>& choices) {
    std::map<int, std::string> out;
    for (const NicChoice& c : choices) {
        std::string s;
        for (const Nic& n : c.nics) s += (s.empty() ? "" : "+") + n.name;
        out[c.gpu] = s;
    }
    return out;
}

const Nic* find_nic(const Topology& t, const std::string& name) {
    for (const Nic& n : t.nics) {
        if (n.name == name) return &n;
    }
    return nullptr;
}

TEST(Topology, ReadsA3HighNicsAndGpus) {
    auto tree = SysfsTree::a3_high();
    const Topology t = read_topology(tree->root());
    ASSERT_EQ(t.gpus.size(), 8u);
    const char* gpu_ids[] = {"0000:13:00.0", "0000:14:00.0", "0000:23:00.0", "0000:24:00.0",
                             "0000:93:00.0", "0000:94:00.0", "0000:a3:00.0", "0000:a4:00.0"};
    for (size_t g = 0; g < 8; ++g) {
        EXPECT_EQ(t.gpus[g].pci_address, gpu_ids[g]);
        EXPECT_EQ(t.gpus[g].numa_node, g < 4 ? 0 : 1);
        EXPECT_NE(t.gpus[g].pci_path.find("/devices/pci0000:"), std::string::npos);
    }
    ASSERT_EQ(t.nics.size(), 6u);  // eth0-eth4 and lo, by name
    EXPECT_EQ(t.nics[0].name, "eth0");
    EXPECT_EQ(t.nics[5].name, "lo");
    const Nic* eth3 = find_nic(t, "eth3");
    ASSERT_NE(eth3, nullptr);
    EXPECT_EQ(eth3->pci_address, "0000:95:00.0");
    EXPECT_EQ(eth3->numa_node, 1);
    EXPECT_EQ(eth3->speed_mbps, 200000);
    EXPECT_EQ(eth3->mtu, 8244);
    EXPECT_EQ(eth3->operstate, "up");
    const Nic* lo = find_nic(t, "lo");
    ASSERT_NE(lo, nullptr);
    EXPECT_TRUE(lo->pci_address.empty());
    EXPECT_TRUE(lo->pci_path.empty());
    EXPECT_EQ(lo->speed_mbps, -1);
}

TEST(Topology, A3HighGivesTwoGpusPerNicOnTheirSwitch) {
    auto tree = SysfsTree::a3_high();
    const Topology t = read_topology(tree->root());
    const std::vector<NicChoice> all = assign_nics(t.gpus, t.nics);
    const std::map<int, std::string> want = {{0, "eth1"}, {1, "eth1"}, {2, "eth2"}, {3, "eth2"},
                                             {4, "eth3"}, {5, "eth3"}, {6, "eth4"}, {7, "eth4"}};
    EXPECT_EQ(names(all), want);
    for (const NicChoice& c : all) EXPECT_EQ(c.distance, Distance::kPciSwitch) << c.gpu;
    // One GPU by its bus id, as the engine asks (the CUDA ordinal need not be the PCI order).
    auto c = nics_for_gpu(t, "", 5, "00000000:24:00.0");
    ASSERT_TRUE(c.ok()) << c.status().to_string();
    EXPECT_EQ(describe(*c), "GPU 5 (0000:24:00.0) -> eth2 (0000:25:00.0), same PCIe switch");
    EXPECT_FALSE(c->from_map);
}

TEST(Topology, FlatTreeSpreadsGpusOverNicsEvenly) {
    {
        auto tree = SysfsTree::flat(2, 2);
        const Topology t = read_topology(tree->root());
        const std::vector<NicChoice> all = assign_nics(t.gpus, t.nics);
        EXPECT_EQ(names(all), (std::map<int, std::string>{{0, "eth0"}, {1, "eth1"}}));
        for (const NicChoice& c : all) EXPECT_EQ(c.distance, Distance::kRootComplex);
    }
    {  // More GPUs than NICs: each NIC serves as many.
        auto tree = SysfsTree::flat(8, 4);
        const Topology t = read_topology(tree->root());
        std::map<std::string, int> per_nic;
        for (const NicChoice& c : assign_nics(t.gpus, t.nics)) {
            ASSERT_EQ(c.nics.size(), 1u);
            ++per_nic[c.nics[0].name];
        }
        EXPECT_EQ(per_nic,
                  (std::map<std::string, int>{{"eth0", 2}, {"eth1", 2}, {"eth2", 2}, {"eth3", 2}}));
    }
    {  // More NICs than GPUs: each GPU gets as many.
        auto tree = SysfsTree::flat(2, 4);
        const Topology t = read_topology(tree->root());
        EXPECT_EQ(names(assign_nics(t.gpus, t.nics)),
                  (std::map<int, std::string>{{0, "eth0+eth2"}, {1, "eth1+eth3"}}));
    }
}

TEST(Topology, TheStaticMapOverridesSysfs) {
    auto tree = SysfsTree::a3_high();
    const Topology t = read_topology(tree->root());
    const std::string map = "0:eth4, 1:eth3+eth2 ,0000:23:00.0:eth1";
    auto c0 = nics_for_gpu(t, map, 0, "0000:13:00.0");
    ASSERT_TRUE(c0.ok()) << c0.status().to_string();
    EXPECT_TRUE(c0->from_map);
    EXPECT_EQ(describe(*c0),
              "GPU 0 (0000:13:00.0) -> eth4 (0000:a5:00.0), from TCPX_P2P_GPU_NIC_MAP");
    auto c1 = nics_for_gpu(t, map, 1, "");
    ASSERT_TRUE(c1.ok());
    ASSERT_EQ(c1->nics.size(), 2u);
    EXPECT_EQ(c1->nics[0].name, "eth3");
    EXPECT_EQ(c1->nics[1].name, "eth2");
    // By bus id, whatever the index.
    auto c2 = nics_for_gpu(t, map, 6, "0000:23:00.0");
    ASSERT_TRUE(c2.ok());
    EXPECT_TRUE(c2->from_map);
    EXPECT_EQ(c2->nics.at(0).name, "eth1");
    // A GPU the map does not name: sysfs.
    auto c7 = nics_for_gpu(t, map, 7, "0000:a4:00.0");
    ASSERT_TRUE(c7.ok());
    EXPECT_FALSE(c7->from_map);
    EXPECT_EQ(c7->nics.at(0).name, "eth4");
    // A3-high's own table, in the map's form, agrees with sysfs everywhere.
    const std::string table = "0:eth1,1:eth1,2:eth2,3:eth2,4:eth3,5:eth3,6:eth4,7:eth4";
    const std::vector<NicChoice> sysfs = assign_nics(t.gpus, t.nics);
    for (int g = 0; g < 8; ++g) {
        auto c = nics_for_gpu(t, table, g, "");
        ASSERT_TRUE(c.ok());
        EXPECT_EQ(c->nics.at(0).name, sysfs[static_cast<size_t>(g)].nics.at(0).name);
        EXPECT_EQ(c->nics.at(0).pci_address, sysfs[static_cast<size_t>(g)].nics.at(0).pci_address);
    }
    // A map may name an interface sysfs does not know (the transport decides if it is usable).
    auto odd = nics_for_gpu(t, "3:ib0", 3, "");
    ASSERT_TRUE(odd.ok());
    EXPECT_EQ(describe(*odd), "GPU 3 -> ib0, from TCPX_P2P_GPU_NIC_MAP");
}

TEST(Topology, BadMapsAreRefusedNamingTheParameterAndEntry) {
    struct Case {
        const char* map;
        const char* says;
    };
    const Case cases[] = {
        {"0-eth1", "entry 1 '0-eth1': expected GPU:NIC"},
        {"0:eth1,x:eth2", "entry 2 'x:eth2': 'x' is neither a GPU index"},
        {"-1:eth1", "GPU index -1 is outside [0, 1023]"},
        {"1024:eth1", "GPU index 1024 is outside [0, 1023]"},
        {"0:", "entry 1 '0:': empty interface name"},
        {"0:eth1+", "empty interface name"},
        {"0:eth1,,1:eth2", "entry 2 '': empty entry"},
        {"0:eth1,", "entry 2 '': empty entry"},
        {"0:eth1,0:eth2", "entry 2 '0:eth2': this GPU has an entry already"},
        {"0000:13:00.0:eth1,13:00.0:eth2", "this GPU has an entry already"},
        {"0:eth1+eth1", "'eth1' is named twice"},
        {"0:eth 1", "'eth 1' is not an interface name"},
        {"0:averyveryverylongname", "is not an interface name"},
        {"zz:13:00.0:eth1", "is neither a GPU index"},
    };
    for (const Case& c : cases) {
        SCOPED_TRACE(c.map);
        auto parsed = parse_gpu_nic_map(c.map);
        ASSERT_FALSE(parsed.ok());
        const std::string msg = parsed.status().to_string();
        EXPECT_NE(msg.find("TCPX_P2P_GPU_NIC_MAP"), std::string::npos) << msg;
        EXPECT_NE(msg.find(c.says), std::string::npos) << msg;
        // The same through the settings: the endpoint (and doctor) refuse it.
        Config config;
        ASSERT_TRUE(config.set("GPU_NIC_MAP", c.map).ok());
        const Status st = config.validate();
        EXPECT_FALSE(st.ok());
        EXPECT_NE(st.to_string().find(c.says), std::string::npos) << st.to_string();
    }
    auto ok = parse_gpu_nic_map(" 0:eth1 , 1:eth1+eth2, 0000:86:00.0:eth3 ");
    ASSERT_TRUE(ok.ok()) << ok.status().to_string();
    ASSERT_EQ(ok->size(), 3u);
    EXPECT_EQ((*ok)[1].nics, (std::vector<std::string>{"eth1", "eth2"}));
    EXPECT_EQ((*ok)[2].gpu, -1);
    EXPECT_EQ((*ok)[2].gpu_pci, "0000:86:00.0");
    EXPECT_TRUE(parse_gpu_nic_map("").ok());
}

TEST(Topology, PciAddressesAndDistances) {
    EXPECT_EQ(normalize_pci_address("0000:86:00.0"), "0000:86:00.0");
    EXPECT_EQ(normalize_pci_address("00000000:86:00.0"), "0000:86:00.0");
    EXPECT_EQ(normalize_pci_address("86:00.0"), "0000:86:00.0");
    EXPECT_EQ(normalize_pci_address("0000:A3:00.1"), "0000:a3:00.1");
    for (const char* bad : {"", "86:00", "0000:86:00.8", "0000:8:00.0", "x000:86:00.0", "eth1"}) {
        EXPECT_EQ(normalize_pci_address(bad), "") << bad;
    }
    EXPECT_EQ(pci_distance("/x/devices/pci0000:10/0000:10:01.0/0000:11:00.0/0000:13:00.0", -1,
                           "/y/devices/pci0000:10/0000:10:01.0/0000:11:00.0/0000:15:00.0", -1),
              Distance::kPciSwitch);  // any root
    EXPECT_EQ(pci_distance("/sys/devices/pci0000:10/0000:10:01.0/0000:13:00.0", 0,
                           "/sys/devices/pci0000:10/0000:10:02.0/0000:15:00.0", 0),
              Distance::kRootComplex);
    EXPECT_EQ(pci_distance("/sys/devices/pci0000:10/0000:10:01.0/0000:13:00.0", 0,
                           "/sys/devices/pci0000:20/0000:20:02.0/0000:25:00.0", 0),
              Distance::kNumaNode);
    EXPECT_EQ(pci_distance("/sys/devices/pci0000:10/0000:10:01.0/0000:13:00.0", 0,
                           "/sys/devices/pci0000:90/0000:90:02.0/0000:95:00.0", 1),
              Distance::kSystem);
    EXPECT_EQ(pci_distance("/sys/devices/pci0000:10/0000:10:01.0/0000:13:00.0", -1,
                           "/sys/devices/pci0000:90/0000:90:02.0/0000:95:00.0", -1),
              Distance::kSystem);  // unknown NUMA nodes are not the same one
    // A virtio NIC's device is below its PCI function.
    EXPECT_EQ(pci_distance("/sys/devices/pci0000:00/0000:00:04.0", 0,
                           "/sys/devices/pci0000:00/0000:00:05.0/virtio1", 0),
              Distance::kRootComplex);
}

// Missing and garbled parts: nothing crashes, what is unknown stays unknown, and the choice
// falls back to the next closest NIC or to none.
TEST(Topology, MissingOrGarbledSysfsFallsBackSanely) {
    auto tree = SysfsTree::a3_high();
    const std::string sw0 = "devices/pci0000:10/0000:10:01.0/0000:11:00.0/0000:12:0";
    tree->remove(sw0 + "0.0/0000:13:00.0/numa_node");       // GPU 0: no numa_node
    tree->write(sw0 + "1.0/0000:14:00.0/numa_node", "-1");  // GPU 1: -1
    tree->write("devices/pci0000:90/0000:90:01.0/0000:91:00.0/0000:92:02.0/0000:95:00.0/numa_node",
                "garbage\n");                                         // eth3: garbled
    tree->write("class/net/eth4/speed", "");                          // unreadable speed
    tree->link("../../devices/nowhere", "class/net/eth9");            // dangling interface
    tree->link("../../../nowhere", "devices/virtual/net/lo/device");  // dangling device link
    tree->link("../../../devices/gone", "bus/pci/devices/0000:77:00.0");
    tree->write("bus/pci/devices/0000:78:00.0/vendor", "0x10de");  // no class
    {
        const Topology t = read_topology(tree->root());
        ASSERT_EQ(t.gpus.size(), 8u);  // the dangling and the classless ones are no GPUs
        EXPECT_EQ(t.gpus[0].numa_node, -1);
        EXPECT_EQ(t.gpus[1].numa_node, -1);
        const Nic* eth3 = find_nic(t, "eth3");
        ASSERT_NE(eth3, nullptr);
        EXPECT_EQ(eth3->numa_node, -1);
        EXPECT_EQ(find_nic(t, "eth4")->speed_mbps, -1);
        const Nic* eth9 = find_nic(t, "eth9");
        ASSERT_NE(eth9, nullptr);
        EXPECT_TRUE(eth9->pci_address.empty());
        EXPECT_EQ(eth9->operstate, "");
        EXPECT_TRUE(find_nic(t, "lo")->pci_address.empty());
        // The switches still decide.
        EXPECT_EQ(names(assign_nics(t.gpus, t.nics)), (std::map<int, std::string>{{0, "eth1"},
                                                                                  {1, "eth1"},
                                                                                  {2, "eth2"},
                                                                                  {3, "eth2"},
                                                                                  {4, "eth3"},
                                                                                  {5, "eth3"},
                                                                                  {6, "eth4"},
                                                                                  {7, "eth4"}}));
    }
    // eth1 down: GPUs 0 and 1 take eth2, on their root complex.
    tree->write("class/net/eth1/operstate", "down\n");
    {
        const Topology t = read_topology(tree->root());
        const std::vector<NicChoice> all = assign_nics(t.gpus, t.nics);
        EXPECT_EQ(names(all).at(0), "eth2");
        EXPECT_EQ(names(all).at(1), "eth2");
        EXPECT_EQ(all[0].distance, Distance::kRootComplex);
    }
    // With eth3 and eth4 gone too, nothing is near GPUs 4-7: they are spread over what is left
    // (eth0, and eth2 which GPUs 0-3 use already) so that each NIC serves as many GPUs.
    tree->remove("class/net/eth3");
    tree->remove("class/net/eth4");
    {
        const Topology t = read_topology(tree->root());
        std::map<std::string, int> per_nic;
        for (const NicChoice& c : assign_nics(t.gpus, t.nics)) {
            ASSERT_FALSE(c.nics.empty()) << c.gpu;
            ++per_nic[c.nics[0].name];
        }
        EXPECT_EQ(per_nic, (std::map<std::string, int>{{"eth0", 4}, {"eth2", 4}}));
    }
    // No NIC with a PCI device at all: no GPU gets one, and a GPU sysfs does not know gets none.
    for (const char* nic : {"eth0", "eth1", "eth2"}) tree->remove(std::string("class/net/") + nic);
    const Topology t = read_topology(tree->root());
    for (const NicChoice& c : assign_nics(t.gpus, t.nics)) EXPECT_TRUE(c.nics.empty()) << c.gpu;
    auto none = nics_for_gpu(t, "", 0, "0000:13:00.0");
    ASSERT_TRUE(none.ok());
    EXPECT_TRUE(none->nics.empty());
    EXPECT_EQ(describe(*none), "GPU 0 (0000:13:00.0) -> no NIC known");
    auto unknown = nics_for_gpu(read_topology(tree->root() + "/nonexistent"), "", 2, "");
    ASSERT_TRUE(unknown.ok());
    EXPECT_TRUE(unknown->nics.empty());
}

// SYSFS_ROOT may point at any tree: an attribute that is a FIFO (whose open would block for
// ever), a link to /dev/zero (whose line never ends) or a huge file is read as garbled, at once.
TEST(Topology, AttributesThatAreNoSmallFilesAreReadAsGarbled) {
    auto tree = SysfsTree::a3_high();
    const std::string fifo = tree->root() + "/class/net/eth1/operstate";
    tree->remove("class/net/eth1/operstate");
    ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0) << std::strerror(errno);
    tree->link("/dev/zero", "class/net/eth2/speed");
    tree->write("class/net/eth3/mtu", std::string(1 << 20, '7'));
    const Topology t = read_topology(tree->root());  // (before: blocked in the FIFO's open)
    const Nic* eth1 = find_nic(t, "eth1");
    ASSERT_NE(eth1, nullptr);
    EXPECT_EQ(eth1->operstate, "");
    EXPECT_EQ(find_nic(t, "eth2")->speed_mbps, -1);
    EXPECT_EQ(find_nic(t, "eth3")->mtu, -1);
    EXPECT_EQ(find_nic(t, "eth4")->operstate, "up");  // the others as before
}

// An external plugin's devices are matched by their pciPath, whatever sysfs root the plugin read
// them from and in whatever order it lists them.
TEST(Topology, PluginDevicesAreMatchedByPciPath) {
    auto tree = SysfsTree::a3_high();
    const Topology t = read_topology(tree->root());
    const std::string sw = "/sys/devices/pci0000:";
    const std::vector<NetDevice> devices = {
        {"eth3", sw + "90/0000:90:01.0/0000:91:00.0/0000:92:02.0/0000:95:00.0"},
        {"eth1", sw + "10/0000:10:01.0/0000:11:00.0/0000:12:02.0/0000:15:00.0"},
        {"eth4", sw + "90/0000:90:02.0/0000:a1:00.0/0000:a2:02.0/0000:a5:00.0"},
        {"eth2", sw + "10/0000:10:02.0/0000:21:00.0/0000:22:02.0/0000:25:00.0"},
    };
    const int want[] = {1, 1, 3, 3, 0, 0, 2, 2};
    for (int g = 0; g < 8; ++g) {
        auto d = device_for_gpu(t, devices, "", g, t.gpus[static_cast<size_t>(g)].pci_address);
        ASSERT_TRUE(d.ok()) << d.status().to_string();
        EXPECT_EQ(d->dev, want[g]) << "GPU " << g;
        EXPECT_EQ(d->choice.distance, Distance::kPciSwitch);
    }
    // The plugin offers only eth3 and eth4: NUMA node 1's GPUs keep theirs; node 0's share them
    // (no PCI or NUMA locality left) two by two.
    const std::vector<NetDevice> two = {devices[0], devices[2]};
    std::map<int, int> per_dev;
    for (int g = 0; g < 8; ++g) {
        auto d = device_for_gpu(t, two, "", g, t.gpus[static_cast<size_t>(g)].pci_address);
        ASSERT_TRUE(d.ok());
        ++per_dev[d->dev];
    }
    EXPECT_EQ(per_dev, (std::map<int, int>{{0, 4}, {1, 4}}));
    // The map picks by name.
    auto m = device_for_gpu(t, devices, "0:eth9+eth4", 0, "0000:13:00.0");
    ASSERT_TRUE(m.ok());
    EXPECT_EQ(m->dev, 2);
    EXPECT_TRUE(m->choice.from_map);
    auto bad = device_for_gpu(t, devices, "0:eth9", 0, "0000:13:00.0");
    ASSERT_FALSE(bad.ok());
    EXPECT_NE(bad.status().to_string().find("TCPX_P2P_GPU_NIC_MAP names no device of this "
                                            "transport for GPU 0 (its devices: eth3, eth1, eth4, "
                                            "eth2)"),
              std::string::npos)
        << bad.status().to_string();
    // Devices without a pciPath (the emulated plugin's), or a GPU sysfs does not know: none.
    const std::vector<NetDevice> pathless = {{"eth1", ""}, {"eth2", ""}};
    auto p = device_for_gpu(t, pathless, "", 0, "0000:13:00.0");
    ASSERT_TRUE(p.ok());
    EXPECT_EQ(p->dev, -1);
    auto u = device_for_gpu(t, devices, "", 0, "0000:55:00.0");
    ASSERT_TRUE(u.ok());
    EXPECT_EQ(u->dev, -1);
}

}  // namespace
}  // namespace tcpx::topo
