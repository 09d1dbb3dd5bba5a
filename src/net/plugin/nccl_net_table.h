// The ncclNet calls V7Net makes, in v7's shape, whichever table version is behind them.
//
// V7Net is written once, against NcclNetTable. Each ncclNet version it accepts (v7 to v12) is
// one instantiation of a small adapter (nccl_net_table.cc) that turns the v7-shaped call into the
// version's: sizes as int or size_t, properties converted to v7's, and the arguments later
// versions added (profiler callback and handles, connection config, context) supplied. That file
// and the ABI headers (ncclnet_v7.h, ncclnet_newer.h) are the only ones that know versions.
#pragma once

#include <cstddef>

#include "net/ncclnet_v7.h"

namespace tcpx::net {

// The ncclNet versions the adapters understand. The loader prefers v7 (Google's TCPX plugin
// exports only v7), then the newest.
inline constexpr int kOldestNcclNetVersion = 7;
inline constexpr int kNewestNcclNetVersion = 12;
// Most buffers one irecv takes (NCCL's NCCL_NET_MAX_RECVS).
inline constexpr int kMaxRecvBuffers = 8;

class NcclNetTable {
 public:
    virtual ~NcclNetTable() = default;

    virtual int version() const = 0;
    // The table's name member (null when the plugin set none).
    virtual const char* name() const = 0;
    // The first function V7Net needs that the table lacks, or null.
    virtual const char* missing_function() const = 0;
    virtual bool has_irecv_consumed() const = 0;

    // Most bytes one regMr takes (v7: int sizes).
    virtual size_t max_reg_bytes() const = 0;
    // Most bytes one isend/irecv buffer takes on any of devices [0, ndev), asked after init():
    // below 2 GiB in every version, as test() reports int sizes; from v9 also at most each
    // device's maxP2pBytes.
    virtual size_t max_transfer_bytes(int ndev) const = 0;

    // Called once per table and process (V7Net::create sees to it).
    virtual tcpx_ncclResult_t init(tcpx_ncclDebugLogger_t logger) = 0;
    virtual tcpx_ncclResult_t devices(int* ndev) const = 0;
    // Newer properties arrive converted; what v7 cannot express is dropped, except that a device
    // asking for a flush after CUDA receives (v9's forceFlush) loses CUDA support here: the engine
    // never calls iflush() (Google's is a stub that must not be called), so it stages such data
    // through host memory instead.
    virtual tcpx_ncclResult_t get_properties(int dev, tcpx_ncclNetProperties_v7_t* props) const = 0;
    virtual tcpx_ncclResult_t listen(int dev, void* handle, void** listen_comm) const = 0;
    virtual tcpx_ncclResult_t connect(int dev, void* handle, void** send_comm,
                                      tcpx_ncclNetDeviceHandle_v7_t** dev_handle) const = 0;
    virtual tcpx_ncclResult_t accept(void* listen_comm, void** recv_comm,
                                     tcpx_ncclNetDeviceHandle_v7_t** dev_handle) const = 0;
    // Sizes are within max_reg_bytes() / max_transfer_bytes() (the caller checks); n is in
    // [1, kMaxRecvBuffers].
    virtual tcpx_ncclResult_t reg_mr(void* comm, void* data, size_t size, int type,
                                     void** mhandle) const = 0;
    virtual tcpx_ncclResult_t dereg_mr(void* comm, void* mhandle) const = 0;
    virtual tcpx_ncclResult_t isend(void* send_comm, void* data, size_t size, int tag,
                                    void* mhandle, void** request) const = 0;
    virtual tcpx_ncclResult_t irecv(void* recv_comm, int n, void** data, const size_t* sizes,
                                    int* tags, void** mhandles, void** request) const = 0;
    virtual tcpx_ncclResult_t test(void* request, int* done, int* sizes) const = 0;
    virtual tcpx_ncclResult_t irecv_consumed(void* recv_comm, int n, void* request) const = 0;
    virtual tcpx_ncclResult_t close_send(void* send_comm) const = 0;
    virtual tcpx_ncclResult_t close_recv(void* recv_comm) const = 0;
    virtual tcpx_ncclResult_t close_listen(void* listen_comm) const = 0;
};

// The adapter for `table`, a plugin's ncclNetPlugin_v<version> (for v7 a tcpx_ncclNet_v7_t);
// null for a version outside [kOldestNcclNetVersion, kNewestNcclNetVersion]. One per table and
// process, never freed: it holds what the table's init() returned (v11's context), and plugins
// are never unloaded.
NcclNetTable* nccl_net_table(const void* table, int version);

}  // namespace tcpx::net
