// Small fake sysfs trees shaped like the machines we target, built at run time in a directory of
// the test's own (so no symlinks are committed), for code that reads sysfs under a root
// (TCPX_P2P_SYSFS_ROOT, common/topology.h).
//
// The layout is sysfs's: PCI devices are directories under devices/pci<domain>:<bus>/... down
// their bridges, with vendor, class and numa_node files; bus/pci/devices/<address> links to
// them; an interface is devices/<its PCI device>/net/<name> (or devices/virtual/net/<name>)
// with speed, mtu and operstate, its `device` a link to the PCI device, linked from
// class/net/<name>.
#pragma once

#include <memory>
#include <string>

namespace tcpx::testing {

class SysfsTree {
 public:
    SysfsTree();
    ~SysfsTree();
    SysfsTree(const SysfsTree&) = delete;
    SysfsTree& operator=(const SysfsTree&) = delete;

    const std::string& root() const { return root_; }

    // A GPU (NVIDIA, 3D controller) at `chain`, e.g. "pci0000:10/0000:10:01.0/0000:13:00.0";
    // numa_node -2 leaves the file out.
    void add_gpu(const std::string& chain, int numa_node);
    // A NIC `name` at `chain` (a Google gVNIC), up.
    void add_nic(const std::string& name, const std::string& chain, int numa_node,
                 int speed_mbps = 200000, int mtu = 8244);
    // An interface with no PCI device (lo, a veth).
    void add_virtual_nic(const std::string& name);
    // Writes `text` to the file at `relative` (under the root), making its directories.
    void write(const std::string& relative, const std::string& text);
    // Makes `relative` a symbolic link to `target` (replacing what is there).
    void link(const std::string& target, const std::string& relative);
    void remove(const std::string& relative);

    // A3-high (a3-highgpu-8g): 8 GPUs and 4 data NICs (eth1-eth4) on 4 PCIe switches, two GPUs
    // and one NIC each; switches 0-1 under root complex pci0000:10 on NUMA node 0, 2-3 under
    // pci0000:90 on node 1; eth0, the management NIC, alone on pci0000:00 (node 0); lo.
    //   GPU 0 0000:13:00.0, GPU 1 0000:14:00.0, eth1 0000:15:00.0   (switch 0)
    //   GPU 2 0000:23:00.0, GPU 3 0000:24:00.0, eth2 0000:25:00.0   (switch 1)
    //   GPU 4 0000:93:00.0, GPU 5 0000:94:00.0, eth3 0000:95:00.0   (switch 2)
    //   GPU 6 0000:a3:00.0, GPU 7 0000:a4:00.0, eth4 0000:a5:00.0   (switch 3)
    static std::unique_ptr<SysfsTree> a3_high();
    // A flat VM: `gpus` GPUs (0000:00:04.0, 0000:00:05.0, ...) then `nics` NICs eth0, eth1, ...
    // all directly on root complex pci0000:00, NUMA node 0; lo.
    static std::unique_ptr<SysfsTree> flat(int gpus = 2, int nics = 2);

 private:
    void add_pci(const std::string& chain, const std::string& vendor, const std::string& cls,
                 int numa_node);
    std::string root_;
};

}  // namespace tcpx::testing
