// tcpx-p2p-probe PLUGIN: loads an ncclNet plugin as the loader would, calls its init (with a
// logger that writes to stderr), devices and getProperties, prints a summary and exits 0. Run by
// the loader in a child process before it loads the plugin itself (plugin_probe.h), so that a
// plugin that exits, crashes or hangs there takes only this process down. Exit status: 0 sound;
// kProbeCleanRefusal (3) the plugin refused with an error (loading it in-process reports the
// same error safely); 2 usage; anything else, or a signal, is the plugin's doing.
#include <dlfcn.h>
#include <link.h>

#include <cstdio>
#include <string>

#include "common/log.h"
#include "common/params.h"
#include "net/plugin/log_limiter.h"
#include "net/plugin/nccl_net_table.h"
#include "net/plugin/plugin_loader.h"
#include "net/plugin/plugin_probe.h"
#include "net/v7_common.h"

namespace {

using namespace tcpx;

int refuse(const std::string& why) {
    std::fprintf(stderr, "tcpx-p2p-probe: %s\n", why.c_str());
    return net::kProbeCleanRefusal;
}

int run(const std::string& path) {
    auto settings = Settings::from_env();
    if (!settings.ok()) return refuse(settings.status().to_string());
    // The plugin's own lines at INFO (our debug) too: when it dies, the loader shows the last
    // ones, and those say what it was doing. Its data-path floods are limited as in-process.
    LogLevel level = LogLevel::kDebug;
    parse_log_level(settings->log_level, &level);
    set_log_level(std::min(level, LogLevel::kDebug));
    net::plugin_log_limiter().configure(settings->plugin_log_burst,
                                        settings->plugin_log_interval_ms);

    void* lib = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) {
        const char* err = ::dlerror();
        return refuse("cannot load " + path + ": " + (err != nullptr ? err : "unknown error"));
    }
    auto table = net::find_net_table(lib, path);
    if (!table.ok()) return refuse(table.status().to_string());
    net::NcclNetTable* t = *table;
    const std::string name = t->name() != nullptr ? t->name() : "(unnamed)";
    if (const char* missing = t->missing_function(); missing != nullptr) {
        return refuse("table " + name + " lacks " + missing);
    }
    net::apply_tcpx_env_defaults(*t);
    Status st = net::from_nccl_result(t->init(net::nccl_logger_into_tcpx_log()), name + ": init");
    if (!st.ok()) return refuse(st.to_string());
    int ndev = 0;
    st = net::from_nccl_result(t->devices(&ndev), name + ": devices");
    if (!st.ok()) return refuse(st.to_string());
    std::printf("plugin %s: table %s, ncclNet v%d, %d devices\n", path.c_str(), name.c_str(),
                t->version(), ndev);
    // Where the dynamic loader found it: a bare file name is searched for (LD_LIBRARY_PATH, the
    // ld.so cache, the system directories), and the doctor shows which file that was.
    link_map* map = nullptr;
    if (::dlinfo(lib, RTLD_DI_LINKMAP, &map) == 0 && map != nullptr && map->l_name != nullptr &&
        map->l_name[0] != '\0') {
        std::printf("  file: %s\n", map->l_name);
    }
    for (int dev = 0; dev < ndev; ++dev) {
        tcpx_ncclNetProperties_v7_t p{};
        st = net::from_nccl_result(t->get_properties(dev, &p), name + ": getProperties");
        if (!st.ok()) return refuse(st.to_string());
        std::printf(
            "  dev %d: %s, pci %s, speed %d Mb/s, ptrSupport 0x%x, maxComms %d, "
            "maxRecvs %d, device type %d v%d\n",
            dev, p.name != nullptr ? p.name : "(null)", p.pciPath != nullptr ? p.pciPath : "(null)",
            p.speed, p.ptrSupport, p.maxComms, p.maxRecvs, p.netDeviceType, p.netDeviceVersion);
    }
    std::fflush(stdout);
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    if (argc != 2) {
        std::fprintf(stderr, "usage: tcpx-p2p-probe PLUGIN.so\n");
        return 2;
    }
    // Plugins start threads and register atexit handlers that may hang or crash at exit; the
    // verdict is in once the summary is out.
    const int rc = run(argv[1]);
    std::fflush(stdout);
    std::fprintf(stderr, "%s\n", tcpx::net::kProbeDoneMarker);  // (the loader looks for it)
    std::fflush(stderr);
    std::_Exit(rc);
}
