#include "net/nic_select.h"

#include <vector>

#include "common/log.h"
#include "common/socket.h"
#include "common/status_util.h"
#include "common/strings.h"
#include "common/topology.h"

namespace tcpx::net {

StatusOr<std::string> socket_ifname_for_gpu(const Settings& s, int gpu,
                                            const std::string& gpu_pci) {
    if (!s.socket_ifname.empty()) {
        TCPX_INFO("GPU %d: TCPX_P2P_SOCKET_IFNAME=%s is set, so it chooses the interfaces", gpu,
                  s.socket_ifname.c_str());
        return std::string();
    }
    const topo::Topology t = topo::read_topology(s.sysfs_root);
    TCPX_ASSIGN_OR_RETURN(topo::NicChoice c, topo::nics_for_gpu(t, s.gpu_nic_map, gpu, gpu_pci));
    const std::string what = topo::describe(c);
    if (c.nics.empty()) {
        TCPX_INFO("%s: interfaces as TCPX_P2P_SOCKET_IFNAME selects when empty", what.c_str());
        return std::string();
    }
    std::string spec = "=";
    for (const topo::Nic& n : c.nics) spec += (spec.size() == 1 ? "" : ",") + n.name;
    AddressFamily family = AddressFamily::kAny;
    parse_address_family(s.socket_family, &family);
    auto usable = find_interfaces(spec, family);
    if (!usable.ok()) {
        if (c.from_map) {
            return failed_precondition(strformat("TCPX_P2P_GPU_NIC_MAP: %s: %s", what.c_str(),
                                                 usable.status().to_string().c_str()));
        }
        TCPX_WARN("%s, but %s: interfaces as TCPX_P2P_SOCKET_IFNAME selects when empty",
                  what.c_str(), usable.status().to_string().c_str());
        return std::string();
    }
    TCPX_INFO("%s", what.c_str());
    return spec;
}

StatusOr<int> net_device_for_gpu(const Net& net, const Settings& s, int gpu,
                                 const std::string& gpu_pci) {
    std::vector<topo::NetDevice> devices;
    for (int d = 0; d < net.device_count(); ++d) {
        Properties p;
        TCPX_RETURN_IF_ERROR(net.get_properties(d, &p));
        devices.push_back(topo::NetDevice{p.name, p.pci_path});
    }
    const topo::Topology t = topo::read_topology(s.sysfs_root);
    TCPX_ASSIGN_OR_RETURN(topo::DeviceChoice c,
                          topo::device_for_gpu(t, devices, s.gpu_nic_map, gpu, gpu_pci));
    const std::string what = topo::describe(c.choice);
    if (c.dev < 0) {
        TCPX_INFO("%s: %s device 0", what.c_str(), std::string(net.name()).c_str());
        return 0;
    }
    TCPX_INFO("%s: %s device %d", what.c_str(), std::string(net.name()).c_str(), c.dev);
    return c.dev;
}

}  // namespace tcpx::net
