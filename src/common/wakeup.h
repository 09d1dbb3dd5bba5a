// A wakeup that one thread sleeps on (in poll/epoll, beside its other file descriptors) while
// other threads finish work for it: an eventfd, written only while the sleeper is about to sleep,
// so that a transport can signal every completion without a system call per request.
//
// The sleeper:  arm(); look for finished work once more; if none, sleep on fd(); drain().
// A finisher:   publish the finished work (e.g. a release store of a request's state); notify().
// One of the two sees the other: either the sleeper's second look finds the work, or notify()
// finds the wakeup armed and makes fd() readable. No wakeup is lost between the look and the sleep.
// Finishing work costs one atomic add when nobody sleeps (no system call).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>

#include "common/socket.h"
#include "tcpx/status.h"

namespace tcpx {

class Wakeup {
 public:
    // A non-blocking eventfd; an error where the process has no file descriptors left.
    static StatusOr<std::unique_ptr<Wakeup>> create();

    // Readable after a notify() that found the wakeup armed, until drain().
    int fd() const { return fd_.get(); }

    // Before the sleeper's last look for finished work.
    void arm() { word_.fetch_or(kArmed, std::memory_order_acq_rel); }

    // After finishing work, once its result is published (a release store, say).
    void notify() {
        // Every notify() and arm() is a read-modify-write of word_, so they are totally ordered:
        // a notify() ordered after the arm() sees kArmed and signals; one ordered before it is
        // read by the arm() (acquire of this release), so the sleeper's look that follows sees
        // the work published before it. Atomic read-modify-writes rather than fences, which
        // ThreadSanitizer cannot follow.
        const uint64_t old = word_.fetch_add(kCount, std::memory_order_acq_rel);
        if ((old & kArmed) != 0 &&
            (word_.fetch_and(~kArmed, std::memory_order_acq_rel) & kArmed) != 0) {
            signal();
        }
    }

    // After sleeping (or on finding fd() readable): makes fd() unreadable again. Only the
    // sleeper drains; the wakeup may stay armed (a later notify() then writes once more, a
    // spurious wakeup at worst).
    void drain();

    // notify() calls that wrote the eventfd (the others cost no system call); for tests.
    uint64_t signals() const { return signals_.load(std::memory_order_relaxed); }

 private:
    explicit Wakeup(Fd fd) : fd_(std::move(fd)) {}
    void signal();

    static constexpr uint64_t kArmed = 1;  // bit 0; the bits above count notify() calls
    static constexpr uint64_t kCount = 2;
    Fd fd_;
    std::atomic<uint64_t> word_{0};
    std::atomic<uint64_t> signals_{0};
};

}  // namespace tcpx
