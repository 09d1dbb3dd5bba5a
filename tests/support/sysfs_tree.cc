#include "tests/support/sysfs_tree.h"

#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <stdexcept>

#include "common/strings.h"

namespace tcpx::testing {
namespace {

namespace fs = std::filesystem;

std::string last_component(const std::string& chain) { return chain.substr(chain.rfind('/') + 1); }

// "../../" repeated: from a directory `depth` levels below the root, back to it.
std::string up(int depth) {
    std::string s;
    for (int i = 0; i < depth; ++i) s += "../";
    return s;
}

}  // namespace

SysfsTree::SysfsTree() {
    std::string dir = (fs::temp_directory_path() / "tcpx-sysfs-XXXXXX").string();
    if (::mkdtemp(dir.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
    root_ = dir;
    fs::create_directories(fs::path(root_) / "class" / "net");
    fs::create_directories(fs::path(root_) / "bus" / "pci" / "devices");
    fs::create_directories(fs::path(root_) / "devices" / "virtual" / "net");
}

SysfsTree::~SysfsTree() {
    std::error_code ec;
    fs::remove_all(root_, ec);
}

void SysfsTree::write(const std::string& relative, const std::string& text) {
    const fs::path p = fs::path(root_) / relative;
    fs::create_directories(p.parent_path());
    std::ofstream(p) << text;
}

void SysfsTree::link(const std::string& target, const std::string& relative) {
    const fs::path p = fs::path(root_) / relative;
    fs::create_directories(p.parent_path());
    std::error_code ec;
    fs::remove(p, ec);
    fs::create_symlink(target, p);
}

void SysfsTree::remove(const std::string& relative) {
    std::error_code ec;
    fs::remove_all(fs::path(root_) / relative, ec);
}

void SysfsTree::add_pci(const std::string& chain, const std::string& vendor, const std::string& cls,
                        int numa_node) {
    const std::string dir = "devices/" + chain;
    write(dir + "/vendor", vendor + "\n");
    write(dir + "/class", cls + "\n");
    if (numa_node >= -1) write(dir + "/numa_node", std::to_string(numa_node) + "\n");
    // bus/pci/devices/<address> -> ../../../devices/<chain>
    link("../../../" + dir, "bus/pci/devices/" + last_component(chain));
}

void SysfsTree::add_gpu(const std::string& chain, int numa_node) {
    add_pci(chain, "0x10de", "0x030200", numa_node);
}

void SysfsTree::add_nic(const std::string& name, const std::string& chain, int numa_node,
                        int speed_mbps, int mtu) {
    add_pci(chain, "0x1ae0", "0x020000", numa_node);
    const std::string dir = "devices/" + chain + "/net/" + name;
    write(dir + "/speed", std::to_string(speed_mbps) + "\n");
    write(dir + "/mtu", std::to_string(mtu) + "\n");
    write(dir + "/operstate", "up\n");
    link("../../", dir + "/device");
    link(up(2) + dir, "class/net/" + name);
}

void SysfsTree::add_virtual_nic(const std::string& name) {
    const std::string dir = "devices/virtual/net/" + name;
    write(dir + "/speed", "-1\n");  // what reading lo's speed amounts to
    write(dir + "/mtu", "65536\n");
    write(dir + "/operstate", "unknown\n");
    link(up(2) + dir, "class/net/" + name);
}

std::unique_ptr<SysfsTree> SysfsTree::a3_high() {
    auto t = std::make_unique<SysfsTree>();
    t->add_nic("eth0", "pci0000:00/0000:00:04.0", 0, 100000, 1460);
    t->add_virtual_nic("lo");
    struct Switch {
        const char* root_port;  // under its root complex
        int bus;                // the switch's upstream bus; downstream ports on bus + 1
        int numa;
    };
    const Switch switches[] = {{"pci0000:10/0000:10:01.0", 0x11, 0},
                               {"pci0000:10/0000:10:02.0", 0x21, 0},
                               {"pci0000:90/0000:90:01.0", 0x91, 1},
                               {"pci0000:90/0000:90:02.0", 0xa1, 1}};
    for (int s = 0; s < 4; ++s) {
        const Switch& sw = switches[s];
        const std::string up_port = strformat("%s/0000:%02x:00.0", sw.root_port, sw.bus);
        auto below = [&](int port, int bus) {
            return strformat("%s/0000:%02x:%02x.0/0000:%02x:00.0", up_port.c_str(), sw.bus + 1,
                             port, bus);
        };
        t->add_gpu(below(0, sw.bus + 2), sw.numa);
        t->add_gpu(below(1, sw.bus + 3), sw.numa);
        t->add_nic(strformat("eth%d", s + 1), below(2, sw.bus + 4), sw.numa);
    }
    return t;
}

std::unique_ptr<SysfsTree> SysfsTree::flat(int gpus, int nics) {
    auto t = std::make_unique<SysfsTree>();
    t->add_virtual_nic("lo");
    int slot = 4;
    for (int g = 0; g < gpus; ++g) t->add_gpu(strformat("pci0000:00/0000:00:%02x.0", slot++), 0);
    for (int n = 0; n < nics; ++n) {
        t->add_nic(strformat("eth%d", n), strformat("pci0000:00/0000:00:%02x.0", slot++), 0);
    }
    return t;
}

}  // namespace tcpx::testing
