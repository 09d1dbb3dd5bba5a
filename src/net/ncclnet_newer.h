/* The ncclNet plugin tables newer than v7 (v8 to v12), declared from NCCL's own headers
 * (src/include/plugin/net/net_v8.h ... net_v12.h of NVIDIA/nccl; v8 and v9 first shipped in
 * ext-net/example/nccl/), so that the loader can adapt a plugin that exports only a newer table.
 *
 * Like ncclnet_v7.h, names carry a tcpx_ prefix; the layouts are NCCL's, checked by the static
 * assertions at the end. Only the device-handle type is unchanged since v7 (NCCL typedefs every
 * later one to it). What changed, version by version:
 *   v8  (NCCL 2.20): properties gain regIsGlobal after ptrSupport; regMr takes a size_t size.
 *   v9  (2.24): properties gain forceFlush after regIsGlobal, and vProps, maxP2pBytes and
 *       maxCollBytes at the end; isend takes a size_t size and irecv size_t sizes (test and
 *       iflush keep int sizes); makeVDevice is appended.
 *   v10 (2.26): init takes a profiler callback; connect takes a per-connection config
 *       (trafficClass); isend/irecv take profiler handles (one per buffer for irecv).
 *   v11 (2.28): init takes (&ctx, commId, config, logger, profiler) and returns a context that
 *       listen and connect take first (connect loses its config); properties gain
 *       maxMultiRequestSize; finalize(ctx) and setNetAttr(ctx, attr) are appended.
 *   v12 (2.30): vProps holds 8 devices instead of 4; properties gain railId and planeId (int16). */
#ifndef TCPX_NET_NCCLNET_NEWER_H_
#define TCPX_NET_NCCLNET_NEWER_H_

#include <stddef.h>
#include <stdint.h>

#include "net/ncclnet_v7.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef tcpx_ncclNetDeviceHandle_v7_t tcpx_ncclNetDeviceHandle_t;

/* From v10: how a plugin reports events to NCCL's profiler. `type` is one of the event kinds
 * below; `phandle` is what NCCL passed to isend/irecv. */
typedef tcpx_ncclResult_t (*tcpx_ncclProfilerCallback_t)(void** eHandle, int type, void* phandle,
                                                         int64_t pluginId, void* extData);
enum {
    TCPX_NCCL_PROFILER_NET_EVENT_START = 0,
    TCPX_NCCL_PROFILER_NET_EVENT_STOP = 1,
    TCPX_NCCL_PROFILER_NET_EVENT_UPDATE = 2,
    TCPX_NCCL_PROFILER_NET_EVENT_UPDATE_AND_STOP = 3,
};

/* From v10: per-connection settings (v10: connect's argument; v11 on: init's). */
#define TCPX_NCCL_NET_TRAFFIC_CLASS_UNDEF (-1)
typedef struct {
    int trafficClass;
} tcpx_ncclNetCommConfig_t;

/* From v9: a virtual NIC fusing several devices (makeVDevice); 4 devices through v11, 8 in v12. */
typedef struct {
    int ndevs;
    int devs[4];
} tcpx_ncclNetVDeviceProps_v9_t;
typedef struct {
    int ndevs;
    int devs[8];
} tcpx_ncclNetVDeviceProps_v12_t;

/* From v11: hints NCCL may pass through setNetAttr. */
typedef struct {
    int32_t maxConcurrentPeers;
    int32_t minConcurrentPeers;
    int32_t maxFlowsPerPeer;
    int32_t minFlowsPerPeer;
} tcpx_ncclNetCommAttr_t;
typedef struct {
    tcpx_ncclNetCommAttr_t sendCommAttr;
    tcpx_ncclNetCommAttr_t recvCommAttr;
    uint32_t op;
    uint32_t algo;
    uint32_t proto;
} tcpx_ncclNetAttr_t;

/* ---- properties ---- */

