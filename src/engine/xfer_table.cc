#include "engine/xfer_table.h"

#include "common/status_util.h"
#include "common/strings.h"

namespace tcpx::engine {

XferTable::XferTable(size_t capacity, uint32_t first_gen)
    : capacity_(capacity),
      first_gen_(first_gen == 0 ? 1 : first_gen),
      nblocks_((capacity + kBlock - 1) / kBlock) {
    blocks_.reset(new std::atomic<Slot*>[nblocks_]);
    for (size_t i = 0; i < nblocks_; ++i) blocks_[i].store(nullptr);
}

XferTable::~XferTable() {
    for (size_t i = 0; i < nblocks_; ++i) delete[] blocks_[i].load();
}

XferTable::Slot* XferTable::slot(uint64_t index) const {
    if (index >= capacity_) return nullptr;
    Slot* block = blocks_[index / kBlock].load(std::memory_order_acquire);
    return block == nullptr ? nullptr : &block[index % kBlock];
}

StatusOr<XferId> XferTable::allocate() {
    uint64_t index;
    if (free_count_ > 0 && (free_count_ >= kReuseAfter || high_ >= capacity_)) {
        index = free_head_;
        Slot* head = slot(index);
        free_head_ = head->next_free;
        head->next_free = kNone;
        if (free_head_ == kNone) free_tail_ = kNone;
        --free_count_;
    } else if (high_ < capacity_) {
        index = high_;
        if (index % kBlock == 0) {
            // Allocated before the count moves on: out of memory leaves the table as it was.
            auto* block = new Slot[kBlock];
            for (size_t i = 0; i < kBlock; ++i) block[i].gen.store(first_gen_);
            blocks_[index / kBlock].store(block, std::memory_order_release);
        }
        ++high_;
    } else {
        return resource_exhausted(strformat(
            "%zu transfers are in flight (TCPX_P2P_MAX_TRANSFERS); poll or wait for some first",
            capacity_));
    }
    Slot* s = slot(index);
    s->busy = true;
    s->owner = nullptr;
    s->result = Status();
    s->state.store(static_cast<int>(XferState::kInProgress), std::memory_order_release);
    ++in_use_;
    return (static_cast<uint64_t>(s->gen.load()) << 32) | (index + 1);
}

XferTable::Slot* XferTable::busy_slot(XferId id) const {
    if ((id & 0xffffffffu) == 0) return nullptr;
    Slot* s = slot(index_of(id));
    if (s == nullptr || !s->busy || s->gen.load() != gen_of(id)) return nullptr;
    return s;
}

void XferTable::set_owner(XferId id, void* owner) {
    Slot* s = busy_slot(id);
    if (s != nullptr && s->state.load() == static_cast<int>(XferState::kInProgress)) {
        s->owner = owner;
    }
}

void* XferTable::owner(XferId id) const {
    const Slot* s = busy_slot(id);
    if (s == nullptr || s->state.load() != static_cast<int>(XferState::kInProgress)) return nullptr;
    return s->owner;
}

void XferTable::finish(XferId id, Status result) {
    Slot* s = busy_slot(id);
    if (s == nullptr) return;
    if (s->state.load() != static_cast<int>(XferState::kInProgress)) return;  // first outcome wins
    const bool ok = result.ok();
    s->owner = nullptr;
    s->result = std::move(result);
    s->state.store(static_cast<int>(ok ? XferState::kDone : XferState::kFailed),
                   std::memory_order_release);
}

bool XferTable::state(XferId id, XferState* state) const {
    if ((id & 0xffffffffu) == 0) return false;
    const Slot* s = slot(index_of(id));
    if (s == nullptr || s->gen.load(std::memory_order_acquire) != gen_of(id)) return false;
    *state = static_cast<XferState>(s->state.load(std::memory_order_acquire));
    return true;
}

bool XferTable::allocated_state(XferId id, XferState* state) const {
    const Slot* s = busy_slot(id);
    if (s == nullptr) return false;
    *state = static_cast<XferState>(s->state.load(std::memory_order_acquire));
    return true;
}

XferStatus XferTable::take(XferId id) {
    XferStatus out;
    Slot* s = busy_slot(id);
    if (s == nullptr) {
        // Not NOT_FOUND: that is what a refused transfer (an unknown remote key) reports.
        out.state = XferState::kFailed;
        out.error = invalid_argument(strformat("no transfer %016llx (unknown, or already reported)",
                                               static_cast<unsigned long long>(id)));
        return out;
    }
    out.state = static_cast<XferState>(s->state.load());
    if (out.state == XferState::kInProgress) return out;
    out.error = std::move(s->result);
    s->result = Status();
    s->busy = false;
    // A new generation, so the id just reported is unknown from now on.
    uint32_t gen = s->gen.load() + 1;
    if (gen == 0) gen = 1;
    s->gen.store(gen, std::memory_order_release);
    const uint64_t index = index_of(id);
    if (free_tail_ == kNone) {
        free_head_ = index;
    } else {
        slot(free_tail_)->next_free = index;
    }
    free_tail_ = index;
    ++free_count_;
    --in_use_;
    return out;
}

}  // namespace tcpx::engine
