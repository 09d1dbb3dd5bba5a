#include "engine/registry.h"

#include "common/random.h"
#include "common/status_util.h"
#include "common/strings.h"

namespace tcpx::engine {

namespace {

// [offset, offset + len) within [0, size), without overflow.
bool in_bounds(uint64_t offset, uint64_t len, uint64_t size) {
    return offset <= size && len <= size - offset;
}

}  // namespace

StatusOr<Region*> Registry::add(void* ptr, uint64_t len, MemKind kind, int32_t device) {
    if (ptr == nullptr) return invalid_argument("reg: null pointer");
    if (len == 0) return invalid_argument("reg: empty region");
    if (reinterpret_cast<uintptr_t>(ptr) + len < reinterpret_cast<uintptr_t>(ptr)) {
        return invalid_argument("reg: region wraps around the address space");
    }
    auto region = std::make_unique<Region>();
    do {
        TCPX_ASSIGN_OR_RETURN(region->key, random_u64());
    } while (region->key == 0 || by_key_.count(region->key) != 0);
    region->id = next_id_++;
    region->base = static_cast<uint8_t*>(ptr);
    region->len = len;
    region->kind = kind;
    region->device = device;
    Region* raw = region.get();
    by_key_.emplace(raw->key, raw);
    by_id_.emplace(raw->id, std::move(region));
    return raw;
}

Region* Registry::find(MemId id) const {
    auto it = by_id_.find(id);
    return it == by_id_.end() || it->second->dead ? nullptr : it->second.get();
}

Region* Registry::find_key(uint64_t key) const {
    auto it = by_key_.find(key);
    return it == by_key_.end() ? nullptr : it->second;
}

StatusOr<Region*> Registry::resolve(MemId id, uint64_t offset, uint64_t len) const {
    Region* r = find(id);
    if (r == nullptr)
        return not_found(
            strformat("no registration with id %llu", static_cast<unsigned long long>(id)));
    if (!in_bounds(offset, len, r->len)) {
        return out_of_range(strformat(
            "[%llu, +%llu) is outside registration %llu of %llu bytes",
            static_cast<unsigned long long>(offset), static_cast<unsigned long long>(len),
            static_cast<unsigned long long>(id), static_cast<unsigned long long>(r->len)));
    }
    return r;
}

StatusOr<Region*> Registry::resolve_key(uint64_t key, uint64_t offset, uint64_t len) const {
    Region* r = find_key(key);
    if (r == nullptr) {
        return not_found(
            strformat("no registration with key %016llx (never registered, or "
                      "deregistered)",
                      static_cast<unsigned long long>(key)));
    }
    if (!in_bounds(offset, len, r->len)) {
        return out_of_range(strformat("[%llu, +%llu) is outside the registration of %llu bytes",
                                      static_cast<unsigned long long>(offset),
                                      static_cast<unsigned long long>(len),
                                      static_cast<unsigned long long>(r->len)));
    }
    return r;
}

StatusOr<Region*> Registry::kill(MemId id) {
    auto it = by_id_.find(id);
    if (it == by_id_.end() || it->second->dead) {
        return not_found(
            strformat("dereg: no registration with id %llu", static_cast<unsigned long long>(id)));
    }
    Region* r = it->second.get();
    r->dead = true;
    by_key_.erase(r->key);
    if (r->refs == 0) {
        free_region(it);
        return static_cast<Region*>(nullptr);
    }
    return r;
}

void Registry::unref(Region* r) {
    if (--r->refs == 0 && r->dead) free_region(by_id_.find(r->id));
}

void Registry::free_region(std::unordered_map<MemId, std::unique_ptr<Region>>::iterator it) {
    if (on_free_) on_free_(it->second.get());
    by_id_.erase(it);
}

}  // namespace tcpx::engine