typedef struct {
    char* name;
    char* pciPath;
    uint64_t guid;
    int ptrSupport;
    int regIsGlobal; /* registrations are not tied to one comm */
    int speed;
    int port;
    float latency;
    int maxComms;
    int maxRecvs;
    int netDeviceType;
    int netDeviceVersion;
} tcpx_ncclNetProperties_v8_t;

/* v9 and v10 share this layout. */
typedef struct {
    char* name;
    char* pciPath;
    uint64_t guid;
    int ptrSupport;
    int regIsGlobal;
    int forceFlush; /* received CUDA data needs iflush() before the GPU may read it */
    int speed;
    int port;
    float latency;
    int maxComms;
    int maxRecvs;
    int netDeviceType;
    int netDeviceVersion;
    tcpx_ncclNetVDeviceProps_v9_t vProps;
    size_t maxP2pBytes; /* largest isend/irecv */
    size_t maxCollBytes;
} tcpx_ncclNetProperties_v9_t;
typedef tcpx_ncclNetProperties_v9_t tcpx_ncclNetProperties_v10_t;

typedef struct {
    char* name;
    char* pciPath;
    uint64_t guid;
    int ptrSupport;
    int regIsGlobal;
    int forceFlush;
    int speed;
    int port;
    float latency;
    int maxComms;
    int maxRecvs;
    int netDeviceType;
    int netDeviceVersion;
    tcpx_ncclNetVDeviceProps_v9_t vProps;
    size_t maxP2pBytes;
    size_t maxCollBytes;
    int maxMultiRequestSize;
} tcpx_ncclNetProperties_v11_t;

typedef struct {
    char* name;
    char* pciPath;
    uint64_t guid;
    int ptrSupport;
    int regIsGlobal;
    int forceFlush;
    int speed;
    int port;
    float latency;
    int maxComms;
    int maxRecvs;
    int netDeviceType;
    int netDeviceVersion;
    tcpx_ncclNetVDeviceProps_v12_t vProps;
    size_t maxP2pBytes;
    size_t maxCollBytes;
    int maxMultiRequestSize;
    int16_t railId;
    int16_t planeId;
} tcpx_ncclNetProperties_v12_t;

/* ---- function tables ---- */

typedef struct {
    const char* name;
    tcpx_ncclResult_t (*init)(tcpx_ncclDebugLogger_t logFunction);
    tcpx_ncclResult_t (*devices)(int* ndev);
    tcpx_ncclResult_t (*getProperties)(int dev, tcpx_ncclNetProperties_v8_t* props);
    tcpx_ncclResult_t (*listen)(int dev, void* handle, void** listenComm);
    tcpx_ncclResult_t (*connect)(int dev, void* handle, void** sendComm,
                                 tcpx_ncclNetDeviceHandle_t** sendDevComm);
    tcpx_ncclResult_t (*accept)(void* listenComm, void** recvComm,
                                tcpx_ncclNetDeviceHandle_t** recvDevComm);
    tcpx_ncclResult_t (*regMr)(void* comm, void* data, size_t size, int type, void** mhandle);
    tcpx_ncclResult_t (*regMrDmaBuf)(void* comm, void* data, size_t size, int type, uint64_t offset,
                                     int fd, void** mhandle);
    tcpx_ncclResult_t (*deregMr)(void* comm, void* mhandle);
    tcpx_ncclResult_t (*isend)(void* sendComm, void* data, int size, int tag, void* mhandle,
                               void** request);
    tcpx_ncclResult_t (*irecv)(void* recvComm, int n, void** data, int* sizes, int* tags,
                               void** mhandles, void** request);
    tcpx_ncclResult_t (*iflush)(void* recvComm, int n, void** data, int* sizes, void** mhandles,
                                void** request);
    tcpx_ncclResult_t (*test)(void* request, int* done, int* sizes);
    tcpx_ncclResult_t (*closeSend)(void* sendComm);
    tcpx_ncclResult_t (*closeRecv)(void* recvComm);
    tcpx_ncclResult_t (*closeListen)(void* listenComm);
    tcpx_ncclResult_t (*getDeviceMr)(void* comm, void* mhandle, void** dptr_mhandle);
    tcpx_ncclResult_t (*irecvConsumed)(void* recvComm, int n, void* request);
} tcpx_ncclNet_v8_t;

