// ncclNetPlugin_v7: the core (nccl_core.cc) as it is.
#include "nccl_plugin.h"

extern "C" __attribute__((visibility("default"))) const tcpx_ncclNet_v7_t ncclNetPlugin_v7 =
    tcpx::nccl_plugin::core();
