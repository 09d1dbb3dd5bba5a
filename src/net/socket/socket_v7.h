// The socket transport as an ncclNet v7 function table (C ABI, in-process). The NCCL net plugin
// (plugins/nccl) exports it as ncclNetPlugin_v7; tests drive it through plugin/v7_net.h exactly
// as they drive the C++ provider, so both paths are checked by the same suite.
#pragma once

#include "net/ncclnet_v7.h"

namespace tcpx::net {

// The table's name: V7Net knows this transport's handles by it.
inline constexpr char kSocketTableName[] = "tcpx-p2p-socket";

// The table. Its init() creates one process-wide SocketNet from the TCPX_P2P_* environment
// (later calls reuse it) and, given a logger, routes this library's log to it.
const tcpx_ncclNet_v7_t* socket_net_v7();

}  // namespace tcpx::net
