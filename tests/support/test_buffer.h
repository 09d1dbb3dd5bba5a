// Buffers for transfer tests in host or GPU memory, with canaries on both sides of the usable
// part. GPU memory is real (cudaMalloc) or emulated: host memory declared to a HostDevice. Tests
// read and write them only through upload()/download(), so one test body runs on either.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

namespace tcpx::testing {

class HostDevice;

class TestBuffer {
 public:
    static constexpr size_t kCanary = 4096;
    static constexpr uint8_t kCanaryByte = 0xa5;
    virtual ~TestBuffer() = default;
    // The usable part: what a test registers. Device memory for device buffers.
    virtual uint8_t* data() = 0;
    virtual size_t size() const = 0;
    virtual bool on_device() const = 0;
    virtual void upload(uint64_t off, const void* src, size_t len) = 0;
    virtual void download(uint64_t off, void* dst, size_t len) = 0;
    std::vector<uint8_t> download(uint64_t off, size_t len) {
        std::vector<uint8_t> v(len);
        download(off, v.data(), len);
        return v;
    }
    // True when no byte around the usable part changed.
    virtual bool canaries_intact() = 0;
};

std::unique_ptr<TestBuffer> host_buffer(size_t size);

// Host memory whose pages cost nothing until touched: an anonymous mapping, reading as zeros.
// For the big buffers of tests that kill a peer mid-transfer, where only the first part is ever
// touched (a zero-filled 1 GiB vector took seconds of page faults, ten times that on a busy
// 2-core CI machine). data() is null when the mapping failed.
class LazyBuffer {
 public:
    explicit LazyBuffer(size_t size);
    ~LazyBuffer();
    LazyBuffer(const LazyBuffer&) = delete;
    LazyBuffer& operator=(const LazyBuffer&) = delete;
    uint8_t* data() const { return data_; }

 private:
    size_t size_;
    uint8_t* data_;
};
// GPU memory of `gpu`: emulated when `emu` is given, else real (null when there is no CUDA).
std::unique_ptr<TestBuffer> device_buffer(size_t size, int gpu, HostDevice* emu);

}  // namespace tcpx::testing
