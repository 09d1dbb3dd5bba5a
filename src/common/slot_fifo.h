// Slots taken and given back in FIFO order: the order in which a channel's requests complete.
// Used for the staging buffers of a channel (host slots, GPU copy rings).
#pragma once

namespace tcpx {

class SlotFifo {
 public:
    explicit SlotFifo(int slots) : slots_(slots) {}

    int slots() const { return slots_; }
    bool has_free() const { return used_ < slots_; }
    int in_use() const { return used_; }
    // The slot acquire() will return.
    int next() const { return (head_ + used_) % slots_; }
    int acquire() {
        const int i = next();
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

 private:
    int slots_;
    int head_ = 0;  // oldest slot taken
    int used_ = 0;
};

}  // namespace tcpx
