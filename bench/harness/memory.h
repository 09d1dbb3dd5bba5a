// Memory of the benchmarks' registered regions: page-aligned host memory, or GPU memory
// (cudaMalloc, `--mem vram`), host views of either, and the bytes --verify puts there and checks:
// one set of helpers for every bench (engine, NIXL, the KV workload).
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "tcpx/status.h"

namespace tcpx::bench {

enum class MemType { kHost, kVram };

// "host" or "vram", as on the command line.
const char* mem_name(MemType type);

// How many GPUs `--mem vram` can use; an error saying why there are none (a build without the
// CUDA parts, no driver or no device), never 0.
StatusOr<int> usable_gpus();

// `len` bytes (4 KiB-aligned, so that any transport may register them) of host memory or of one
// GPU's memory, freed with the object.
class Buffer {
 public:
    Buffer() = default;
    Buffer(const Buffer&) = delete;
    Buffer& operator=(const Buffer&) = delete;
    Buffer(Buffer&& other) noexcept;
    Buffer& operator=(Buffer&& other) noexcept;
    ~Buffer() { release(); }

    // Host memory (kHost; `gpu` ignored) or memory of GPU `gpu` (kVram), every byte `fill`.
    static StatusOr<Buffer> allocate(MemType type, int gpu, uint64_t len, uint8_t fill);

    uint8_t* data() const { return data_; }
    uint64_t size() const { return len_; }

    // Runs fn on a host view of [off, off + len): the memory itself when it is host memory;
    // otherwise a host copy, loaded from the GPU before fn when `load` and stored back after it
    // when `store` (cuda::device().copy()). A view of no bytes runs nothing.
    Status host_view(uint64_t off, uint64_t len, bool load, bool store,
                     const std::function<Status(uint8_t*)>& fn) const;

 private:
    void release();

    uint8_t* data_ = nullptr;  // 4 KiB-aligned, inside base_
    uint64_t len_ = 0;
    void* base_ = nullptr;  // what was allocated
    int gpu_ = -1;          // the GPU of device memory; -1 for host memory
};

// --- patterns for --verify ---------------------------------------------------------------------
//
// A destination is poisoned before the transfer that should overwrite it, the source filled with
// a pattern unique to its seed; afterwards the destination must hold the pattern.

// What --verify writes over a destination before the transfer that should overwrite it.
constexpr uint8_t kPoison = 0xee;

// A seed for measurement `run` and peer (or slot) `peer`.
uint64_t pattern_seed(uint64_t run, int peer);
void fill_pattern(uint8_t* p, uint64_t len, uint64_t seed);
// OK, or which byte differs (kInternal, "<what>: byte ...").
Status check_pattern(const uint8_t* p, uint64_t len, uint64_t seed, const std::string& what);

// [off, off + len) of `b`: the pattern `seed` (source), or poisoned (destination).
Status prepare_bytes(const Buffer& b, uint64_t off, uint64_t len, bool source, uint64_t seed);
// OK when [off, off + len) holds the pattern `seed`; else where it differs (kInternal).
Status check_bytes(const Buffer& b, uint64_t off, uint64_t len, uint64_t seed,
                   const std::string& what);

}  // namespace tcpx::bench
