// The user-visible transfers of an endpoint: a fixed capacity of slots, each id a slot index
// plus a generation (so a forgotten id is never mistaken for a new transfer). Generations start
// at a random value per table, so that an id of another endpoint (every endpoint hands out slot 1
// first) is unknown here rather than another transfer; a slot never handed out reads as failed,
// so such an id is reported unknown at once, never waited for.
//
// Threads: allocate/finish/take/set_owner/owner run under the engine's lock; state() takes no
// lock, so polling a transfer in flight costs two atomic loads and never contends with the
// progress engine.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>

#include "tcpx/endpoint.h"
#include "tcpx/status.h"

namespace tcpx::engine {

class XferTable {
 public:
    // `first_gen`: the generation of every slot's first transfer (0 is taken as 1).
    XferTable(size_t capacity, uint32_t first_gen);
    ~XferTable();

    // A new id in state kInProgress; RESOURCE_EXHAUSTED when every slot is in use.
    StatusOr<XferId> allocate();
    // Records the outcome (OK: done).
    void finish(XferId id, Status result);
    // No lock: kInProgress, kDone or kFailed; false when `id` is unknown or already taken.
    bool state(XferId id, XferState* state) const;
    // The same under the engine's lock, for an allocated id only: state() reads a slot never
    // handed out (or one handed out again, an id ahead of it) as a transfer that failed.
    bool allocated_state(XferId id, XferState* state) const;
    // Takes a finished transfer's outcome and frees its slot; INVALID_ARGUMENT (as a failed
    // transfer) for an unknown id.
    XferStatus take(XferId id);
    // The engine's record of a transfer in progress (what cancel() acts on), found by its id
    // without a search. set_owner() on an id in progress; owner() is null once the transfer has
    // finished (finish() forgets it: its record may be gone), for an unknown id, or if none was
    // set.
    void set_owner(XferId id, void* owner);
    void* owner(XferId id) const;
    size_t in_use() const { return in_use_; }
    // Slots ever handed out: in use at most, plus kReuseAfter.
    size_t slots_made() const { return high_; }

    // A freed slot is used again only once this many are free (or no new one may be made),
    // oldest first: a program that runs one transfer at a time goes round this many slots, so
    // its ids' 32-bit generations wrap after 2^32 x kReuseAfter transfers, not 2^32 (hours of
    // small transfers, when the slot just freed came back at once). Costs a few KiB.
    static constexpr size_t kReuseAfter = 256;

 private:
    static constexpr uint64_t kNone = ~uint64_t{0};
    struct Slot {
        std::atomic<uint32_t> gen{1};
        // Not in progress until allocated: a made-up id that names an unused slot is unknown.
        std::atomic<int> state{static_cast<int>(XferState::kFailed)};
        bool busy = false;
        Status result;
        uint64_t next_free = kNone;  // the free list's next slot, oldest first
        void* owner = nullptr;       // set_owner(), while in progress
    };
    // The slot of `id` while it is allocated (its generation), else null.
    Slot* busy_slot(XferId id) const;
    static constexpr size_t kBlock = 1024;

    Slot* slot(uint64_t index) const;
    static uint64_t index_of(XferId id) { return (id & 0xffffffffu) - 1; }
    static uint32_t gen_of(XferId id) { return static_cast<uint32_t>(id >> 32); }

    const size_t capacity_;
    const uint32_t first_gen_;
    std::unique_ptr<std::atomic<Slot*>[]> blocks_;  // allocated on demand, never moved
    size_t nblocks_;
    // Free slots, oldest first, as a list through the slots: take() never allocates (an id
    // reported is never lost to an allocation that failed).
    uint64_t free_head_ = kNone, free_tail_ = kNone;
    size_t free_count_ = 0;
    uint64_t high_ = 0;  // slots ever handed out
    size_t in_use_ = 0;
};

}  // namespace tcpx::engine
