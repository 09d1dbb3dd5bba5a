// A wakeup that one thread sleeps on (in poll/epoll, beside its other file descriptors) while
// other threads finish work for it: an eventfd, written only while the sleeper is about to sleep.
// Finishing work costs a fence and a load when nobody sleeps, so a transport can signal every
// completion without a system call per request.
//
// The sleeper:  arm(); look for finished work once more; if none, sleep on fd(); drain().
// A finisher:   publish the finished work (e.g. a release store of a request's state); notify().
// One of the two sees the other: either the sleeper's second look finds the work, or notify()
// finds the wakeup armed and makes fd() readable. No wakeup is lost between the look and the sleep.
#pragma once

#include <atomic>
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
    void arm() {
        armed_.store(true, std::memory_order_relaxed);
        // Orders the store above before the sleeper's reads of the work's state (paired with the
        // fence in notify()).
        std::atomic_thread_fence(std::memory_order_seq_cst);
    }

    // After finishing work, once its result is visible to the sleeper.
    void notify() {
        // Orders the finisher's store of the result before the load of armed_ below.
        std::atomic_thread_fence(std::memory_order_seq_cst);
        if (armed_.load(std::memory_order_relaxed) && armed_.exchange(false)) signal();
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

    Fd fd_;
    std::atomic<bool> armed_{false};
    std::atomic<uint64_t> signals_{0};
};

}  // namespace tcpx
