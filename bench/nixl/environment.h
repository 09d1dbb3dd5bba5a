// The environment tcpx-nixl-bench runs in, set before any agent exists (NIXL's plugin directory,
// UCX over TCP) and read back for the report, with the machine it runs on.
#pragma once

#include <string>

namespace tcpx::bench::nixl_bench {

struct Machine {
    long cores = 0;
    std::string cpu;
    std::string kernel;
    std::string ucx_tls;
    bool ucx_tls_set_here = false;
    std::string ucx_net_devices;
    std::string plugin_dir;
    // With --connect: where the target runs, as it described itself ("ADDR: ...").
    std::string target;
};

// This host as the other end's header shows it: its environment and machine, on one line.
std::string describe(const Machine& m);

// Sets what both processes need before any agent exists: UCX over TCP unless the user chose its
// transports (UCX_TLS), and this build's plugin directory unless NIXL_PLUGIN_DIR is set; the
// latter may start the program again (`argv`) with NIXL's library directory on
// LD_LIBRARY_PATH. Returns the machine and what was set; unless `quiet`, says on stderr which
// UCX transports run.
Machine prepare_environment(char** argv, bool quiet);

}  // namespace tcpx::bench::nixl_bench