typedef struct {
    const char* name;
    tcpx_ncclResult_t (*init)(tcpx_ncclDebugLogger_t logFunction);
    tcpx_ncclResult_t (*devices)(int* ndev);
    tcpx_ncclResult_t (*getProperties)(int dev, tcpx_ncclNetProperties_v9_t* props);
    tcpx_ncclResult_t (*listen)(int dev, void* handle, void** listenComm);
    tcpx_ncclResult_t (*connect)(int dev, void* handle, void** sendComm,
                                 tcpx_ncclNetDeviceHandle_t** sendDevComm);
    tcpx_ncclResult_t (*accept)(void* listenComm, void** recvComm,
                                tcpx_ncclNetDeviceHandle_t** recvDevComm);
    tcpx_ncclResult_t (*regMr)(void* comm, void* data, size_t size, int type, void** mhandle);
    tcpx_ncclResult_t (*regMrDmaBuf)(void* comm, void* data, size_t size, int type, uint64_t offset,
                                     int fd, void** mhandle);
    tcpx_ncclResult_t (*deregMr)(void* comm, void* mhandle);
    tcpx_ncclResult_t (*isend)(void* sendComm, void* data, size_t size, int tag, void* mhandle,
                               void** request);
    tcpx_ncclResult_t (*irecv)(void* recvComm, int n, void** data, size_t* sizes, int* tags,
                               void** mhandles, void** request);
    tcpx_ncclResult_t (*iflush)(void* recvComm, int n, void** data, int* sizes, void** mhandles,
                                void** request);
    tcpx_ncclResult_t (*test)(void* request, int* done, int* sizes);
    tcpx_ncclResult_t (*closeSend)(void* sendComm);
    tcpx_ncclResult_t (*closeRecv)(void* recvComm);
    tcpx_ncclResult_t (*closeListen)(void* listenComm);
    tcpx_ncclResult_t (*getDeviceMr)(void* comm, void* mhandle, void** dptr_mhandle);
    tcpx_ncclResult_t (*irecvConsumed)(void* recvComm, int n, void* request);
    tcpx_ncclResult_t (*makeVDevice)(int* d, tcpx_ncclNetVDeviceProps_v9_t* props);
} tcpx_ncclNet_v9_t;

typedef struct {
    const char* name;
    tcpx_ncclResult_t (*init)(tcpx_ncclDebugLogger_t logFunction,
                              tcpx_ncclProfilerCallback_t profFunction);
    tcpx_ncclResult_t (*devices)(int* ndev);
    tcpx_ncclResult_t (*getProperties)(int dev, tcpx_ncclNetProperties_v10_t* props);
    tcpx_ncclResult_t (*listen)(int dev, void* handle, void** listenComm);
    tcpx_ncclResult_t (*connect)(int dev, tcpx_ncclNetCommConfig_t* config, void* handle,
                                 void** sendComm, tcpx_ncclNetDeviceHandle_t** sendDevComm);
    tcpx_ncclResult_t (*accept)(void* listenComm, void** recvComm,
                                tcpx_ncclNetDeviceHandle_t** recvDevComm);
    tcpx_ncclResult_t (*regMr)(void* comm, void* data, size_t size, int type, void** mhandle);
    tcpx_ncclResult_t (*regMrDmaBuf)(void* comm, void* data, size_t size, int type, uint64_t offset,
                                     int fd, void** mhandle);
    tcpx_ncclResult_t (*deregMr)(void* comm, void* mhandle);
    tcpx_ncclResult_t (*isend)(void* sendComm, void* data, size_t size, int tag, void* mhandle,
                               void* phandle, void** request);
    tcpx_ncclResult_t (*irecv)(void* recvComm, int n, void** data, size_t* sizes, int* tags,
                               void** mhandles, void** phandles, void** request);
    tcpx_ncclResult_t (*iflush)(void* recvComm, int n, void** data, int* sizes, void** mhandles,
                                void** request);
    tcpx_ncclResult_t (*test)(void* request, int* done, int* sizes);
    tcpx_ncclResult_t (*closeSend)(void* sendComm);
    tcpx_ncclResult_t (*closeRecv)(void* recvComm);
    tcpx_ncclResult_t (*closeListen)(void* listenComm);
    tcpx_ncclResult_t (*getDeviceMr)(void* comm, void* mhandle, void** dptr_mhandle);
    tcpx_ncclResult_t (*irecvConsumed)(void* recvComm, int n, void* request);
    tcpx_ncclResult_t (*makeVDevice)(int* d, tcpx_ncclNetVDeviceProps_v9_t* props);
} tcpx_ncclNet_v10_t;

