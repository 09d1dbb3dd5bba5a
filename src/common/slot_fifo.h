// Slots taken and given back in FIFO order: the order in which a channel's requests complete.
// With an arena, each slot also holds a variable-sized allocation of it, placed right after the
// previous one and wrapping round, so that small chunks hold only the bytes they need (a
// staging buffer of 16 MiB takes sixteen 1 MiB chunks as well as four of 4 MiB). Used for the
// staging buffers of a channel (host slots, GPU copy rings).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace tcpx {

class SlotFifo {
 public:
    // `slots` records; `arena` bytes to allocate from (0: records only).
    explicit SlotFifo(int slots, uint64_t arena = 0)
        : slots_(slots),
          arena_(arena),
          off_(static_cast<size_t>(slots), 0),
          len_(static_cast<size_t>(slots), 0) {}

    int slots() const { return slots_; }
    uint64_t arena() const { return arena_; }
    // A record is free, and with an arena, room for `len` bytes.
    bool has_free(uint64_t len = 0) const {
        return used_ < slots_ && (arena_ == 0 || place(len) != kNone);
    }
    int in_use() const { return used_; }
    // The slot acquire() will return, and where its allocation of `len` bytes would start
    // (has_free(len) must hold).
    int next() const { return (head_ + used_) % slots_; }
    uint64_t next_offset(uint64_t len) const { return arena_ == 0 ? 0 : place(len); }
    int acquire(uint64_t len = 0) {
        const int i = next();
        off_[static_cast<size_t>(i)] = next_offset(len);
        len_[static_cast<size_t>(i)] = arena_ == 0 ? 0 : bytes_for(len);
        ++used_;
        return i;
    }
    // Gives back slot i, which must be the oldest taken. False (and nothing changes) otherwise.
    bool release(int i) {
        if (used_ == 0 || i != head_) return false;
        head_ = (head_ + 1) % slots_;
        --used_;
        return true;
    }
    // Slot i's allocation in the arena.
    uint64_t offset(int i) const { return off_[static_cast<size_t>(i)]; }
    uint64_t length(int i) const { return len_[static_cast<size_t>(i)]; }

 private:
    static constexpr uint64_t kNone = ~uint64_t{0};
    // Allocations have at least one byte, so that a full arena is told from an empty one.
    static uint64_t bytes_for(uint64_t len) { return len == 0 ? 1 : len; }

    // Where `len` bytes fit after the newest allocation (wrapping to the start), or kNone.
    uint64_t place(uint64_t len) const {
        len = bytes_for(len);
        if (len > arena_) return kNone;
        if (used_ == 0) return 0;
        const size_t last = static_cast<size_t>((head_ + used_ - 1) % slots_);
        const uint64_t head = off_[static_cast<size_t>(head_)];
        const uint64_t tail = off_[last] + len_[last];
        if (tail > head) {  // [head, tail) in use: room after it, or before head
            if (tail + len <= arena_) return tail;
            return len <= head ? 0 : kNone;
        }
        return tail + len <= head ? tail : kNone;  // wrapped: room between tail and head
    }

    int slots_;
    uint64_t arena_;
    std::vector<uint64_t> off_, len_;
    int head_ = 0;  // oldest slot taken
    int used_ = 0;
};

}  // namespace tcpx
