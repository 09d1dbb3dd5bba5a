// The socket transport as an ncclNet v7 function table (C ABI, in-process). The NCCL net plugin
// (plugins/nccl) exports it as ncclNetPlugin_v7; tests drive it through plugin/v7_net.h exactly
// as they drive the C++ provider, so both paths are checked by the same suite.
#pragma once

#include <cstddef>

#include "net/ncclnet_v7.h"

namespace tcpx::net {

// The table's name: V7Net knows this transport's handles by it.
inline constexpr char kSocketTableName[] = "tcpx-p2p-socket";

// The table. Its init() creates one process-wide SocketNet from the TCPX_P2P_* environment
// (later calls reuse it) and, given a logger, routes this library's log to it.
const tcpx_ncclNet_v7_t* socket_net_v7();

// The table's regMr, isend and irecv with the size_t sizes newer ncclNet versions pass (regMr from
// v8, isend / irecv from v9), for the tables that sit on this one (plugins/nccl, the test
// plugins). A size past INT_MAX is ncclInvalidArgument: test() reports sizes as ints.
tcpx_ncclResult_t socket_v7_reg_mr_sized(void* comm, void* data, size_t size, int type,
                                         void** mhandle);
tcpx_ncclResult_t socket_v7_isend_sized(void* send_comm, void* data, size_t size, int tag,
                                        void* mhandle, void** request);
tcpx_ncclResult_t socket_v7_irecv_sized(void* recv_comm, int n, void** data, size_t* sizes,
                                        int* tags, void** mhandles, void** request);

}  // namespace tcpx::net
