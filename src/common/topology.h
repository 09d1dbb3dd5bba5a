// Which NIC(s) each GPU should use: the machine's PCI topology read from sysfs, or a static map.
//
// sysfs is read under a root directory (TCPX_P2P_SYSFS_ROOT, "/sys" unless tests point it at a
// fixture tree). A NIC is an entry of <root>/class/net whose `device` link resolves to a PCI
// device; a GPU is a PCI device of <root>/bus/pci/devices with vendor 0x10de (NVIDIA) and class
// 0x0302xx (3D controller) or 0x0300xx (VGA). Both are placed by their PCI path: the chain of
// directories from the root complex ("pci0000:80") down to the device, as the symlinks resolve
// under <root>/devices.
//
// A GPU's distance to a NIC is the closest of: the same PCIe switch (their paths share a bridge
// below the root complex: a switch, or the root port itself), the same root complex, the same
// NUMA node, anything else. Each GPU gets the NICs at its smallest distance; where several GPUs
// share the same closest NICs they are spread over them evenly (GPUs in PCI order, each to the
// least used of its closest NICs), and a closest NIC that no GPU took goes to the GPU of those
// it is closest to that has the fewest. On A3-high this gives two GPUs per NIC: {0,1} -> eth1,
// {2,3} -> eth2, {4,5} -> eth3, {6,7} -> eth4.
//
// The static map (TCPX_P2P_GPU_NIC_MAP) overrides sysfs for the GPUs it names:
// "0:eth1,1:eth1,2:eth2" names GPUs by index (the CUDA device ordinal, as TCPX_P2P_GPU_INDEX) or
// by PCI bus id ("0000:86:00.0:eth2"), each followed by one or more interface names joined by '+'
// ("0:eth1+eth2"), best first.
#pragma once

#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "tcpx/status.h"

namespace tcpx::topo {

// How far apart two PCI devices are; smaller is closer.
enum class Distance : int { kPciSwitch = 0, kRootComplex = 1, kNumaNode = 2, kSystem = 3 };

// "same PCIe switch", "same root complex", "same NUMA node", "different NUMA nodes".
const char* distance_name(Distance d);

struct Nic {
    std::string name;         // "eth1"
    std::string pci_address;  // "0000:85:00.0"; empty: not a PCI device (lo, veth, a bridge)
    std::string pci_path;     // the resolved sysfs path of that PCI device; empty as above
    int numa_node = -1;       // -1: unknown
    int speed_mbps = -1;      // -1: unknown (a link that is down reads as such)
    int mtu = -1;
    std::string operstate;  // "up", "down", "unknown", ... (empty when unreadable)
};

struct Gpu {
    std::string pci_address;  // "0000:86:00.0"
    std::string pci_path;
    int numa_node = -1;
};

struct Topology {
    std::vector<Nic> nics;  // every interface of <root>/class/net, by name (eth2 before eth10)
    std::vector<Gpu> gpus;  // NVIDIA GPUs, in PCI address order
};

// Reads the NICs and GPUs under `sysfs_root`. Never fails: what cannot be read (a missing file,
// a dangling link, a garbled value) is left unknown.
Topology read_topology(const std::string& sysfs_root);
// One interface of <root>/class/net, read as read_topology reads each (unknown where unreadable).
Nic read_nic(const std::string& sysfs_root, const std::string& name);

// The PCI bus id in the form sysfs names devices ("0000:86:00.0", lower case): accepts a domain
// of any length ("00000000:86:00.0" from nvidia-smi) or none ("86:00.0"). Empty if not one.
std::string normalize_pci_address(std::string_view text);

// The distance between two PCI devices given their sysfs paths (any root) and NUMA nodes.
Distance pci_distance(std::string_view path_a, int numa_a, std::string_view path_b, int numa_b);

// One entry of the static map.
struct MapEntry {
    int gpu = -1;         // by index, or -1 when named by PCI bus id
    std::string gpu_pci;  // by PCI bus id (normalized), or empty
    std::vector<std::string> nics;
};

// Parses TCPX_P2P_GPU_NIC_MAP; errors name the parameter and the entry. Empty text: no entries.
StatusOr<std::vector<MapEntry>> parse_gpu_nic_map(std::string_view text);

// The NICs chosen for one GPU.
struct NicChoice {
    int gpu = -1;           // the GPU's index (-1: unknown)
    std::string gpu_pci;    // its PCI bus id (empty: unknown)
    std::vector<Nic> nics;  // best first; empty: nothing known about this GPU's NICs
    Distance distance = Distance::kSystem;  // from sysfs: of every NIC chosen
    bool from_map = false;                  // named by TCPX_P2P_GPU_NIC_MAP
};

// "GPU 3 (0000:86:00.0) -> eth2 (0000:85:00.0), same PCIe switch", or "... -> eth2 (map)".
std::string describe(const NicChoice& c);

// Every GPU of `gpus` (PCI paths and NUMA nodes; index = position) given NICs from `nics`, by
// distance and balance as above. Only NICs with a PCI path whose operstate is not "down" are
// candidates. A GPU without a PCI path, or with no candidate, gets none.
std::vector<NicChoice> assign_nics(std::span<const Gpu> gpus, std::span<const Nic> nics);

// The NICs of GPU `gpu` at PCI bus id `gpu_pci` (either may be unknown: -1, empty): the map's
// entry that names it (by index or bus id), else its share of `t.nics` among all of `t.gpus`
// (found by bus id). Empty nics when neither knows it. Error: the map does not parse.
StatusOr<NicChoice> nics_for_gpu(const Topology& t, std::string_view map, int gpu,
                                 std::string_view gpu_pci);

// A transport's device, as its properties name it.
struct NetDevice {
    std::string name;
    std::string pci_path;
};

// Which of a transport's `devices` GPU `gpu` (at `gpu_pci`) should use: the first device named
// by the map's entry for it, else the first of the devices that sysfs assigns it when the
// devices take the NICs' place (matched to `t` by PCI address for their NUMA nodes). -1 when
// nothing is known. Error: the map does not parse, or names no device the transport has.
struct DeviceChoice {
    int dev = -1;
    NicChoice choice;  // the device(s) as NICs
};
StatusOr<DeviceChoice> device_for_gpu(const Topology& t, std::span<const NetDevice> devices,
                                      std::string_view map, int gpu, std::string_view gpu_pci);

}  // namespace tcpx::topo
