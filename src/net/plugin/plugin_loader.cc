#include "net/plugin/plugin_loader.h"

#include <dlfcn.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/stat.h>

#include <cstring>
#include <mutex>
#include <string_view>
#include <unordered_map>

#include "common/env.h"
#include "common/log.h"
#include "common/status_util.h"
#include "common/strings.h"
#include "net/plugin/nccl_net_table.h"
#include "net/plugin/plugin_probe.h"
#include "net/plugin/v7_net.h"

namespace tcpx::net {
namespace {

// Google's plugin reads these; left unset, threads x sockets fall back to 1 x 1 and the dynamic
// chunk size to 0, with which receives never finish (shared/reference/tcpx-plugin.md). The values
// are those of Google's published A3-high configurations.
constexpr struct {
    const char* name;
    const char* value;
} kTcpxDefaults[] = {
    {"NCCL_NSOCKS_PERTHREAD", "4"},
    {"NCCL_SOCKET_NTHREADS", "1"},
    {"NCCL_DYNAMIC_CHUNK_SIZE", "524288"},
    {"NCCL_GPUDIRECTTCPX_PROGRAM_FLOW_STEERING_WAIT_MICROS", "500000"},
};

std::string table_symbol(int version) { return strformat("ncclNetPlugin_v%d", version); }

}  // namespace

bool is_google_tcpx(const char* table_name) {
    return table_name != nullptr && std::string_view(table_name).rfind("GPUDirectTCPX", 0) == 0;
}

// v7 when the plugin exports it (Google's TCPX plugin exports only v7, and a v7 table goes
// through unadapted), else the newest version the adapters understand.
StatusOr<NcclNetTable*> find_net_table(void* lib, const std::string& path) {
    if (const void* v7 = ::dlsym(lib, table_symbol(7).c_str()); v7 != nullptr) {
        return nccl_net_table(v7, 7);
    }
    for (int v = kNewestNcclNetVersion; v > kOldestNcclNetVersion; --v) {
        if (const void* table = ::dlsym(lib, table_symbol(v).c_str()); table != nullptr) {
            return nccl_net_table(table, v);
        }
    }
    // Name what it has instead; versions well past the newest are looked for, for this message.
    std::string found;
    for (int v = 1; v <= kNewestNcclNetVersion + 8; ++v) {
        if (::dlsym(lib, table_symbol(v).c_str()) != nullptr) {
            found += (found.empty() ? " " : ", ") + table_symbol(v);
        }
    }
    return unimplemented(strformat(
        "net plugin %s exports no ncclNet table tcpx-p2p can use (it takes %s to %s); it "
        "exports%s",
        path.c_str(), table_symbol(kOldestNcclNetVersion).c_str(),
        table_symbol(kNewestNcclNetVersion).c_str(), found.empty() ? " none" : found.c_str()));
}

void apply_tcpx_env_defaults(const NcclNetTable& table) {
    if (!is_google_tcpx(table.name())) return;
    for (const auto& d : kTcpxDefaults) {
        // (overwrite off: a value set meanwhile by another thread stays)
        if (!env_get(d.name).has_value() && env_set(d.name, d.value, false) == 0) {
            TCPX_INFO("net plugin %s: %s unset, using %s", table.name(), d.name, d.value);
        }
    }
}

Status check_rxdm_running(const char* table_name, const char* unix_client_prefix) {
    if (table_name == nullptr || std::string_view(table_name) != "GPUDirectTCPX_v7") {
        return Status();
    }
    const std::string prefix = unix_client_prefix != nullptr && unix_client_prefix[0] != '\0'
                                   ? unix_client_prefix
                                   : "/tmp";
    const std::string path = prefix + "/rx_rule_manager";
    struct stat st {};
    const bool exists = ::stat(path.c_str(), &st) == 0;
    if (exists && S_ISSOCK(st.st_mode)) return Status();
    return failed_precondition(strformat(
        "net plugin %s: the receive-datapath manager (RxDM) is not running: %s %s. The plugin "
        "imports its receive buffers from it and exits the process in accept() without it. Start "
        "Google's RxDM (the tcpgpudmarxd container, with --uds_path %s) on this host first, or, "
        "if it serves its sockets in another directory, set NCCL_GPUDIRECTTCPX_UNIX_CLIENT_PREFIX "
        "to that directory (docs/plugins.md)",
        table_name, path.c_str(), exists ? "is not a UNIX socket" : "does not exist",
        prefix.c_str()));
}

namespace {

// Plugins loaded so far, by path: a second endpoint reuses the handle (and the plugin's one-time
// init), and nothing is ever dlclose()d.
std::mutex g_mu;
std::unordered_map<std::string, void*>& loaded() {
    static auto* m = new std::unordered_map<std::string, void*>;
    return *m;
}

// A plugin's own sockets: Google's TCPX plugin sends without MSG_NOSIGNAL (its connection
// setup and its data path alike), so a send on a connection the peer has reset (a peer that
// crashed mid-transfer, or a stranger that connects to its listener and goes) raises SIGPIPE,
// whose default action ends the process. Where the process still has that default, it is set
// to ignore the signal (the send then fails with EPIPE, which the plugin reports as an error);
// a handler or disposition the application chose is left alone. CPython ignores SIGPIPE itself.
void ignore_default_sigpipe() {
    struct sigaction current {};
    if (::sigaction(SIGPIPE, nullptr, &current) != 0) return;
    if ((current.sa_flags & SA_SIGINFO) != 0 || current.sa_handler != SIG_DFL) return;
    struct sigaction ignore {};
    ignore.sa_handler = SIG_IGN;
    sigemptyset(&ignore.sa_mask);
    if (::sigaction(SIGPIPE, &ignore, nullptr) == 0) {
        TCPX_INFO(
            "SIGPIPE is ignored from now on (it had its default action, which ends the "
            "process): an ncclNet plugin's sends on a connection its peer reset raise it");
    }
}

}  // namespace

std::string tcpx_env_defaults() {
    std::string out;
    for (const auto& d : kTcpxDefaults) out += std::string(d.name) + "=" + d.value + "\n";
    return out;
}

StatusOr<std::unique_ptr<Net>> load_net_plugin(const std::string& path, const Settings& settings) {
    if (path.empty()) return invalid_argument("net plugin: empty path");
    bool already_loaded = false;
    {
        std::lock_guard<std::mutex> lock(g_mu);
        already_loaded = loaded().count(path) != 0;
    }
    // A plugin that exits or crashes in init does so in a child first (see plugin_probe.h).
    if (!already_loaded && settings.plugin_probe == "on") {
        TCPX_RETURN_IF_ERROR(probe_plugin(path, settings));
    }
    void* lib = nullptr;
    {
        std::lock_guard<std::mutex> lock(g_mu);
        auto it = loaded().find(path);
        if (it != loaded().end()) {
            lib = it->second;
        } else {
            dlerror();
            lib = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
            if (lib == nullptr) {
                const char* err = dlerror();
                return not_found(strformat("net plugin: cannot load %s: %s", path.c_str(),
                                           err != nullptr ? err : "unknown error"));
            }
            loaded().emplace(path, lib);
        }
    }
    TCPX_ASSIGN_OR_RETURN(NcclNetTable * table, find_net_table(lib, path));
    ignore_default_sigpipe();  // before its init, which may start its threads
    apply_tcpx_env_defaults(*table);
    TCPX_RETURN_IF_ERROR(check_rxdm_running(
        table->name(), env_get("NCCL_GPUDIRECTTCPX_UNIX_CLIENT_PREFIX").value_or("").c_str()));
    V7Options options;
    options.settings = settings;
    auto net = V7Net::create(table, options);
    if (!net.ok()) return Status(net.status()).with_context("net plugin " + path);
    TCPX_INFO("net plugin %s loaded from %s (ncclNet v%d, %d devices)", (*net)->name().data(),
              path.c_str(), table->version(), (*net)->device_count());
    return std::unique_ptr<Net>(std::move(net).value());
}

}  // namespace tcpx::net
