#include "common/random.h"

#include <sys/random.h>

#include <cerrno>
#include <cstring>

#include "common/status_util.h"
#include "common/strings.h"

namespace tcpx {

StatusOr<uint64_t> random_u64() {
    uint64_t value = 0;
    auto* p = reinterpret_cast<unsigned char*>(&value);
    size_t got = 0;
    while (got < sizeof(value)) {
        const ssize_t n = ::getrandom(p + got, sizeof(value) - got, 0);
        if (n < 0) {
            if (errno == EINTR) continue;
            return unavailable(strformat(
                "getrandom: %s: no random keys or nonces (a seccomp filter or a kernel without "
                "getrandom)",
                std::strerror(errno)));
        }
        got += static_cast<size_t>(n);
    }
    return value;
}

}  // namespace tcpx
