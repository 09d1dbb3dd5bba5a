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

// The progress thread's spin after work that left nothing in flight (PROGRESS_QUIET_SPIN): a
// quiet spell starts at the first pass that finds nothing to do and ends at the next that moves
// something. It is spun through for its first `spin_for` while most recent spells ended within
// that (a peer's requests arriving back to back), and slept through otherwise: once past
// `spin_for` (a timed wakeup in a long spell spins no more), while spells run longer (requests
// further apart than a spin would wait: the score turns it off, and back on when they come
// close again: a spell is scored whether it was spun through or slept through).
template <typename TimePoint, typename Duration>
class QuietSpin {
 public:
    QuietSpin(bool enabled, Duration spin_for) : enabled_(enabled), spin_for_(spin_for) {}

    // A pass moved something: ends the spell, if one was running, and scores it.
    void moved(TimePoint now) {
        if (!quiet_) return;
        score_.record(now - since_ < spin_for_);
        quiet_ = false;
    }
    // A pass found nothing to do with nothing in flight: starts a spell, if none is running.
    void quiet(TimePoint now) {
        if (quiet_) return;
        quiet_ = true;
        since_ = now;
    }
    // Something is in flight: not a quiet spell (the busy spin decides), and not scored.
    void busy() { quiet_ = false; }
    // Whether to poll again rather than sleep, in a running spell.
    bool spin(TimePoint now) const {
        return enabled_ && quiet_ && score_.pays() && now - since_ < spin_for_;
    }

 private:
    bool enabled_;
    Duration spin_for_;
    bool quiet_ = false;
    TimePoint since_{};
    SpinScore score_;
};

}  // namespace tcpx::engine
