// What waits to be matched by tag in two-sided transfers: a peer's sends no receive has taken,
// and our receives no send has met. Oldest first within a tag, as posted.
//
// A peer chooses the tags, and how many sends it leaves unmatched (up to MAX_TRANSFERS, 65,536 by
// default): in one list scanned in posting order, each of its messages and each receive posted
// cost a comparison per item held, under the engine's lock. Keyed by (tag, arrival), every
// operation here is O(log n) in the items held, whatever tags they carry (an ordered map, not a
// hash of the peer's tags, which it could make collide).
#pragma once

#include <compare>
#include <cstdint>
#include <map>
#include <optional>
#include <utility>
#include <vector>

namespace tcpx::engine {

template <typename T>
class TagQueue {
 public:
    // Where an item is held: its tag, and its place in arrival order (unique in the queue).
    struct Key {
        uint64_t tag = 0;
        uint64_t seq = 0;
        auto operator<=>(const Key&) const = default;
    };

    // Holds `item` behind every item of `tag` already held. May throw (memory); then nothing
    // changed.
    Key push(uint64_t tag, T item) {
        const Key key{tag, next_seq_};
        items_.emplace(key, std::move(item));
        ++next_seq_;
        return key;
    }

    // The oldest item of `tag`, taken out; none where none is held.
    std::optional<T> take(uint64_t tag) {
        auto it = items_.lower_bound(Key{tag, 0});
        if (it == items_.end() || it->first.tag != tag) return std::nullopt;
        std::optional<T> item(std::move(it->second));
        items_.erase(it);
        return item;
    }

    // The item push() put at `key` taken out; false where it is no longer held.
    bool erase(const Key& key) { return items_.erase(key) != 0; }

    // Every item `pick` chooses, taken out, by tag and oldest first within a tag. O(n): for
    // what looks at every item anyway (a region deregistered under receives).
    template <typename Pick>
    std::vector<T> take_if(Pick pick) {
        std::vector<T> out;
        for (auto it = items_.begin(); it != items_.end();) {
            if (!pick(it->second)) {
                ++it;
                continue;
            }
            out.push_back(std::move(it->second));
            it = items_.erase(it);
        }
        return out;
    }

    size_t size() const { return items_.size(); }
    bool empty() const { return items_.empty(); }
    void clear() { items_.clear(); }

 private:
    std::map<Key, T> items_;
    uint64_t next_seq_ = 0;
};

}  // namespace tcpx::engine
