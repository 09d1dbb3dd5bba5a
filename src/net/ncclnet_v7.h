/* The ncclNet v7 plugin ABI, declared from the facts in shared/reference/ncclnet-v7.md.
 *
 * Names carry a tcpx_ prefix so this header can sit beside NCCL's own in one translation unit;
 * the layout (member order, types, sizes) is v7's exactly, checked by the static assertions at the
 * end and by tests that drive tables through it. This is the only file that knows the v7 layout:
 * the rest of the code speaks net::Net. */
#ifndef TCPX_NET_NCCLNET_V7_H_
#define TCPX_NET_NCCLNET_V7_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    tcpx_ncclSuccess = 0,
    tcpx_ncclUnhandledCudaError = 1,
    tcpx_ncclSystemError = 2,
    tcpx_ncclInternalError = 3,
    tcpx_ncclInvalidArgument = 4,
    tcpx_ncclInvalidUsage = 5,
    tcpx_ncclRemoteError = 6,
    tcpx_ncclInProgress = 7,
} tcpx_ncclResult_t;

/* NCCL's debug levels and the subsystem flag of network messages. */
enum {
    TCPX_NCCL_LOG_NONE = 0,
    TCPX_NCCL_LOG_VERSION = 1,
    TCPX_NCCL_LOG_WARN = 2,
    TCPX_NCCL_LOG_INFO = 3,
    TCPX_NCCL_LOG_ABORT = 4,
    TCPX_NCCL_LOG_TRACE = 5,
};
#define TCPX_NCCL_NET_FLAG 0x10

typedef void (*tcpx_ncclDebugLogger_t)(int level, unsigned long flags, const char* file, int line,
                                       const char* fmt, ...);

#define TCPX_NCCL_NET_HANDLE_MAXSIZE 128
#define TCPX_NCCL_PTR_HOST 0x1
#define TCPX_NCCL_PTR_CUDA 0x2
#define TCPX_NCCL_PTR_DMABUF 0x4
#define TCPX_NCCL_NET_DEVICE_HOST 0
#define TCPX_NCCL_NET_DEVICE_UNPACK 1

typedef struct {
    char* name;
    char* pciPath;
    uint64_t guid;
    int ptrSupport;
    int speed;
    int port;
    float latency;
    int maxComms;
    int maxRecvs;
    int netDeviceType;
    int netDeviceVersion;
} tcpx_ncclNetProperties_v7_t;

typedef struct {
    int netDeviceType;
    int netDeviceVersion;
    void* handle;
    size_t size;
    int needsProxyProgress;
} tcpx_ncclNetDeviceHandle_v7_t;

typedef struct {
    const char* name;
    tcpx_ncclResult_t (*init)(tcpx_ncclDebugLogger_t logFunction);
    tcpx_ncclResult_t (*devices)(int* ndev);
    tcpx_ncclResult_t (*getProperties)(int dev, tcpx_ncclNetProperties_v7_t* props);
    tcpx_ncclResult_t (*listen)(int dev, void* handle, void** listenComm);
    tcpx_ncclResult_t (*connect)(int dev, void* handle, void** sendComm,
                                 tcpx_ncclNetDeviceHandle_v7_t** sendDevComm);
    tcpx_ncclResult_t (*accept)(void* listenComm, void** recvComm,
                                tcpx_ncclNetDeviceHandle_v7_t** recvDevComm);
    tcpx_ncclResult_t (*regMr)(void* comm, void* data, int size, int type, void** mhandle);
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
} tcpx_ncclNet_v7_t;

#ifdef __cplusplus
} /* extern "C" */

static_assert(sizeof(tcpx_ncclNetProperties_v7_t) == 56, "v7 properties are 56 bytes");
static_assert(sizeof(tcpx_ncclNetDeviceHandle_v7_t) == 32, "v7 device handle is 32 bytes");
static_assert(sizeof(tcpx_ncclNet_v7_t) == 19 * sizeof(void*), "v7 table has 19 members");
#endif

#endif /* TCPX_NET_NCCLNET_V7_H_ */
