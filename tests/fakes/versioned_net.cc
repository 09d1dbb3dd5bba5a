// A plugin that exports only ncclNetPlugin_v<TCPX_TEST_NET_VERSION> (8 to 12), built once per
// version as libnccl-net-testv<N>.so so that the plugin tests drive the loader's adapter for each
// newer table through a real dlopen. It moves data with tcpx-p2p's own socket transport (its v7
// table, linked in and hidden) and converts as a vN plugin over a v7 core must: size_t sizes
// through the socket table's sized entry points (socket_v7.h), v7 properties into vN's. It refuses
// what the adapter must supply for the arguments v7 lacks when missing: v10's profiler callback
// (called for every request, as NCCL's own transports do), profiler handle arrays and connection
// config, v11's context.
//
// Built with TCPX_TEST_NET_ALSO_V7 it exports ncclNetPlugin_v7 too (the socket table, renamed
// tcpx-test-net-v7), so that a test sees the loader prefer v7.
//
// Properties a test recognises: guid kGuidBase + N, speed kSpeedBase + N Mb/s, port N,
// latency N/2 µs, maxComms kMaxCommsBase + N, maxP2pBytes kMaxP2pBytes (v9 on); the rest is the
// socket transport's. TCPX_TEST_NET_CUDA=1 in the environment adds CUDA pointer support;
// TCPX_TEST_NET_CUDA=flush adds it with forceFlush set (v9 on). TCPX_TEST_NET_IN_PROGRESS=1:
// test() answers ncclInProgress where the core answers ncclSuccess (NCCL reads `done` after
// either). TCPX_TEST_NET_DEVICES=N: devices() reports N (properties of the real ones only).
#include <cstdlib>
#include <cstring>

#include "net/ncclnet_newer.h"
#include "net/socket/socket_v7.h"
#include "tests/fakes/versioned_net.h"

#ifndef TCPX_TEST_NET_VERSION
#error "TCPX_TEST_NET_VERSION must be the ncclNet version to export (8 to 12)"
#endif

