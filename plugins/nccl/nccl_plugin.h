// What the NCCL plugin's tables share: the v7 core they all sit on, and the plugin's name.
#pragma once

#include "net/ncclnet_v7.h"

namespace tcpx::nccl_plugin {

// The name NCCL shows (NCCL_DEBUG=INFO: "Using network tcpxp2p") and NCCL_NET selects.
inline constexpr char kName[] = "tcpxp2p";

// The socket transport as a v7 table (socket_v7.cc): every newer table converts to it.
const tcpx_ncclNet_v7_t& core();

}  // namespace tcpx::nccl_plugin
