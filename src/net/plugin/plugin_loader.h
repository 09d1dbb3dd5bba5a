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
// `settings` gives the wrapper's settings (V7Options::settings).
StatusOr<std::unique_ptr<Net>> load_net_plugin(const std::string& path, const Settings& settings);

// The NCCL_* defaults applied for Google's TCPX plugin, as "NAME=value" lines (for docs and the
// doctor). Each is set only when the variable is unset.
std::string tcpx_env_defaults();

}  // namespace tcpx::net
