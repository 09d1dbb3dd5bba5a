// What the NCCL plugin's tables share: the v7 core they all sit on, and the plugin's name.
#pragma once

#include "net/ncclnet_v7.h"

namespace tcpx::nccl_plugin {

// The name NCCL shows (NCCL_DEBUG=INFO: "Using network tcpxp2p") and NCCL_NET selects.
inline constexpr char kName[] = "tcpxp2p";

// The socket transport as a v7 table (socket_v7.cc): every newer table converts to it.
const tcpx_ncclNet_v7_t& core();

// Every table's init: the core's, then, once it has succeeded, the NCCL settings the plugin
// provides where the environment has none (nccl_defaults.h). A failed init sets nothing, so NCCL
// falls back to its own transport with its own settings.
tcpx_ncclResult_t plugin_init(tcpx_ncclDebugLogger_t logger);

// Every table's properties: the core's, with maxRecvs 1. The core takes grouped receives (n > 1,
// for the engine and its tests), but matches a group's buffers to messages in the order they
// arrive. With maxRecvs > 1 NCCL shares one connection among several source ranks (PXN, on by
// default where a NIC is near only some GPUs) and groups their receives, while each source
// sends on its own schedule: a source's next step could land in another's buffer, and NCCL's
// collective aborted. NCCL's IB transport holds such a send back until the receiver's posted tags
// say it fits; a TCP stream has no such word from the receiver. With 1, NCCL never groups.
tcpx_ncclResult_t plugin_properties(int dev, tcpx_ncclNetProperties_v7_t* out);

}  // namespace tcpx::nccl_plugin
