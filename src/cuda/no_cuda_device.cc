// The device layer of a build without the CUDA parts: no GPU, every pointer is host memory.
#include "common/status_util.h"
#include "cuda/device.h"

namespace tcpx::cuda {
namespace {

class NoDevice final : public Device {
 public:
    int count() override { return 0; }
    StatusOr<PointerInfo> classify(const void*, size_t) override { return PointerInfo{}; }
    uint64_t mapped_bytes(const void*, uint64_t) override { return 0; }
    uintptr_t mapped_host_address(const void*) override { return 0; }
    Status copy(int, void*, const void*, size_t) override {
        return unimplemented("GPU memory: this build of tcpx-p2p has no CUDA support");
    }
    StatusOr<std::unique_ptr<CopyRing>> make_ring(int, size_t, int, int) override {
        return unimplemented("GPU memory: this build of tcpx-p2p has no CUDA support");
    }
    Status select(int, uintptr_t*) override {
        return unimplemented("GPU memory: this build of tcpx-p2p has no CUDA support");
    }
    void restore(uintptr_t) override {}
    std::string pci_bus_id(int) override { return ""; }
};

}  // namespace

Device& runtime_device() {
    static NoDevice d;
    return d;
}

}  // namespace tcpx::cuda
