// ncclNetPlugin_v<TCPX_NCCL_PLUGIN_VERSION> (8 to 11) over the v7 core: compiled once per version
// (CMakeLists.txt), each object exporting its one table. What a newer version adds is converted
// here: size_t sizes go to the socket table's sized entry points (socket_v7.h; the largest request
// is INT_MAX bytes, as maxP2pBytes says from v9), v7 properties into the version's, v10's
// connection config and profiler, v11's per-communicator context.
#include <climits>
#include <cstdint>
#include <mutex>
#include <set>

#include "nccl_plugin.h"
#include "net/ncclnet_newer.h"
#include "net/socket/socket_v7.h"
#include "net/v7_common.h"

#ifndef TCPX_NCCL_PLUGIN_VERSION
#error "TCPX_NCCL_PLUGIN_VERSION must be the ncclNet version to export (8 to 11)"
#endif

namespace tcpx::nccl_plugin {
namespace {

constexpr int kVersion = TCPX_NCCL_PLUGIN_VERSION;
static_assert(kVersion >= 8 && kVersion <= 11, "newer tables up to what NCCL 2.28 loads");

#if TCPX_NCCL_PLUGIN_VERSION == 11
using Props = tcpx_ncclNetProperties_v11_t;
using Table = tcpx_ncclNet_v11_t;
#elif TCPX_NCCL_PLUGIN_VERSION == 10
using Props = tcpx_ncclNetProperties_v10_t;
using Table = tcpx_ncclNet_v10_t;
#elif TCPX_NCCL_PLUGIN_VERSION == 9
using Props = tcpx_ncclNetProperties_v9_t;
using Table = tcpx_ncclNet_v9_t;
#else
using Props = tcpx_ncclNetProperties_v8_t;
using Table = tcpx_ncclNet_v8_t;
#endif

tcpx_ncclResult_t get_properties(int dev, Props* out) {
    if (out == nullptr) return tcpx_ncclInvalidArgument;
    tcpx_ncclNetProperties_v7_t p{};
    const tcpx_ncclResult_t rc = plugin_properties(dev, &p);
    if (rc != tcpx_ncclSuccess) return rc;
    *out = Props{};
    out->name = p.name;
    out->pciPath = p.pciPath;
    out->guid = p.guid;
    out->ptrSupport = p.ptrSupport;
    out->regIsGlobal = 0;  // a registration belongs to the comm it was made on
    out->speed = p.speed;
    out->port = p.port;
    out->latency = p.latency;
    out->maxComms = p.maxComms;
    out->maxRecvs = p.maxRecvs;
    out->netDeviceType = p.netDeviceType;
    out->netDeviceVersion = p.netDeviceVersion;
#if TCPX_NCCL_PLUGIN_VERSION >= 9
    out->forceFlush = 0;  // host memory: nothing to flush
    out->vProps.ndevs = 1;
    out->vProps.devs[0] = dev;
    out->maxP2pBytes = static_cast<size_t>(INT_MAX);  // the core's sizes are ints
    out->maxCollBytes = static_cast<size_t>(INT_MAX);
#endif
#if TCPX_NCCL_PLUGIN_VERSION >= 11
    out->maxMultiRequestSize = 1;
#endif
    return tcpx_ncclSuccess;
}

#if TCPX_NCCL_PLUGIN_VERSION >= 10
// The profiler handles are NCCL's to give; this transport reports no profiler events.
tcpx_ncclResult_t isend_v10(void* comm, void* data, size_t size, int tag, void* mhandle,
                            void* /*phandle*/, void** request) {
    return net::socket_v7_isend_sized(comm, data, size, tag, mhandle, request);
}
tcpx_ncclResult_t irecv_v10(void* comm, int n, void** data, size_t* sizes, int* tags,
                            void** mhandles, void** /*phandles*/, void** request) {
    return net::socket_v7_irecv_sized(comm, n, data, sizes, tags, mhandles, request);
}
#endif

#if TCPX_NCCL_PLUGIN_VERSION >= 11
// A communicator's context (init to finalize). Only contexts made here are accepted: a stale or
// foreign pointer is an error, never dereferenced.
struct Context {
    uint64_t comm_id = 0;
};
std::mutex g_mu;
std::set<Context*>& contexts() {
    static auto* s = new std::set<Context*>;  // never destroyed: NCCL may call in during exit
    return *s;
}
bool known(void* ctx) {
    std::lock_guard<std::mutex> lock(g_mu);
    return contexts().count(static_cast<Context*>(ctx)) != 0;
}

tcpx_ncclResult_t init_v11(void** ctx, uint64_t comm_id, tcpx_ncclNetCommConfig_t* /*config*/,
                           tcpx_ncclDebugLogger_t logger, tcpx_ncclProfilerCallback_t /*prof*/) {
    if (ctx == nullptr) return tcpx_ncclInvalidArgument;
    const tcpx_ncclResult_t rc = plugin_init(logger);
    if (rc != tcpx_ncclSuccess) return rc;
    auto* c = new Context{comm_id};
    {
        std::lock_guard<std::mutex> lock(g_mu);
        contexts().insert(c);
    }
    *ctx = c;
    return tcpx_ncclSuccess;
}
tcpx_ncclResult_t finalize_v11(void* ctx) {
    std::lock_guard<std::mutex> lock(g_mu);
    auto* c = static_cast<Context*>(ctx);
    if (contexts().erase(c) == 0) return tcpx_ncclInvalidUsage;
    delete c;
    return tcpx_ncclSuccess;
}
tcpx_ncclResult_t listen_v11(void* ctx, int dev, void* handle, void** listen_comm) {
    if (!known(ctx)) return tcpx_ncclInvalidUsage;
    return core().listen(dev, handle, listen_comm);
}
tcpx_ncclResult_t connect_v11(void* ctx, int dev, void* handle, void** send_comm,
                              tcpx_ncclNetDeviceHandle_t** dev_handle) {
    if (!known(ctx)) return tcpx_ncclInvalidUsage;
    return core().connect(dev, handle, send_comm, dev_handle);
}
// NCCL's hints (concurrent peers, flows per peer) change nothing here.
tcpx_ncclResult_t set_net_attr_v11(void* ctx, tcpx_ncclNetAttr_t* /*attr*/) {
    return known(ctx) ? tcpx_ncclSuccess : tcpx_ncclInvalidUsage;
}
#elif TCPX_NCCL_PLUGIN_VERSION == 10
tcpx_ncclResult_t init_v10(tcpx_ncclDebugLogger_t logger, tcpx_ncclProfilerCallback_t /*prof*/) {
    return plugin_init(logger);
}
// The traffic class (config) is a hint for NICs with QoS; TCP here has none.
tcpx_ncclResult_t connect_v10(int dev, tcpx_ncclNetCommConfig_t* /*config*/, void* handle,
                              void** send_comm, tcpx_ncclNetDeviceHandle_t** dev_handle) {
    return core().connect(dev, handle, send_comm, dev_handle);
}
#endif

// The plugin's own entry points are guarded here, the core's in socket_v7.cc: no exception
// (out of memory) reaches NCCL.
Table make_table() {
    Table t{};
    t.name = kName;
    t.devices = core().devices;
    t.getProperties = net::guarded<get_properties>;
    t.accept = core().accept;
    t.regMr = net::socket_v7_reg_mr_sized;
    t.regMrDmaBuf = nullptr;  // no DMA-BUF: host memory only
    t.deregMr = core().deregMr;
    t.iflush = core().iflush;
    t.test = core().test;
    t.closeSend = core().closeSend;
    t.closeRecv = core().closeRecv;
    t.closeListen = core().closeListen;
    t.getDeviceMr = core().getDeviceMr;
    t.irecvConsumed = core().irecvConsumed;
#if TCPX_NCCL_PLUGIN_VERSION >= 11
    t.init = net::guarded<init_v11>;
    t.listen = net::guarded<listen_v11>;
    t.connect = net::guarded<connect_v11>;
    t.finalize = net::guarded<finalize_v11>;
    t.setNetAttr = net::guarded<set_net_attr_v11>;
#elif TCPX_NCCL_PLUGIN_VERSION == 10
    t.init = net::guarded<init_v10>;
    t.listen = core().listen;
    t.connect = net::guarded<connect_v10>;
#else
    t.init = net::guarded<plugin_init>;
    t.listen = core().listen;
    t.connect = core().connect;
#endif
#if TCPX_NCCL_PLUGIN_VERSION >= 10
    t.isend = net::guarded<isend_v10>;
    t.irecv = net::guarded<irecv_v10>;
#elif TCPX_NCCL_PLUGIN_VERSION == 9
    t.isend = net::socket_v7_isend_sized;
    t.irecv = net::socket_v7_irecv_sized;
#else
    t.isend = core().isend;
    t.irecv = core().irecv;
#endif
#if TCPX_NCCL_PLUGIN_VERSION >= 9
    t.makeVDevice = nullptr;  // no virtual NICs: NCCL uses the devices as they are (a
                              // function, even one that refuses, sends NCCL down its NIC-merging
                              // path, and NCCL_NET_FORCE_MERGE then fails the communicator)
#endif
    return t;
}

}  // namespace
}  // namespace tcpx::nccl_plugin

#define TCPX_NCCL_PLUGIN_SYMBOL2(v) ncclNetPlugin_v##v
#define TCPX_NCCL_PLUGIN_SYMBOL(v) TCPX_NCCL_PLUGIN_SYMBOL2(v)

extern "C" __attribute__((visibility("default")))
const tcpx::nccl_plugin::Table TCPX_NCCL_PLUGIN_SYMBOL(TCPX_NCCL_PLUGIN_VERSION) =
    tcpx::nccl_plugin::make_table();
