#include "tests/support/test_buffer.h"

#include <gtest/gtest.h>
#include <sys/mman.h>

#include <cstring>

#include "tests/support/host_device.h"

#if TCPX_P2P_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace tcpx::testing {
namespace {

class HostBuffer : public TestBuffer {
 public:
    explicit HostBuffer(size_t size) : size_(size), storage_(size + 2 * kCanary, kCanaryByte) {
        std::memset(data(), 0, size);
    }
    uint8_t* data() override { return storage_.data() + kCanary; }
    size_t size() const override { return size_; }
    bool on_device() const override { return false; }
    void upload(uint64_t off, const void* src, size_t len) override {
        ASSERT_LE(off + len, size_);
        if (len > 0) std::memcpy(data() + off, src, len);
    }
    void download(uint64_t off, void* dst, size_t len) override {
        ASSERT_LE(off + len, size_);
        if (len > 0) std::memcpy(dst, data() + off, len);
    }
    bool canaries_intact() override {
        for (size_t i = 0; i < kCanary; ++i) {
            if (storage_[i] != kCanaryByte || storage_[kCanary + size_ + i] != kCanaryByte) {
                return false;
            }
        }
        return true;
    }

 private:
    size_t size_;
    std::vector<uint8_t> storage_;
};

// Host memory that the emulation calls GPU memory.
class EmulatedDeviceBuffer final : public HostBuffer {
 public:
    EmulatedDeviceBuffer(size_t size, int gpu, HostDevice* emu) : HostBuffer(size), emu_(emu) {
        emu_->declare(data(), size, gpu);
    }
    ~EmulatedDeviceBuffer() override { emu_->forget(data()); }
    bool on_device() const override { return true; }

 private:
    HostDevice* emu_;
};

#if TCPX_P2P_HAVE_CUDA
class CudaBuffer final : public TestBuffer {
 public:
    static std::unique_ptr<TestBuffer> create(size_t size, int gpu) {
        if (cudaSetDevice(gpu) != cudaSuccess) return nullptr;
        void* p = nullptr;
        if (cudaMalloc(&p, size + 2 * kCanary) != cudaSuccess) return nullptr;
        auto b = std::unique_ptr<CudaBuffer>(new CudaBuffer(static_cast<uint8_t*>(p), size, gpu));
        if (cudaMemset(p, kCanaryByte, size + 2 * kCanary) != cudaSuccess ||
            cudaMemset(b->data(), 0, size) != cudaSuccess) {
            return nullptr;
        }
        return b;
    }
    ~CudaBuffer() override {
        cudaSetDevice(gpu_);
        cudaFree(base_);
    }
    uint8_t* data() override { return base_ + kCanary; }
    size_t size() const override { return size_; }
    bool on_device() const override { return true; }
    void upload(uint64_t off, const void* src, size_t len) override {
        ASSERT_LE(off + len, size_);
        ASSERT_EQ(cudaMemcpy(data() + off, src, len, cudaMemcpyHostToDevice), cudaSuccess);
        // From pageable memory cudaMemcpy may return before the bytes have landed, and the
        // engine's copies run on a non-blocking stream, which does not wait for it: without this
        // a test's "zero the target" could land after the engine's data.
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    }
    void download(uint64_t off, void* dst, size_t len) override {
        ASSERT_LE(off + len, size_);
        ASSERT_EQ(cudaMemcpy(dst, data() + off, len, cudaMemcpyDeviceToHost), cudaSuccess);
    }
    bool canaries_intact() override {
        std::vector<uint8_t> lo(kCanary), hi(kCanary);
        if (cudaMemcpy(lo.data(), base_, kCanary, cudaMemcpyDeviceToHost) != cudaSuccess ||
            cudaMemcpy(hi.data(), data() + size_, kCanary, cudaMemcpyDeviceToHost) != cudaSuccess) {
            return false;
        }
        for (size_t i = 0; i < kCanary; ++i) {
            if (lo[i] != kCanaryByte || hi[i] != kCanaryByte) return false;
        }
        return true;
    }

 private:
    CudaBuffer(uint8_t* base, size_t size, int gpu) : base_(base), size_(size), gpu_(gpu) {}
    uint8_t* base_;
    size_t size_;
    int gpu_;
};
#endif

}  // namespace

std::unique_ptr<TestBuffer> host_buffer(size_t size) { return std::make_unique<HostBuffer>(size); }

LazyBuffer::LazyBuffer(size_t size) : size_(size) {
    void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    data_ = p == MAP_FAILED ? nullptr : static_cast<uint8_t*>(p);
}

LazyBuffer::~LazyBuffer() {
    if (data_ != nullptr) ::munmap(data_, size_);
}

std::unique_ptr<TestBuffer> device_buffer(size_t size, int gpu, HostDevice* emu) {
    if (emu != nullptr) return std::make_unique<EmulatedDeviceBuffer>(size, gpu, emu);
#if TCPX_P2P_HAVE_CUDA
    return CudaBuffer::create(size, gpu);
#else
    return nullptr;
#endif
}

}  // namespace tcpx::testing
