// The GPU-to-NIC choice (common/topology.h) applied to a transport: which interfaces the socket
// transport of an endpoint serving a GPU uses, which device of an external plugin it uses. Both
// log the choice (INFO), e.g. "GPU 3 (0000:86:00.0) -> eth2 (0000:85:00.0), same PCIe switch".
#pragma once

#include <string>

#include "common/params.h"
#include "net/net.h"
#include "tcpx/status.h"

namespace tcpx::net {

// The SOCKET_IFNAME for the socket transport of an endpoint serving GPU `gpu` (PCI bus id
// `gpu_pci`, empty if unknown): "=eth2" (or "=eth1,eth2") naming the GPU's NICs, or empty to
// keep s.socket_ifname: it is set (it wins), or nothing is known of this GPU's NICs, or the NICs
// sysfs names are not usable (no address, down; logged). Error: the map names interfaces that
// are not usable.
StatusOr<std::string> socket_ifname_for_gpu(const Settings& s, int gpu, const std::string& gpu_pci);

// The device of `net` (an external plugin) that an endpoint serving GPU `gpu` uses: the one its
// NIC map entry names, else the closest to the GPU by its pciPath; 0 when nothing is known.
// Error: the map names no device of `net` for this GPU.
StatusOr<int> net_device_for_gpu(const Net& net, const Settings& s, int gpu,
                                 const std::string& gpu_pci);

}  // namespace tcpx::net
