// ncclNetPlugin_v7: the socket transport's own v7 table under the plugin's name.
#include "nccl_defaults.h"
#include "nccl_plugin.h"
#include "net/socket/socket_v7.h"
#include "net/v7_common.h"

namespace tcpx::nccl_plugin {

const tcpx_ncclNet_v7_t& core() { return *net::socket_net_v7(); }

tcpx_ncclResult_t plugin_init(tcpx_ncclDebugLogger_t logger) {
    const tcpx_ncclResult_t rc = core().init(logger);
    if (rc == tcpx_ncclSuccess) apply_nccl_defaults();
    return rc;
}

tcpx_ncclResult_t plugin_properties(int dev, tcpx_ncclNetProperties_v7_t* out) {
    const tcpx_ncclResult_t rc = core().getProperties(dev, out);
    if (rc == tcpx_ncclSuccess && out != nullptr) out->maxRecvs = 1;  // (nccl_plugin.h)
    return rc;
}

namespace {

tcpx_ncclNet_v7_t make_v7_table() {
    tcpx_ncclNet_v7_t t = core();
    t.name = kName;
    t.init = net::guarded<plugin_init>;  // the core guards the rest (socket_v7.cc)
    t.getProperties = net::guarded<plugin_properties>;
    return t;
}

}  // namespace
}  // namespace tcpx::nccl_plugin

extern "C" __attribute__((visibility("default"))) const tcpx_ncclNet_v7_t ncclNetPlugin_v7 =
    tcpx::nccl_plugin::make_v7_table();
