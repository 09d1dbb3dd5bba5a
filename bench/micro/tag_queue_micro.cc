// Matching by tag (engine/tag_queue.h) with many items held, beside the baseline of the same run:
// the list scanned in posting order that the engine used before. Each iteration is what one
// message from a peer costs when it matches nothing (a send of a tag no receive waits for: a
// look for a receive, then the send held) and what taking the oldest item of a tag costs, with
// `held` items of other tags held (a peer's unmatched sends: up to MAX_TRANSFERS, 65,536).
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdint>
#include <deque>

#include "engine/tag_queue.h"

namespace {

using tcpx::engine::TagQueue;

struct Item {
    uint64_t tag;
    uint64_t id;
};

void BM_TagQueueMissThenHold(benchmark::State& state) {
    const auto held = static_cast<uint64_t>(state.range(0));
    TagQueue<Item> q;
    for (uint64_t i = 0; i < held; ++i) q.push(i * 2 + 1, Item{i * 2 + 1, i});
    uint64_t next = 0;
    for (auto _ : state) {
        const uint64_t tag = (next++ % held) * 2;  // held nowhere
        auto hit = q.take(tag);
        benchmark::DoNotOptimize(hit);
        const auto key = q.push(tag, Item{tag, next});
        q.erase(key);  // (keeps the count held)
    }
}

void BM_ScannedListMissThenHold(benchmark::State& state) {
    const auto held = static_cast<uint64_t>(state.range(0));
    std::deque<Item> q;
    for (uint64_t i = 0; i < held; ++i) q.push_back(Item{i * 2 + 1, i});
    uint64_t next = 0;
    for (auto _ : state) {
        const uint64_t tag = (next++ % held) * 2;
        auto it = std::find_if(q.begin(), q.end(), [&](const Item& x) { return x.tag == tag; });
        benchmark::DoNotOptimize(it);
        q.push_back(Item{tag, next});
        q.pop_back();
    }
}

// One of `held` tags, all over the range (a scan finds it halfway on average).
uint64_t random_tag(uint64_t* rng, uint64_t held) {
    *rng ^= *rng << 13;
    *rng ^= *rng >> 7;
    *rng ^= *rng << 17;
    return *rng % held;
}

// Taking the oldest of a tag that is held (a receive meets its send), then holding another.
void BM_TagQueueTakeHeld(benchmark::State& state) {
    const auto held = static_cast<uint64_t>(state.range(0));
    TagQueue<Item> q;
    for (uint64_t i = 0; i < held; ++i) q.push(i, Item{i, i});
    uint64_t next = 0;
    uint64_t rng = 88172645463325252ULL;
    for (auto _ : state) {
        const uint64_t tag = random_tag(&rng, held);
        auto hit = q.take(tag);
        benchmark::DoNotOptimize(hit);
        q.push(tag, Item{tag, ++next});
    }
}

void BM_ScannedListTakeHeld(benchmark::State& state) {
    const auto held = static_cast<uint64_t>(state.range(0));
    std::deque<Item> q;
    for (uint64_t i = 0; i < held; ++i) q.push_back(Item{i, i});
    uint64_t next = 0;
    uint64_t rng = 88172645463325252ULL;
    for (auto _ : state) {
        const uint64_t tag = random_tag(&rng, held);
        auto it = std::find_if(q.begin(), q.end(), [&](const Item& x) { return x.tag == tag; });
        Item hit = *it;
        q.erase(it);
        benchmark::DoNotOptimize(hit);
        q.push_back(Item{tag, ++next});
    }
}

}  // namespace

BENCHMARK(BM_TagQueueMissThenHold)->Arg(16)->Arg(1024)->Arg(65536);
BENCHMARK(BM_ScannedListMissThenHold)->Arg(16)->Arg(1024)->Arg(65536);
BENCHMARK(BM_TagQueueTakeHeld)->Arg(16)->Arg(1024)->Arg(65536);
BENCHMARK(BM_ScannedListTakeHeld)->Arg(16)->Arg(1024)->Arg(65536);