/* v11 and v12 differ only in their property and virtual-device types. */
#define TCPX_NCCLNET_V11_SHAPE(props_type, vdevice_type)                                           \
    struct {                                                                                       \
        const char* name;                                                                          \
        tcpx_ncclResult_t (*init)(void** ctx, uint64_t commId, tcpx_ncclNetCommConfig_t* config,   \
                                  tcpx_ncclDebugLogger_t logFunction,                              \
                                  tcpx_ncclProfilerCallback_t profFunction);                       \
        tcpx_ncclResult_t (*devices)(int* ndev);                                                   \
        tcpx_ncclResult_t (*getProperties)(int dev, props_type* props);                            \
        tcpx_ncclResult_t (*listen)(void* ctx, int dev, void* handle, void** listenComm);          \
        tcpx_ncclResult_t (*connect)(void* ctx, int dev, void* handle, void** sendComm,            \
                                     tcpx_ncclNetDeviceHandle_t** sendDevComm);                    \
        tcpx_ncclResult_t (*accept)(void* listenComm, void** recvComm,                             \
                                    tcpx_ncclNetDeviceHandle_t** recvDevComm);                     \
        tcpx_ncclResult_t (*regMr)(void* comm, void* data, size_t size, int type, void** mhandle); \
        tcpx_ncclResult_t (*regMrDmaBuf)(void* comm, void* data, size_t size, int type,            \
                                         uint64_t offset, int fd, void** mhandle);                 \
        tcpx_ncclResult_t (*deregMr)(void* comm, void* mhandle);                                   \
        tcpx_ncclResult_t (*isend)(void* sendComm, void* data, size_t size, int tag,               \
                                   void* mhandle, void* phandle, void** request);                  \
        tcpx_ncclResult_t (*irecv)(void* recvComm, int n, void** data, size_t* sizes, int* tags,   \
                                   void** mhandles, void** phandles, void** request);              \
        tcpx_ncclResult_t (*iflush)(void* recvComm, int n, void** data, int* sizes,                \
                                    void** mhandles, void** request);                              \
        tcpx_ncclResult_t (*test)(void* request, int* done, int* sizes);                           \
        tcpx_ncclResult_t (*closeSend)(void* sendComm);                                            \
        tcpx_ncclResult_t (*closeRecv)(void* recvComm);                                            \
        tcpx_ncclResult_t (*closeListen)(void* listenComm);                                        \
        tcpx_ncclResult_t (*getDeviceMr)(void* comm, void* mhandle, void** dptr_mhandle);          \
        tcpx_ncclResult_t (*irecvConsumed)(void* recvComm, int n, void* request);                  \
        tcpx_ncclResult_t (*makeVDevice)(int* d, vdevice_type* props);                             \
        tcpx_ncclResult_t (*finalize)(void* ctx);                                                  \
        tcpx_ncclResult_t (*setNetAttr)(void* ctx, tcpx_ncclNetAttr_t* netAttr);                   \
    }
