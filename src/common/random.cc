#include "common/random.h"

#include <sys/random.h>

#include <atomic>
#include <cerrno>
#include <chrono>

namespace tcpx {

uint64_t random_u64() {
    uint64_t value = 0;
    auto* p = reinterpret_cast<unsigned char*>(&value);
    size_t got = 0;
    while (got < sizeof(value)) {
        const ssize_t n = ::getrandom(p + got, sizeof(value) - got, 0);
        if (n < 0) {
            if (errno == EINTR) continue;
            break;
        }
        got += static_cast<size_t>(n);
    }
    if (got < sizeof(value)) {
        // getrandom is unavailable (very old kernel or seccomp): mix a counter and the clock.
        // Nonces then remain unique per process, though no longer unpredictable.
        static std::atomic<uint64_t> counter{0};
        value = static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
        value ^= (counter.fetch_add(1) + 0x9e3779b97f4a7c15ULL) * 0xbf58476d1ce4e5b9ULL;
    }
    return value;
}

}  // namespace tcpx
