// What the NCCL plugin's tables share: the v7 core they all sit on, and the plugin's name.
#pragma once

#include <cstddef>

#include "net/ncclnet_v7.h"

namespace tcpx::nccl_plugin {

// The name NCCL shows (NCCL_DEBUG=INFO: "Using network tcpxp2p") and NCCL_NET selects.
inline constexpr char kName[] = "tcpxp2p";

// The core every table converts to (nccl_core.cc): the socket transport's v7 table, with GPU
// buffers staged through host memory when TCPX_P2P_NCCL_CUDA is on.
const tcpx_ncclNet_v7_t& core();

// The core's regMr, isend and irecv with the size_t sizes of newer versions (regMr from v8,
// isend / irecv from v9); past INT_MAX is ncclInvalidArgument, as maxP2pBytes says.
tcpx_ncclResult_t core_reg_mr_sized(void* comm, void* data, size_t size, int type, void** mhandle);
tcpx_ncclResult_t core_isend_sized(void* comm, void* data, size_t size, int tag, void* mhandle,
                                   void** request);
tcpx_ncclResult_t core_irecv_sized(void* comm, int n, void** data, size_t* sizes, int* tags,
                                   void** mhandles, void** request);

}  // namespace tcpx::nccl_plugin
