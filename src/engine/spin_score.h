// Whether spinning for work pays: the progress thread's poll before it sleeps, and wait()'s.
// A spin pays while the work it waits for comes soon (a fast wire); on a wire slower than the
// machine each wait is long, and a spin before every sleep only burns the core. The score is an
// exponential average over about kHistory recent waits of whether each was short: a count, so
// that one long stall (a loaded machine) does not turn the spin off.
#pragma once

#include <atomic>

namespace tcpx::engine {

class SpinScore {
 public:
    // Whether most recent waits were short (so at first).
    bool pays() const { return score_.load(std::memory_order_relaxed) >= kHistory * kOne / 2; }
    // One wait ended, short or not. Callers racing each other may lose an update now and then,
    // which the average shrugs off.
    void record(bool short_wait) {
        const int s = score_.load(std::memory_order_relaxed);
        score_.store(s + (short_wait ? kOne : 0) - s / kHistory, std::memory_order_relaxed);
    }

    static constexpr int kHistory = 8;

 private:
    static constexpr int kOne =
        128;  // one short wait's weight: the score runs 0 to kHistory of them
    std::atomic<int> score_{kHistory * kOne};
};

}  // namespace tcpx::engine