typedef TCPX_NCCLNET_V11_SHAPE(tcpx_ncclNetProperties_v11_t,
                               tcpx_ncclNetVDeviceProps_v9_t) tcpx_ncclNet_v11_t;
typedef TCPX_NCCLNET_V11_SHAPE(tcpx_ncclNetProperties_v12_t,
                               tcpx_ncclNetVDeviceProps_v12_t) tcpx_ncclNet_v12_t;
#undef TCPX_NCCLNET_V11_SHAPE

#ifdef __cplusplus
} /* extern "C" */

static_assert(sizeof(tcpx_ncclNetCommConfig_t) == 4, "comm config is one int");
static_assert(sizeof(tcpx_ncclNetVDeviceProps_v9_t) == 20, "v9-v11 vProps: ndevs + 4 devices");
static_assert(sizeof(tcpx_ncclNetVDeviceProps_v12_t) == 36, "v12 vProps: ndevs + 8 devices");
static_assert(sizeof(tcpx_ncclNetAttr_t) == 44, "v11 net attributes");

static_assert(offsetof(tcpx_ncclNetProperties_v8_t, regIsGlobal) == 28, "v8: after ptrSupport");
static_assert(offsetof(tcpx_ncclNetProperties_v8_t, speed) == 32, "v8: fields after shift by 4");
static_assert(offsetof(tcpx_ncclNetProperties_v8_t, netDeviceVersion) == 56, "v8 layout");
static_assert(sizeof(tcpx_ncclNetProperties_v8_t) == 64, "v8 properties are 64 bytes");

static_assert(offsetof(tcpx_ncclNetProperties_v9_t, forceFlush) == 32, "v9 layout");
static_assert(offsetof(tcpx_ncclNetProperties_v9_t, speed) == 36, "v9 layout");
static_assert(offsetof(tcpx_ncclNetProperties_v9_t, vProps) == 64, "v9 layout");
static_assert(offsetof(tcpx_ncclNetProperties_v9_t, maxP2pBytes) == 88, "v9 layout (padded)");
static_assert(sizeof(tcpx_ncclNetProperties_v9_t) == 104, "v9/v10 properties are 104 bytes");

static_assert(offsetof(tcpx_ncclNetProperties_v11_t, maxMultiRequestSize) == 104, "v11 layout");
static_assert(sizeof(tcpx_ncclNetProperties_v11_t) == 112, "v11 properties are 112 bytes");

static_assert(offsetof(tcpx_ncclNetProperties_v12_t, maxP2pBytes) == 104, "v12 layout");
static_assert(offsetof(tcpx_ncclNetProperties_v12_t, maxMultiRequestSize) == 120, "v12 layout");
static_assert(offsetof(tcpx_ncclNetProperties_v12_t, planeId) == 126, "v12 layout");
static_assert(sizeof(tcpx_ncclNetProperties_v12_t) == 128, "v12 properties are 128 bytes");

static_assert(sizeof(tcpx_ncclNet_v8_t) == 19 * sizeof(void*), "v8 table has 19 members");
static_assert(sizeof(tcpx_ncclNet_v9_t) == 20 * sizeof(void*), "v9 adds makeVDevice");
static_assert(sizeof(tcpx_ncclNet_v10_t) == 20 * sizeof(void*), "v10 table has 20 members");
static_assert(sizeof(tcpx_ncclNet_v11_t) == 22 * sizeof(void*), "v11 adds finalize, setNetAttr");
static_assert(sizeof(tcpx_ncclNet_v12_t) == 22 * sizeof(void*), "v12 table has 22 members");
static_assert(offsetof(tcpx_ncclNet_v9_t, makeVDevice) == 19 * sizeof(void*), "v9 layout");
static_assert(offsetof(tcpx_ncclNet_v11_t, finalize) == 20 * sizeof(void*), "v11 layout");
#endif

#endif /* TCPX_NET_NCCLNET_NEWER_H_ */
