// Loading an external ncclNet plugin (.so) as a Net: Google's GPUDirect-TCPX plugin
// (libnccl-net-tcpx.so), our emulation of it (tests/fakes), or any other ncclNet plugin of v7 to
// v12.
#pragma once

#include <memory>
#include <string>

#include "common/params.h"
#include "net/net.h"
#include "tcpx/status.h"

namespace tcpx::net {

// dlopen()s `path` (RTLD_NOW | RTLD_LOCAL), finds its ncclNet table and wraps it (V7Net): its
// ncclNetPlugin_v7 when it exports one, otherwise the newest of ncclNetPlugin_v12 ... _v8, adapted
// to v7's shape (nccl_net_table.h). The library stays loaded for the process's life: plugins
// start threads and register atexit handlers, so unloading one is never safe.
//
// For Google's TCPX plugin (its table is named GPUDirectTCPX*) the NCCL_* variables it needs but
// does not default sensibly are set first, when the user has not set them (see
// tcpx_env_defaults()). A plugin with none of these tables is refused with a message naming the
// ncclNetPlugin_vN symbols it does export.
//
// Unless PLUGIN_PROBE is off, the plugin's init and device query first run in a child process
// (plugin_probe.h); when that child exits non-zero, dies or hangs, loading fails with what it
// printed and the plugin is never loaded here. `settings` gives the probe's settings and the
// wrapper's (V7Options::settings).
StatusOr<std::unique_ptr<Net>> load_net_plugin(const std::string& path, const Settings& settings);

class NcclNetTable;

// What the loader and the plugin probe share.
// Whether a table of this name is Google's TCPX plugin (or our emulation of it): GPUDirectTCPX*.
bool is_google_tcpx(const char* table_name);
// The ncclNet table of the dlopen()ed `lib` (named `path` in errors).
StatusOr<NcclNetTable*> find_net_table(void* lib, const std::string& path);
// For Google's TCPX plugin: sets the NCCL_* defaults below that the user has not set.
void apply_tcpx_env_defaults(const NcclNetTable& table);

// Google's plugin under its default receive memory imports its RX buffers from, and has its
// flow-steering rules installed by, the receive-datapath manager (RxDM), over UNIX sockets in
// `unix_client_prefix` (its NCCL_GPUDIRECTTCPX_UNIX_CLIENT_PREFIX; null or empty: /tmp). Without
// the RxDM it gets as far as accept() and then exits the process. For a table named exactly
// GPUDirectTCPX_v7 (the real plugin; not our emulation) this checks that
// `<prefix>/rx_rule_manager` is a socket, and otherwise returns FAILED_PRECONDITION saying how
// to start the RxDM or point the plugin at it. Any other table: OK.
Status check_rxdm_running(const char* table_name, const char* unix_client_prefix);

// The NCCL_* defaults applied for Google's TCPX plugin, as "NAME=value" lines (for docs and the
// doctor). Each is set only when the variable is unset.
std::string tcpx_env_defaults();

}  // namespace tcpx::net
