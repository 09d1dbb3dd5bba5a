// The cost of checking a devmem-TCP receive's entries before the unpack (cuda/unpack_check.h),
// per 4 MiB chunk (what one receive of Google's TCPX plugin carries at most), beside the baseline
// of the same run: the sum of the lengths alone, which was all that was checked before. Entries
// as the plugin makes them (whole pages and page fragments), in arrival order or shuffled.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <vector>

#include "cuda/unpack_check.h"

namespace {

using tcpx::cuda::LoadMeta;

constexpr uint64_t kChunk = 4 << 20;
constexpr uint64_t kPage = tcpx::cuda::kUnpackPageSize;

std::vector<LoadMeta> entries(bool shuffled) {
    std::mt19937_64 rng(1);
    std::vector<LoadMeta> out;
    uint64_t at = 0;
    while (at < kChunk) {
        const uint64_t in_page = rng() % 4 == 0 ? rng() % kPage : 0;  // a fragment now and then
        const uint64_t len = std::min<uint64_t>(kChunk - at, kPage - in_page);
        out.push_back(LoadMeta{static_cast<uint32_t>((rng() % 65536) * kPage + in_page),
                               static_cast<uint32_t>(len), at});
        at += len;
    }
    if (shuffled) std::shuffle(out.begin(), out.end(), rng);
    return out;
}

void BM_UnpackCheck(benchmark::State& state) {
    const auto e = entries(state.range(0) != 0);
    std::vector<uint32_t> scratch;
    for (auto _ : state) {
        auto st = tcpx::cuda::check_unpack_entries(e.data(), e.size(), kChunk, uint64_t{1} << 32,
                                                   &scratch);
        benchmark::DoNotOptimize(st);
    }
    state.counters["entries"] = static_cast<double>(e.size());
    state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * kChunk));
}
BENCHMARK(BM_UnpackCheck)->Arg(0)->Arg(1);

// The baseline: the lengths summed, nothing else.
void BM_UnpackSumOnly(benchmark::State& state) {
    const auto e = entries(state.range(0) != 0);
    for (auto _ : state) {
        uint64_t got = 0;
        for (const LoadMeta& m : e) got += m.len;
        benchmark::DoNotOptimize(got);
    }
    state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * kChunk));
}
BENCHMARK(BM_UnpackSumOnly)->Arg(0)->Arg(1);

}  // namespace
