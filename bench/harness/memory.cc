#include "bench/harness/memory.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <utility>
#include <vector>

#include "common/splitmix.h"
#include "common/status_util.h"
#include "common/strings.h"
#include "cuda/device.h"
#ifdef TCPX_P2P_HAVE_CUDA
#include "bench/harness/gpu_alloc.h"
#endif

namespace tcpx::bench {
namespace {

constexpr uint64_t kAlign = 4096;

uint64_t round_up(uint64_t len) {
    return (std::max<uint64_t>(len, 1) + kAlign - 1) / kAlign * kAlign;
}

}  // namespace

const char* mem_name(MemType type) { return type == MemType::kVram ? "vram" : "host"; }

StatusOr<int> usable_gpus() {
#ifdef TCPX_P2P_HAVE_CUDA
    const int n = cuda::device_count();
    if (n <= 0) return unavailable("no usable GPU (the CUDA runtime finds no driver or no device)");
    return n;
#else
    return unimplemented(
        "this build of tcpx-p2p has no CUDA support (it was configured without its CUDA parts: "
        "no nvcc, or TCPX_P2P_WITH_CUDA=OFF)");
#endif
}

Buffer::Buffer(Buffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)),
      len_(std::exchange(other.len_, 0)),
      base_(std::exchange(other.base_, nullptr)),
      gpu_(std::exchange(other.gpu_, -1)) {}

Buffer& Buffer::operator=(Buffer&& other) noexcept {
    if (this != &other) {
        release();
        data_ = std::exchange(other.data_, nullptr);
        len_ = std::exchange(other.len_, 0);
        base_ = std::exchange(other.base_, nullptr);
        gpu_ = std::exchange(other.gpu_, -1);
    }
    return *this;
}

void Buffer::release() {
#ifdef TCPX_P2P_HAVE_CUDA
    if (gpu_ >= 0) gpu_free(gpu_, base_);
#endif
    if (gpu_ < 0) std::free(base_);
    base_ = nullptr;
    data_ = nullptr;
    len_ = 0;
    gpu_ = -1;
}

StatusOr<Buffer> Buffer::allocate(MemType type, int gpu, uint64_t len, uint8_t fill) {
    const uint64_t rounded = round_up(len);
    Buffer b;
    if (type == MemType::kHost) {
        b.base_ = std::aligned_alloc(kAlign, rounded);
        if (b.base_ == nullptr) {
            return resource_exhausted(
                strformat("allocating %s of host memory", format_bytes(len).c_str()));
        }
        b.data_ = static_cast<uint8_t*>(b.base_);
        b.len_ = len;
        std::memset(b.data_, fill, rounded);  // touched: no page faults while measuring
        return b;
    }
#ifdef TCPX_P2P_HAVE_CUDA
    // cudaMalloc aligns to at least 256 bytes; TCPX registers GPU memory in 4 KiB pages.
    TCPX_ASSIGN_OR_RETURN(b.base_, gpu_malloc(gpu, rounded + kAlign));
    b.gpu_ = gpu;
    const uintptr_t at = reinterpret_cast<uintptr_t>(b.base_);
    b.data_ = static_cast<uint8_t*>(b.base_) + (kAlign - at % kAlign) % kAlign;
    b.len_ = len;
    TCPX_RETURN_IF_ERROR(gpu_memset(gpu, b.data_, fill, rounded));
    return b;
#else
    (void)gpu;
    TCPX_RETURN_IF_ERROR(usable_gpus().status());
    return unimplemented("GPU memory");
#endif
}

Status Buffer::host_view(uint64_t off, uint64_t len, bool load, bool store,
                         const std::function<Status(uint8_t*)>& fn) const {
    if (off > len_ || len > len_ - off) return out_of_range("outside the buffer");
    // No bytes, nothing to run: an empty buffer has no memory at all (data_ is null), and a
    // peer's commands may name one (found by fuzz_bench_target).
    if (len == 0) return Status();
    if (gpu_ < 0) return fn(data_ + off);
    std::vector<uint8_t> copy(len);
    if (load) {
        TCPX_RETURN_IF_ERROR(cuda::device()
                                 .copy(gpu_, copy.data(), data_ + off, len)
                                 .with_context(strformat("reading GPU %d's memory", gpu_)));
    }
    TCPX_RETURN_IF_ERROR(fn(copy.data()));
    if (!store) return Status();
    return cuda::device()
        .copy(gpu_, data_ + off, copy.data(), len)
        .with_context(strformat("writing GPU %d's memory", gpu_));
}

// --- patterns for --verify ---------------------------------------------------------------------

namespace {

uint8_t pattern_byte(uint64_t seed, uint64_t i) {
    const uint64_t word = splitmix64(seed ^ (i / 8));
    return static_cast<uint8_t>(word >> (8 * (i % 8)));
}

}  // namespace

uint64_t pattern_seed(uint64_t run, int peer) {
    return splitmix64(run * 0x100000001b3ULL + static_cast<uint64_t>(peer));
}

void fill_pattern(uint8_t* p, uint64_t len, uint64_t seed) {
    uint64_t i = 0;
    for (; i + 8 <= len; i += 8) {
        const uint64_t word = splitmix64(seed ^ (i / 8));
        std::memcpy(p + i, &word, 8);
    }
    for (; i < len; ++i) p[i] = pattern_byte(seed, i);
}

Status check_pattern(const uint8_t* p, uint64_t len, uint64_t seed, const std::string& what) {
    uint64_t i = 0;
    for (; i + 8 <= len; i += 8) {
        const uint64_t word = splitmix64(seed ^ (i / 8));
        if (std::memcmp(p + i, &word, 8) != 0) break;
    }
    for (; i < len; ++i) {
        const uint8_t want = pattern_byte(seed, i);
        if (p[i] != want) {
            return internal_error(strformat("%s: byte %llu of %llu is 0x%02x, expected 0x%02x%s",
                                            what.c_str(), static_cast<unsigned long long>(i),
                                            static_cast<unsigned long long>(len), p[i], want,
                                            p[i] == kPoison ? " (never written)" : ""));
        }
    }
    return Status();
}

Status prepare_bytes(const Buffer& b, uint64_t off, uint64_t len, bool source, uint64_t seed) {
    return b.host_view(off, len, /*load=*/false, /*store=*/true, [&](uint8_t* p) {
        if (source) {
            fill_pattern(p, len, seed);
        } else {
            std::memset(p, kPoison, len);
        }
        return Status();
    });
}

Status check_bytes(const Buffer& b, uint64_t off, uint64_t len, uint64_t seed,
                   const std::string& what) {
    return b.host_view(off, len, /*load=*/true, /*store=*/false,
                       [&](uint8_t* p) { return check_pattern(p, len, seed, what); });
}

}  // namespace tcpx::bench
