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

}  // namespace tcpx::nccl_plugin
