// libplugin_TCPX.so: what NIXL looks for when an agent creates a backend named "TCPX".
#include "backend/backend_plugin.h"
#include "tcpx/version.h"
#include "tcpx_backend.h"

namespace {
using Creator = nixlBackendPluginCreator<tcpx::nixl_backend::TcpxBackend>;
}  // namespace

extern "C" NIXL_PLUGIN_EXPORT nixlBackendPlugin* nixl_plugin_init() {
    // No exception may cross into NIXL (out of memory building the parameters, or the plugin
    // object): no plugin instead, which NIXL reports as one that failed to load.
    try {
        return Creator::create(NIXL_PLUGIN_API_VERSION, "TCPX", tcpx::version_string(),
                               tcpx::nixl_backend::TcpxBackend::default_params(),
                               {DRAM_SEG, VRAM_SEG});
    } catch (...) {
        return nullptr;
    }
}

extern "C" NIXL_PLUGIN_EXPORT void nixl_plugin_fini() {}
