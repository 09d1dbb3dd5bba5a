// Plugins whose init takes the process down, as Google's TCPX plugin's does on many failure
// paths: built once per TCPX_TEST_CRASH_MODE — 1 calls exit(1), 2 writes through a null pointer,
// 3 never returns, 4 calls exit(0) (as if all were well). Each logs a dozen numbered lines first,
// so a caller can show the last ones.
#include <unistd.h>

#include <cstdlib>

#include "net/ncclnet_v7.h"

namespace {

tcpx_ncclResult_t crash_init(tcpx_ncclDebugLogger_t logger) {
    for (int i = 0; i < 12; ++i) {
        if (logger != nullptr) {
            logger(TCPX_NCCL_LOG_WARN, TCPX_NCCL_NET_FLAG, __FILE__, __LINE__,
                   "crash-net: step %d of init", i);
        }
    }
#if TCPX_TEST_CRASH_MODE == 1
    std::exit(1);
#elif TCPX_TEST_CRASH_MODE == 4
    std::exit(0);
#elif TCPX_TEST_CRASH_MODE == 2
    // A null pointer the compiler cannot see is one.
    volatile int* p = reinterpret_cast<volatile int*>(std::getenv("TCPX_TEST_NO_SUCH_VARIABLE"));
    *p = 1;
    return tcpx_ncclInternalError;
#else
    for (;;) ::pause();
#endif
}

tcpx_ncclResult_t crash_devices(int* ndev) {
    *ndev = 1;
    return tcpx_ncclSuccess;
}

constexpr tcpx_ncclResult_t kNever = tcpx_ncclInternalError;

}  // namespace

// Only init and devices are ever reached; the rest are never called.
extern "C" __attribute__((visibility("default"))) const tcpx_ncclNet_v7_t ncclNetPlugin_v7 = {
    "tcpx-test-crash",
    crash_init,
    crash_devices,
    [](int, tcpx_ncclNetProperties_v7_t*) { return kNever; },
    [](int, void*, void**) { return kNever; },
    [](int, void*, void**, tcpx_ncclNetDeviceHandle_v7_t**) { return kNever; },
    [](void*, void**, tcpx_ncclNetDeviceHandle_v7_t**) { return kNever; },
    [](void*, void*, int, int, void**) { return kNever; },
    nullptr,
    [](void*, void*) { return kNever; },
    [](void*, void*, int, int, void*, void**) { return kNever; },
    [](void*, int, void**, int*, int*, void**, void**) { return kNever; },
    [](void*, int, void**, int*, void**, void**) { return kNever; },
    [](void*, int*, int*) { return kNever; },
    [](void*) { return kNever; },
    [](void*) { return kNever; },
    [](void*) { return kNever; },
    nullptr,
    nullptr,
};
