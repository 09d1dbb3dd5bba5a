#include "common/wakeup.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "common/status_util.h"

namespace tcpx {

StatusOr<std::unique_ptr<Wakeup>> Wakeup::create() {
    Fd fd(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
    if (!fd.valid()) return errno_status(errno, "eventfd");
    return std::unique_ptr<Wakeup>(new Wakeup(std::move(fd)));
}

void Wakeup::signal() {
    const uint64_t one = 1;
    // Cannot fail in a way that matters: EAGAIN only when the counter is near 2^64 (it is
    // already readable then).
    (void)!::write(fd_.get(), &one, sizeof(one));
    signals_.fetch_add(1, std::memory_order_relaxed);
}

void Wakeup::drain() {
    // Not disarming: the write drained may be a stale one (work the sleeper already took), made
    // by a notify() that found an earlier arm(), while the arm() made since is still live.
    uint64_t value;
    while (::read(fd_.get(), &value, sizeof(value)) > 0) {
    }
}

}  // namespace tcpx
