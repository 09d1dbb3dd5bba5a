// An emulation of the GPU layer (cuda::Device) that keeps "device" memory in host memory, so the
// engine's device paths (staging ring, unpack) run in CI without a GPU: the same engine code, with
// copies and unpacks carried out on the CPU.
//
// It is stricter than CUDA where that finds bugs: ring work runs only when the engine polls
// ready() a second time (or synchronizes), in stream order, so a buffer used before its copy
// finished shows up as wrong bytes; every copy must stay inside memory the test declared as device
// memory (or the ring's own slots), or it is refused with an error that fails the transfer.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "cuda/device.h"

namespace tcpx::testing {

class HostDevice final : public cuda::Device {
 public:
    explicit HostDevice(int gpus = 2) : gpus_(gpus) {}

    // Declares [ptr, ptr + len) as memory of GPU `device`, until forget(ptr).
    void declare(const void* ptr, size_t len, int device);
    void forget(const void* ptr);

    int count() override { return gpus_; }
    StatusOr<cuda::PointerInfo> classify(const void* ptr, size_t len) override;
    uint64_t mapped_bytes(const void* ptr, uint64_t at_most) override;
    // Host memory is its own "mapped" address here (as under CUDA's unified addressing).
    bool host_only() const override { return true; }
    uintptr_t mapped_host_address(const void* host) override {
        return reinterpret_cast<uintptr_t>(host);
    }
    Status copy(int device, void* dst, const void* src, size_t len) override;
    // Runs `hook` at the start of every copy() (a test holds a copy in flight this way); empty:
    // none.
    void set_copy_hook(std::function<void()> hook);
    StatusOr<std::unique_ptr<cuda::CopyRing>> make_ring(int device, size_t slot_bytes, int slots,
                                                        int records) override;
    // The calling thread's "current GPU" (-1: none, as in a thread that never used one), which
    // select() sets and restore() puts back, so that tests can see what the engine leaves
    // current in a caller's thread.
    Status select(int device, uintptr_t* previous) override;
    void restore(uintptr_t previous) override;
    static int current();
    static void set_current(int device);
    // Empty unless the test gave the GPUs bus ids (set_pci_bus_ids).
    std::string pci_bus_id(int device) override;
    void set_pci_bus_ids(std::vector<std::string> ids);

    // Whether [ptr, ptr + len) lies inside one declared region.
    bool is_device_range(const void* ptr, size_t len);
    // Counters, for tests to prove which path ran.
    int rings_made() const;
    uint64_t ring_copies() const;
    uint64_t unpacks() const;
    // Unpacks that went straight into a chunk's pieces (CopyRing::unpack_scatter, one list).
    uint64_t direct_unpacks() const;
    void count_ring_work(bool unpack);
    void count_direct_unpack();
    // While held, ring work runs nowhere (as a GPU's behind the application's kernels): ready()
    // says not yet, idle() says busy and synchronize() waits for the release.
    void hold_ring_work(bool hold);
    bool ring_work_held() const;
    void wait_ring_work_released();

 private:
    struct Region {
        size_t len;
        int device;
    };
    const int gpus_;
    mutable std::mutex mu_;
    std::map<uintptr_t, Region> regions_;  // by start address
    int rings_made_ = 0;
    uint64_t ring_copies_ = 0;
    uint64_t unpacks_ = 0;
    uint64_t direct_unpacks_ = 0;
    std::vector<std::string> pci_bus_ids_;
    std::function<void()> copy_hook_;
    bool ring_work_held_ = false;  // (under mu_)
    std::condition_variable released_;
};

// Installs a HostDevice for its lifetime (create it before any endpoint, destroy it after).
class ScopedHostDevice {
 public:
    explicit ScopedHostDevice(int gpus = 2);
    ~ScopedHostDevice();
    ScopedHostDevice(const ScopedHostDevice&) = delete;
    ScopedHostDevice& operator=(const ScopedHostDevice&) = delete;
    HostDevice* operator->() { return &device_; }
    HostDevice& get() { return device_; }

 private:
    HostDevice device_;
};

}  // namespace tcpx::testing
