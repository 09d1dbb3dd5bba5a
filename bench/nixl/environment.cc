#include "bench/nixl/environment.h"

#include <sys/utsname.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>

#include "bench/nixl/common.h"
#include "common/strings.h"

namespace tcpx::bench::nixl_bench {
namespace {

Machine machine_info() {
    Machine m;
    m.cores = ::sysconf(_SC_NPROCESSORS_ONLN);
    std::ifstream cpuinfo("/proc/cpuinfo");
    for (std::string line; std::getline(cpuinfo, line);) {
        if (line.rfind("model name", 0) == 0) {
            const size_t colon = line.find(':');
            if (colon != std::string::npos) m.cpu = std::string(trim(line.substr(colon + 1)));
            break;
        }
    }
    utsname u{};
    if (::uname(&u) == 0) m.kernel = std::string(u.sysname) + " " + u.release;
    return m;
}

// Without NIXL_PLUGIN_DIR set, this build's plugin directory.
void use_build_plugin_dir([[maybe_unused]] char** argv) {
#ifdef TCPX_NIXL_BENCH_PLUGIN_DIR
    if (std::getenv("NIXL_PLUGIN_DIR") != nullptr ||
        ::access(TCPX_NIXL_BENCH_PLUGIN_DIR, R_OK) != 0) {
        return;
    }
    ::setenv("NIXL_PLUGIN_DIR", TCPX_NIXL_BENCH_PLUGIN_DIR, 1);
    // That directory links NIXL's own plugins (UCX), which find their libraries through
    // $ORIGIN/..: the loader takes $ORIGIN from the path a plugin was opened by, so through a
    // link it looks beside the link. NIXL's library directory on LD_LIBRARY_PATH fixes that; the
    // loader reads it only when a program starts, hence the new start.
    const char* ld = std::getenv("LD_LIBRARY_PATH");
    const std::string path = ld != nullptr ? ld : "";
    const auto dirs = split_trimmed(path, ':');
    if (std::find(dirs.begin(), dirs.end(), TCPX_NIXL_BENCH_LIB_DIR) != dirs.end()) return;
    const std::string with =
        std::string(TCPX_NIXL_BENCH_LIB_DIR) + (path.empty() ? "" : ":" + path);
    ::setenv("LD_LIBRARY_PATH", with.c_str(), 1);
    // By its own path, not /proc/self/exe: that would rename the process "exe".
    char self[4096];
    const ssize_t n = ::readlink("/proc/self/exe", self, sizeof(self) - 1);
    if (n > 0) {
        self[n] = '\0';
        ::execv(self, argv);
    }
    std::perror("re-executing with LD_LIBRARY_PATH");  // carries on without it
#endif
}

}  // namespace

Machine prepare_environment(char** argv, bool quiet) {
    use_build_plugin_dir(argv);
    Machine machine = machine_info();
    if (const char* tls = std::getenv("UCX_TLS"); tls != nullptr) {
        machine.ucx_tls = tls;
    } else {
        ::setenv("UCX_TLS", "tcp", 1);
        machine.ucx_tls = "tcp";
        machine.ucx_tls_set_here = true;
    }
    if (const char* devs = std::getenv("UCX_NET_DEVICES"); devs != nullptr) {
        machine.ucx_net_devices = devs;
    }
    if (const char* dir = std::getenv("NIXL_PLUGIN_DIR"); dir != nullptr) machine.plugin_dir = dir;
    if (!quiet) {
        std::string devs;
        if (!machine.ucx_net_devices.empty()) devs = ", UCX_NET_DEVICES=" + machine.ucx_net_devices;
        std::fprintf(stderr, "%s: UCX_TLS=%s%s%s\n", kProgram, machine.ucx_tls.c_str(),
                     machine.ucx_tls_set_here ? " (set by this program)" : "", devs.c_str());
    }
    return machine;
}

std::string describe(const Machine& m) {
    return strformat("UCX_TLS=%s%s, NIXL_PLUGIN_DIR=%s, %ld cores, %s, %s", m.ucx_tls.c_str(),
                     m.ucx_tls_set_here ? " (set by this program)" : "",
                     m.plugin_dir.empty() ? "(unset)" : m.plugin_dir.c_str(), m.cores,
                     m.cpu.empty() ? "?" : m.cpu.c_str(), m.kernel.c_str());
}

}  // namespace tcpx::bench::nixl_bench
