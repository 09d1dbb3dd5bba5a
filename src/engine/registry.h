// The memory registry: local registrations by id, the same by their random remote key, and
// reference counts so a region is released only when no operation uses it any more.
// Not thread-safe: the engine's lock guards it.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <unordered_map>

#include "tcpx/endpoint.h"
#include "tcpx/status.h"

namespace tcpx::engine {

struct Region {
    MemId id = 0;
    uint64_t key = 0;
    uint8_t* base = nullptr;
    uint64_t len = 0;
    MemKind kind = MemKind::kHost;
    int32_t device = -1;
    int64_t refs = 0;    // operations using the region
    int64_t copies = 0;  // of which local copies (Endpoint::copy), which end by themselves
    bool dead = false;   // deregistered: no new operation may use it
};

class Registry {
 public:
    // Called with each region just before it is freed (the engine drops the transports'
    // registrations of it).
    void set_on_free(std::function<void(Region*)> fn) { on_free_ = std::move(fn); }

    StatusOr<Region*> add(void* ptr, uint64_t len, MemKind kind, int32_t device);
    // A live region by id / by key; null if there is none.
    Region* find(MemId id) const;
    Region* find_key(uint64_t key) const;

    // For a local operation: region `id` must be live and hold [offset, offset + len).
    StatusOr<Region*> resolve(MemId id, uint64_t offset, uint64_t len) const;
    // For a peer's request: the same by key. The message says what was wrong without
    // revealing our addresses.
    StatusOr<Region*> resolve_key(uint64_t key, uint64_t offset, uint64_t len) const;

    // Deregisters: the region stops resolving; it is freed when its last reference goes
    // (unref) or now if it has none. Returns the region while references remain, else null.
    StatusOr<Region*> kill(MemId id);
    void ref(Region* r) { ++r->refs; }
    void unref(Region* r);

    // Whether `id` is still held, live or deregistered with references left.
    bool exists(MemId id) const { return by_id_.count(id) != 0; }
    size_t size() const { return by_id_.size(); }

 private:
    void free_region(std::unordered_map<MemId, std::unique_ptr<Region>>::iterator it);

    std::function<void(Region*)> on_free_;
    std::unordered_map<MemId, std::unique_ptr<Region>> by_id_;  // live and dying regions
    std::unordered_map<uint64_t, Region*> by_key_;              // live regions
    MemId next_id_ = 1;
};

}  // namespace tcpx::engine
