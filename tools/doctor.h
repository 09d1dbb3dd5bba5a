// `tcpx-p2p doctor`: what this machine offers a tcpx-p2p endpoint and what would stop one, as a
// table or JSON: kernel and devmem TCP, limits, NICs and GPUs on the PCI tree (sysfs under
// TCPX_P2P_SYSFS_ROOT), the GPU-to-NIC map in use (docs/topology.md), the plugin and its probe,
// RxDM's socket, the variables Google's plugin reads and what they resolve to. Every problem
// comes with its one-line fix; the exit code is 1 when something would stop a run (an invalid
// setting, no usable interface, a plugin that does not load, Google's plugin without its
// receive-datapath manager, a map naming an interface this host lacks), else 0. --json adds
// "kernel", "topology" (nics, gpus, gpu_nic_map) and "rxdm_socket" beside "checks".
#pragma once

namespace tcpx::tools {

struct DoctorOptions {
    bool json = false;
};

int run_doctor(const DoctorOptions& options);

}  // namespace tcpx::tools