namespace {

constexpr int kVersion = TCPX_TEST_NET_VERSION;
static_assert(kVersion >= 8 && kVersion <= 12, "newer tables only");
#define TCPX_TEST_STR2(x) #x
#define TCPX_TEST_STR(x) TCPX_TEST_STR2(x)
constexpr const char* kName = "tcpx-test-net-v" TCPX_TEST_STR(TCPX_TEST_NET_VERSION);

using namespace tcpx::testing::test_net;

const tcpx_ncclNet_v7_t& inner() { return *tcpx::net::socket_net_v7(); }

tcpx_ncclProfilerCallback_t g_profiler = nullptr;

tcpx_ncclResult_t init_with(tcpx_ncclDebugLogger_t logger, tcpx_ncclProfilerCallback_t profiler) {
    if (logger == nullptr) return tcpx_ncclInvalidArgument;
    g_profiler = profiler;
    return inner().init(logger);
}

#if TCPX_TEST_NET_VERSION >= 12
using Props = tcpx_ncclNetProperties_v12_t;
using Table = tcpx_ncclNet_v12_t;
#elif TCPX_TEST_NET_VERSION == 11
using Props = tcpx_ncclNetProperties_v11_t;
using Table = tcpx_ncclNet_v11_t;
#elif TCPX_TEST_NET_VERSION == 10
using Props = tcpx_ncclNetProperties_v10_t;
using Table = tcpx_ncclNet_v10_t;
#elif TCPX_TEST_NET_VERSION == 9
using Props = tcpx_ncclNetProperties_v9_t;
using Table = tcpx_ncclNet_v9_t;
#else
using Props = tcpx_ncclNetProperties_v8_t;
using Table = tcpx_ncclNet_v8_t;
#endif

tcpx_ncclResult_t plugin_get_properties(int dev, Props* out) {
    if (out == nullptr) return tcpx_ncclInvalidArgument;
    tcpx_ncclNetProperties_v7_t p{};
    const tcpx_ncclResult_t rc = inner().getProperties(dev, &p);
    if (rc != tcpx_ncclSuccess) return rc;
    const char* cuda = std::getenv("TCPX_TEST_NET_CUDA");
    *out = Props{};
    out->name = p.name;
    out->pciPath = p.pciPath;
    out->guid = kGuidBase + kVersion;
    out->ptrSupport = p.ptrSupport | (cuda != nullptr ? TCPX_NCCL_PTR_CUDA : 0);
    out->regIsGlobal = 1;
    out->speed = kSpeedBase + kVersion;
    out->port = kVersion;
    out->latency = kVersion / 2.0f;
    out->maxComms = kMaxCommsBase + kVersion;
    out->maxRecvs = p.maxRecvs;
    out->netDeviceType = p.netDeviceType;
    out->netDeviceVersion = p.netDeviceVersion;
#if TCPX_TEST_NET_VERSION >= 9
    out->forceFlush = cuda != nullptr && std::strcmp(cuda, "flush") == 0 ? 1 : 0;
    out->vProps.ndevs = 1;
    out->vProps.devs[0] = dev;
    out->maxP2pBytes = kMaxP2pBytes;
    out->maxCollBytes = kMaxP2pBytes;
#endif
#if TCPX_TEST_NET_VERSION >= 11
    out->maxMultiRequestSize = 1;
#endif
#if TCPX_TEST_NET_VERSION >= 12
    out->railId = -1;
    out->planeId = -1;
#endif
    return tcpx_ncclSuccess;
}

tcpx_ncclResult_t plugin_devices(int* ndev) {
    if (const char* n = std::getenv("TCPX_TEST_NET_DEVICES"); n != nullptr && ndev != nullptr) {
        *ndev = std::atoi(n);
        return tcpx_ncclSuccess;
    }
    return inner().devices(ndev);
}

tcpx_ncclResult_t plugin_test(void* request, int* done, int* sizes) {
    const tcpx_ncclResult_t rc = inner().test(request, done, sizes);
    if (rc == tcpx_ncclSuccess && std::getenv("TCPX_TEST_NET_IN_PROGRESS") != nullptr) {
        return tcpx_ncclInProgress;
    }
    return rc;
}

#if TCPX_TEST_NET_VERSION >= 11
int g_context_token = 0;  // its address is the v11 context

tcpx_ncclResult_t plugin_init(void** ctx, uint64_t /*comm_id*/, tcpx_ncclNetCommConfig_t* config,
                              tcpx_ncclDebugLogger_t logger, tcpx_ncclProfilerCallback_t profiler) {
    if (ctx == nullptr || config == nullptr || profiler == nullptr) return tcpx_ncclInvalidArgument;
    if (config->trafficClass != TCPX_NCCL_NET_TRAFFIC_CLASS_UNDEF) return tcpx_ncclInvalidArgument;
    *ctx = &g_context_token;
    return init_with(logger, profiler);
}
bool is_our_context(void* ctx) { return ctx == &g_context_token; }
tcpx_ncclResult_t plugin_listen(void* ctx, int dev, void* handle, void** listen_comm) {
    if (!is_our_context(ctx)) return tcpx_ncclInvalidUsage;
    return inner().listen(dev, handle, listen_comm);
}
tcpx_ncclResult_t plugin_connect(void* ctx, int dev, void* handle, void** send_comm,
                                 tcpx_ncclNetDeviceHandle_t** dev_handle) {
    if (!is_our_context(ctx)) return tcpx_ncclInvalidUsage;
    return inner().connect(dev, handle, send_comm, dev_handle);
}
tcpx_ncclResult_t plugin_finalize(void* ctx) {
    return is_our_context(ctx) ? tcpx_ncclSuccess : tcpx_ncclInvalidUsage;
}
tcpx_ncclResult_t plugin_set_net_attr(void* ctx, tcpx_ncclNetAttr_t*) {
    return is_our_context(ctx) ? tcpx_ncclSuccess : tcpx_ncclInvalidUsage;
}
#elif TCPX_TEST_NET_VERSION == 10
tcpx_ncclResult_t plugin_init(tcpx_ncclDebugLogger_t logger, tcpx_ncclProfilerCallback_t profiler) {
    if (profiler == nullptr) return tcpx_ncclInvalidArgument;
    return init_with(logger, profiler);
}
tcpx_ncclResult_t plugin_connect(int dev, tcpx_ncclNetCommConfig_t* config, void* handle,
                                 void** send_comm, tcpx_ncclNetDeviceHandle_t** dev_handle) {
    if (config == nullptr || config->trafficClass != TCPX_NCCL_NET_TRAFFIC_CLASS_UNDEF) {
        return tcpx_ncclInvalidArgument;
    }
    return inner().connect(dev, handle, send_comm, dev_handle);
}
#else
tcpx_ncclResult_t plugin_init(tcpx_ncclDebugLogger_t logger) { return init_with(logger, nullptr); }
#endif

#if TCPX_TEST_NET_VERSION >= 10
// What NCCL's transports do per request: a start and a stop event for the caller's handle.
tcpx_ncclResult_t profile_request(void* phandle) {
    if (g_profiler == nullptr) return tcpx_ncclInvalidUsage;
    void* event = nullptr;
    tcpx_ncclResult_t rc =
        g_profiler(&event, TCPX_NCCL_PROFILER_NET_EVENT_START, phandle, kVersion, nullptr);
    if (rc != tcpx_ncclSuccess) return rc;
    return g_profiler(&event, TCPX_NCCL_PROFILER_NET_EVENT_STOP, nullptr, 0, nullptr);
}

tcpx_ncclResult_t plugin_isend(void* comm, void* data, size_t size, int tag, void* mhandle,
                               void* phandle, void** request) {
    const tcpx_ncclResult_t rc = profile_request(phandle);
    if (rc != tcpx_ncclSuccess) return rc;
    return tcpx::net::socket_v7_isend_sized(comm, data, size, tag, mhandle, request);
}
tcpx_ncclResult_t plugin_irecv(void* comm, int n, void** data, size_t* sizes, int* tags,
                               void** mhandles, void** phandles, void** request) {
    if (phandles == nullptr) return tcpx_ncclInvalidArgument;
    for (int i = 0; i < n; ++i) {
        const tcpx_ncclResult_t rc = profile_request(phandles[i]);
        if (rc != tcpx_ncclSuccess) return rc;
    }
    return tcpx::net::socket_v7_irecv_sized(comm, n, data, sizes, tags, mhandles, request);
}
#endif

#if TCPX_TEST_NET_VERSION >= 9
template <typename VDeviceProps>
tcpx_ncclResult_t plugin_make_vdevice(int*, VDeviceProps*) {
    return tcpx_ncclInvalidUsage;  // no virtual NICs
}
#endif

// The core's functions where the signature did not change; the rest per version.
Table make_table() {
    Table t{};
    t.name = kName;
    t.init = plugin_init;
    t.devices = plugin_devices;
    t.getProperties = plugin_get_properties;
    t.accept = inner().accept;
    t.regMr = tcpx::net::socket_v7_reg_mr_sized;
    t.regMrDmaBuf = nullptr;
    t.deregMr = inner().deregMr;
    t.iflush = inner().iflush;
    t.test = plugin_test;
    t.closeSend = inner().closeSend;
    t.closeRecv = inner().closeRecv;
    t.closeListen = inner().closeListen;
    t.getDeviceMr = inner().getDeviceMr;
    t.irecvConsumed = inner().irecvConsumed;
#if TCPX_TEST_NET_VERSION >= 11
    t.listen = plugin_listen;
    t.connect = plugin_connect;
    t.finalize = plugin_finalize;
    t.setNetAttr = plugin_set_net_attr;
#elif TCPX_TEST_NET_VERSION == 10
    t.listen = inner().listen;
    t.connect = plugin_connect;
#else
    t.listen = inner().listen;
    t.connect = inner().connect;
#endif
#if TCPX_TEST_NET_VERSION >= 10
    t.isend = plugin_isend;
    t.irecv = plugin_irecv;
#elif TCPX_TEST_NET_VERSION == 9
    t.isend = tcpx::net::socket_v7_isend_sized;
    t.irecv = tcpx::net::socket_v7_irecv_sized;
#else
    t.isend = inner().isend;
    t.irecv = inner().irecv;
#endif
#if TCPX_TEST_NET_VERSION >= 9
    t.makeVDevice = plugin_make_vdevice;
#endif
    return t;
}

}  // namespace

#define TCPX_TEST_EXPORT_SYMBOL2(v) ncclNetPlugin_v##v
#define TCPX_TEST_EXPORT_SYMBOL(v) TCPX_TEST_EXPORT_SYMBOL2(v)

extern "C" __attribute__((visibility("default")))
const Table TCPX_TEST_EXPORT_SYMBOL(TCPX_TEST_NET_VERSION) = make_table();

#ifdef TCPX_TEST_NET_ALSO_V7
namespace {
tcpx_ncclNet_v7_t make_v7_table() {
    tcpx_ncclNet_v7_t t = inner();
    t.name = "tcpx-test-net-v7";
    return t;
}
}  // namespace
extern "C" __attribute__((visibility("default"))) const tcpx_ncclNet_v7_t ncclNetPlugin_v7 =
    make_v7_table();
#endif
