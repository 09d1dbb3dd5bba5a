#include "common/cache_lines.h"

#include <atomic>
#include <cstdint>

#if defined(__x86_64__)
#include <cpuid.h>
#endif

namespace tcpx {

namespace {
std::atomic<uint64_t> written_back{0};
}  // namespace

uint64_t bytes_written_back() { return written_back.load(std::memory_order_relaxed); }

#if defined(__x86_64__)

namespace {

constexpr uintptr_t kLine = 64;

__attribute__((target("clwb"))) void write_back(const void* data, size_t len) {
    auto a = reinterpret_cast<uintptr_t>(data) & ~(kLine - 1);
    const uintptr_t end = reinterpret_cast<uintptr_t>(data) + len;
    for (; a < end; a += kLine) __builtin_ia32_clwb(reinterpret_cast<void*>(a));
}

bool has_clwb() {
    static const bool has = [] {
        unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
        // CPUID leaf 7, subleaf 0: EBX bit 24 is CLWB.
        return __get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx) != 0 && (ebx & (1u << 24)) != 0;
    }();
    return has;
}

}  // namespace

void write_back_lines(const void* data, size_t len) {
    if (len == 0) return;
    written_back.fetch_add(len, std::memory_order_relaxed);
    if (has_clwb()) write_back(data, len);
}

#else

void write_back_lines(const void*, size_t len) {
    written_back.fetch_add(len, std::memory_order_relaxed);
}

#endif

}  // namespace tcpx
