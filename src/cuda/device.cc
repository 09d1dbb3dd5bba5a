#include "cuda/device.h"

#include <atomic>

namespace tcpx::cuda {

// Defined by cuda_device.cc (CUDA builds) or no_cuda_device.cc.
Device& runtime_device();

namespace {
std::atomic<Device*> g_override{nullptr};
}  // namespace

Device& device() {
    Device* d = g_override.load(std::memory_order_acquire);
    return d != nullptr ? *d : runtime_device();
}

void set_device_for_testing(Device* d) { g_override.store(d, std::memory_order_release); }

}  // namespace tcpx::cuda
