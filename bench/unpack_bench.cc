#include "bench/unpack_bench.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>
#include <numeric>
#include <random>
#include <vector>

#include "cuda/device.h"
#include "cuda/unpack.h"

namespace tcpx::bench {
namespace {

struct Result {
    int entries;
    uint32_t len;
    double unpack_gbps;  // medians over the rounds: the kernel alone
    double listed_gbps;  // the list copied to the GPU, then the kernel (what the engine does)
    double memcpy_gbps;
    double ratio_lo;  // the lowest and highest per-round ratio
    double ratio_hi;
};

constexpr int kRounds = 9;

double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

#define CHECK_CUDA(expr)                                                                           \
    do {                                                                                           \
        const cudaError_t e = (expr);                                                              \
        if (e != cudaSuccess) {                                                                    \
            std::fprintf(stderr, "tcpx-p2p bench unpack: %s: %s\n", #expr, cudaGetErrorString(e)); \
            return 1;                                                                              \
        }                                                                                          \
    } while (0)

// The inline path's synchronous copies out of GPU memory into pageable host memory (a control
// message's bytes): Device::copy_to_host, through the copying stream's pinned
// buffer up to Device::kBounceBytes, against Device::copy() of the same pageable memory (the
// driver's own staging), alternating over kRounds rounds of `iters` copies each; the host side
// is written by the CPU before each copy, as a receive leaves it. Figures: the median per copy
// over all rounds, the ratio that of the medians with the per-round range beside it.
int run_small_copies(const UnpackBenchOptions& o, const char* gpu_name, nlohmann::json* json) {
    cuda::Device& dev = cuda::device();
    uint8_t* gpu = nullptr;
    CHECK_CUDA(cudaMalloc(&gpu, 1 << 20));
    std::vector<uint8_t> host(1 << 20);
    struct Row {
        const char* dir;
        size_t len;
        double plain_us, bounce_us, lo, hi;
    };
    std::vector<Row> rows;
    for (size_t len : {size_t{64}, size_t{4096}, size_t{8192}, size_t{16384}, size_t{32768},
                       size_t{65536}, size_t{131072}, size_t{262144}}) {
        std::vector<double> plain_all, bounce_all, ratios;
        for (int round = 0; round < kRounds; ++round) {
            std::vector<double> per[2];
            for (int bounce = 0; bounce < 2; ++bounce) {
                for (int i = 0; i < o.iters; ++i) {
                    std::memset(host.data(), i, len);
                    const auto a = std::chrono::steady_clock::now();
                    Status st = bounce ? dev.copy_to_host(0, host.data(), gpu, len)
                                       : dev.copy(0, host.data(), gpu, len);
                    const auto b = std::chrono::steady_clock::now();
                    if (!st.ok()) {
                        std::fprintf(stderr, "tcpx-p2p bench unpack: %s\n", st.to_string().c_str());
                        cudaFree(gpu);
                        return 1;
                    }
                    per[bounce].push_back(std::chrono::duration<double, std::micro>(b - a).count());
                }
            }
            plain_all.insert(plain_all.end(), per[0].begin(), per[0].end());
            bounce_all.insert(bounce_all.end(), per[1].begin(), per[1].end());
            ratios.push_back(median(per[1]) / median(per[0]));
        }
        rows.push_back(Row{"GPU->host", len, median(plain_all), median(bounce_all),
                           *std::min_element(ratios.begin(), ratios.end()),
                           *std::max_element(ratios.begin(), ratios.end())});
    }
    cudaFree(gpu);
    if (json != nullptr) {
        auto& out = (*json)["small_copies"];
        out["copies_per_round"] = o.iters;
        for (const Row& r : rows) {
            out["results"].push_back({{"direction", r.dir},
                                      {"bytes", r.len},
                                      {"pageable_us", r.plain_us},
                                      {"bounce_us", r.bounce_us},
                                      {"ratio", r.bounce_us / r.plain_us},
                                      {"ratio_min", r.lo},
                                      {"ratio_max", r.hi}});
        }
        return 0;
    }
    std::printf(
        "\nsmall synchronous copies out of the GPU (inline transfers), %s, %d copies per figure "
        "and round, median of %d alternating rounds\n"
        "pageable: Device::copy() into pageable host memory (the driver stages it); bounce: "
        "copy_to_host (a pinned buffer of ours up to %zu KiB); ratio: "
        "bounce/pageable, lower is faster\n\n",
        gpu_name, o.iters, kRounds, cuda::Device::kBounceBytes / 1024);
    std::printf("%10s %8s %14s %12s %8s %14s\n", "direction", "bytes", "pageable us", "bounce us",
                "ratio", "rounds");
    for (const Row& r : rows) {
        std::printf("%10s %8zu %14.2f %12.2f %7.2fx %6.2f-%.2fx\n", r.dir, r.len, r.plain_us,
                    r.bounce_us, r.bounce_us / r.plain_us, r.lo, r.hi);
    }
    return 0;
}

}  // namespace

// Each case is one receive's worth of entries: `entries` pieces of `len` bytes, scattered over a
// 64 MiB page pool in random order, their list copied from pinned host memory before each launch
// (as the engine does),
// gathered into a contiguous destination — timed with CUDA events over `iters` launches, against
// cudaMemcpyAsync of the same total bytes between the same buffers. The two alternate over kRounds
// rounds (the GPU's clocks and neighbours drift); the figures are the medians, the ratio that of
// the medians, with the per-round range beside it.
int run_unpack_bench(const UnpackBenchOptions& o) {
    if (cuda::device_count() == 0) {
        std::fprintf(stderr, "tcpx-p2p bench unpack: no GPU\n");
        return 1;
    }
    constexpr size_t kPool = 64u << 20;
    uint8_t* pool = nullptr;
    uint8_t* dst = nullptr;
    cuda::LoadMeta* entries = nullptr;
    uint64_t* count = nullptr;
    cudaStream_t stream;
    cudaEvent_t start, stop;
    CHECK_CUDA(cudaMalloc(&pool, kPool));
    CHECK_CUDA(cudaMalloc(&dst, kPool));
    // As the engine does it: the list (read on the host from the transport's queue) goes to the
    // GPU with one copy from pinned memory ahead of each launch; the copy is timed with the kernel.
    cuda::LoadMeta* host_entries = nullptr;
    CHECK_CUDA(cudaMalloc(&entries, sizeof(cuda::LoadMeta) * cuda::kUnpackMaxEntries));
    CHECK_CUDA(cudaMalloc(&count, sizeof(uint64_t)));
    CHECK_CUDA(cudaHostAlloc(reinterpret_cast<void**>(&host_entries),
                             sizeof(cuda::LoadMeta) * cuda::kUnpackMaxEntries,
                             cudaHostAllocDefault));
    CHECK_CUDA(cudaStreamCreate(&stream));
    CHECK_CUDA(cudaEventCreate(&start));
    CHECK_CUDA(cudaEventCreate(&stop));
    CHECK_CUDA(cudaMemset(pool, 1, kPool));
    std::mt19937_64 rng(3);
    std::vector<Result> results;
    const std::pair<int, uint32_t> cases[] = {
        {256, 4096}, {1024, 4096}, {2048, 4096}, {2048, 4000}, {2048, 1500}};
    for (auto [n, len] : cases) {
        std::vector<uint32_t> pages(kPool / cuda::kUnpackPageSize);
        std::iota(pages.begin(), pages.end(), 0);
        std::shuffle(pages.begin(), pages.end(), rng);
        std::vector<cuda::LoadMeta> list;
        for (int i = 0; i < n; ++i) {
            list.push_back(cuda::LoadMeta{pages[i] * cuda::kUnpackPageSize, len,
                                          static_cast<uint64_t>(i) * len});
        }
        const uint64_t cnt = list.size();
        const size_t bytes = static_cast<size_t>(n) * len;
        std::memcpy(host_entries, list.data(), sizeof(cuda::LoadMeta) * cnt);
        CHECK_CUDA(cudaMemcpy(count, &cnt, sizeof(cnt), cudaMemcpyHostToDevice));
        auto time = [&](auto launch) -> double {
            for (int i = 0; i < 10; ++i) launch();
            cudaEventRecord(start, stream);
            for (int i = 0; i < o.iters; ++i) launch();
            cudaEventRecord(stop, stream);
            cudaEventSynchronize(stop);
            float ms = 0;
            cudaEventElapsedTime(&ms, start, stop);
            return static_cast<double>(bytes) * o.iters / (ms / 1e3) / 1e9;
        };
        CHECK_CUDA(cudaMemcpy(entries, host_entries, sizeof(cuda::LoadMeta) * cnt,
                              cudaMemcpyHostToDevice));
        std::vector<double> un, li, mc, ratios;
        for (int round = 0; round < kRounds; ++round) {
            un.push_back(time([&] {
                (void)cuda::launch_unpack(entries, count, pool, dst, kPool, nullptr, stream);
            }));
            li.push_back(time([&] {
                cudaMemcpyAsync(entries, host_entries, sizeof(cuda::LoadMeta) * cnt,
                                cudaMemcpyHostToDevice, stream);
                (void)cuda::launch_unpack(entries, count, pool, dst, kPool, nullptr, stream);
            }));
            mc.push_back(
                time([&] { cudaMemcpyAsync(dst, pool, bytes, cudaMemcpyDeviceToDevice, stream); }));
            ratios.push_back(un.back() / mc.back());
        }
        CHECK_CUDA(cudaGetLastError());
        Result r{n,
                 len,
                 median(un),
                 median(li),
                 median(mc),
                 *std::min_element(ratios.begin(), ratios.end()),
                 *std::max_element(ratios.begin(), ratios.end())};
        results.push_back(r);
    }
    cudaDeviceProp prop{};
    int dev = 0;
    cudaGetDevice(&dev);
    cudaGetDeviceProperties(&prop, dev);
    nlohmann::json json;
    if (o.json) {
        nlohmann::json out;
        out["benchmark"] = "unpack";
        out["device"] = prop.name;
        out["iters"] = o.iters;
        for (const Result& r : results) {
            out["results"].push_back({{"entries", r.entries},
                                      {"entry_bytes", r.len},
                                      {"unpack_gbps", r.unpack_gbps},
                                      {"unpack_with_list_copy_gbps", r.listed_gbps},
                                      {"memcpy_gbps", r.memcpy_gbps},
                                      {"ratio", r.unpack_gbps / r.memcpy_gbps},
                                      {"ratio_min", r.ratio_lo},
                                      {"ratio_max", r.ratio_hi}});
        }
        json = std::move(out);
    } else {
        std::printf(
            "tcpx-p2p bench unpack: %s, one launch per receive, %d launches per figure, median "
            "of %d alternating rounds\n",
            prop.name, o.iters, kRounds);
        std::printf(
            "GB/s counts the bytes copied once; memcpy: cudaMemcpyAsync D2D of the same "
            "bytes (contiguous); ratio: unpack/memcpy; +list: the list's copy to the GPU "
            "first, as the engine does per receive\n\n");
        std::printf("%8s %8s %10s %12s %12s %8s %14s %12s\n", "entries", "bytes", "total",
                    "unpack GB/s", "memcpy GB/s", "ratio", "rounds", "+list GB/s");
        for (const Result& r : results) {
            std::printf("%8d %8u %9.2fM %12.1f %12.1f %7.2fx %6.2f-%.2fx %12.1f\n", r.entries,
                        r.len, r.entries * static_cast<double>(r.len) / (1 << 20), r.unpack_gbps,
                        r.memcpy_gbps, r.unpack_gbps / r.memcpy_gbps, r.ratio_lo, r.ratio_hi,
                        r.listed_gbps);
        }
    }
    cudaFree(pool);
    cudaFree(dst);
    cudaFree(entries);
    cudaFree(count);
    cudaFreeHost(host_entries);
    cudaStreamDestroy(stream);
    const int rc = run_small_copies(o, prop.name, o.json ? &json : nullptr);
    if (rc == 0 && o.json) std::printf("%s\n", json.dump(2).c_str());
    return rc;
}

}  // namespace tcpx::bench
