// The unpack kernel against its CPU reference, on a real GPU (skipped without one): random
// entry lists over every alignment and length, empty lists, full slots; canaries around the
// destination. Also what pointer classification says of host and device memory.
#include <cuda.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "cuda/device.h"
#include "cuda/unpack.h"

namespace tcpx::cuda {
namespace {

#define CUDA_OK(expr) ASSERT_EQ((expr), cudaSuccess) << #expr << ": " << cudaGetErrorString(expr)

class UnpackTest : public ::testing::Test {
 protected:
    static constexpr size_t kBounce = 8u << 20;
    static constexpr size_t kDst = 8u << 20;
    static constexpr size_t kGuard = 4096;

    void SetUp() override {
        if (device_count() == 0) GTEST_SKIP() << "no GPU";
        CUDA_OK(cudaMalloc(&bounce_, kBounce));
        CUDA_OK(cudaMalloc(&dst_, kDst + 2 * kGuard));
        CUDA_OK(cudaMalloc(&entries_, sizeof(LoadMeta) * kUnpackMaxEntries));
        CUDA_OK(cudaMallocHost(&count_, sizeof(uint64_t)));
        CUDA_OK(cudaMallocHost(&bad_, sizeof(uint32_t)));
        CUDA_OK(cudaStreamCreate(&stream_));
        host_bounce_.resize(kBounce);
        std::mt19937_64 rng(1);
        for (auto& b : host_bounce_) b = static_cast<uint8_t>(rng());
        CUDA_OK(cudaMemcpy(bounce_, host_bounce_.data(), kBounce, cudaMemcpyHostToDevice));
    }
    void TearDown() override {
        if (bounce_ == nullptr) return;
        cudaFree(bounce_);
        cudaFree(dst_);
        cudaFree(entries_);
        cudaFreeHost(count_);
        cudaFreeHost(bad_);
        cudaStreamDestroy(stream_);
    }

    // Runs the kernel and the reference on `list`; every destination byte (and the guards) must
    // agree. The grid is sized for `expected` entries (the list's length unless given).
    void check(const std::vector<LoadMeta>& list, uint64_t dst_len = kDst,
               uint64_t expected = ~uint64_t{0}) {
        if (expected == ~uint64_t{0}) expected = list.size();
        std::vector<uint8_t> expect(kDst + 2 * kGuard, 0xa5);
        const bool good = unpack_reference(list.data(), list.size(), host_bounce_.data(),
                                           expect.data() + kGuard, dst_len);
        CUDA_OK(cudaMemset(dst_, 0xa5, kDst + 2 * kGuard));
        CUDA_OK(cudaMemcpy(entries_, list.data(), list.size() * sizeof(LoadMeta),
                           cudaMemcpyHostToDevice));
        *count_ = list.size();
        *bad_ = 0;
        ASSERT_TRUE(launch_unpack(entries_, count_, bounce_, dst_ + kGuard, dst_len, bad_, stream_,
                                  expected)
                        .ok());
        CUDA_OK(cudaStreamSynchronize(stream_));
        EXPECT_EQ(*bad_ != 0, !good) << "the kernel and the reference disagree on the list";
        std::vector<uint8_t> got(kDst + 2 * kGuard);
        CUDA_OK(cudaMemcpy(got.data(), dst_, got.size(), cudaMemcpyDeviceToHost));
        for (size_t i = 0; i < got.size(); ++i) {
            ASSERT_EQ(got[i], expect[i])
                << "byte " << static_cast<long>(i) - static_cast<long>(kGuard)
                << " of the destination";
        }
    }

    // `n` entries with random lengths in [1, max_len] and offsets of random alignment, disjoint
    // in the destination, in random order.
    std::vector<LoadMeta> random_list(std::mt19937_64& rng, int n, uint32_t max_len) {
        std::vector<LoadMeta> list;
        uint64_t at = rng() % 64;
        for (int i = 0; i < n; ++i) {
            const uint32_t len = 1 + static_cast<uint32_t>(rng() % max_len);
            if (at + len > kDst) break;
            const uint32_t src = static_cast<uint32_t>(rng() % (kBounce - len));
            list.push_back(LoadMeta{src, len, at});
            at += len + rng() % 3 * (rng() % 17);
        }
        std::shuffle(list.begin(), list.end(), rng);
        return list;
    }

    uint8_t* bounce_ = nullptr;
    uint8_t* dst_ = nullptr;
    LoadMeta* entries_ = nullptr;
    uint64_t* count_ = nullptr;
    uint32_t* bad_ = nullptr;  // pinned: the kernel's verdict
    cudaStream_t stream_ = nullptr;
    std::vector<uint8_t> host_bounce_;
};

TEST_F(UnpackTest, EmptyListTouchesNothing) { check({}); }

TEST_F(UnpackTest, EveryAlignmentAndLength) {
    std::vector<LoadMeta> list;
    uint64_t at = 0;
    // Source and destination offsets of every residue mod 16, lengths across word boundaries.
    for (uint32_t s = 0; s < 16; ++s) {
        for (uint32_t d = 0; d < 16; ++d) {
            for (uint32_t len : {1u, 2u, 3u, 15u, 16u, 17u, 511u, 512u, 513u, 4095u, 4096u}) {
                if (list.size() == kUnpackMaxEntries) {
                    check(list);
                    list.clear();
                    at = 0;
                }
                list.push_back(LoadMeta{4096 * (s * 16 + d) + s, len, at + d});
                at += len + 64;
            }
        }
    }
    check(list);
}

TEST_F(UnpackTest, RandomListsMatchTheReference) {
    std::mt19937_64 rng(42);
    for (int round = 0; round < 30; ++round) {
        SCOPED_TRACE(round);
        check(random_list(rng, 1 + static_cast<int>(rng() % kUnpackMaxEntries), 4096));
    }
}

TEST_F(UnpackTest, FullSlotOfPages) {
    // What a 4 MiB+ receive looks like: 2048 whole pages, scattered over the pool.
    std::mt19937_64 rng(7);
    std::vector<uint32_t> pages(kBounce / kUnpackPageSize);
    std::iota(pages.begin(), pages.end(), 0);
    std::shuffle(pages.begin(), pages.end(), rng);
    std::vector<LoadMeta> list;
    for (int i = 0; i < kUnpackMaxEntries; ++i) {
        list.push_back(LoadMeta{pages[i] * kUnpackPageSize, kUnpackPageSize,
                                static_cast<uint64_t>(i) * kUnpackPageSize});
    }
    check(list);
}

TEST_F(UnpackTest, MoreEntriesThanTheGridWasSizedFor) {
    // The count is read on the GPU and may exceed what the launch expected: every entry is
    // still copied, by fewer warps going round the list.
    std::mt19937_64 rng(9);
    const std::vector<LoadMeta> list = random_list(rng, kUnpackMaxEntries, 4096);
    for (uint64_t expected : {uint64_t{0}, uint64_t{1}, uint64_t{9}, list.size() / 3}) {
        SCOPED_TRACE(expected);
        check(list, kDst, expected);
    }
}

TEST_F(UnpackTest, EntriesOutsideTheDestinationAreRefused) {
    // A faulty transport: an entry past the end (and one straddling it) must not be followed,
    // the rest is copied, and the receive is reported bad. The guards check nothing leaked.
    std::vector<LoadMeta> list = {
        {0, 4096, 0}, {4096, 100, 8192 - 50}, {8192, 16, uint64_t{1} << 40}, {12288, 512, 4096}};
    check(list, 8192);
}

TEST_F(UnpackTest, CountAboveAFullSlotIsRefused) {
    // More entries than a slot holds: only the first 2048 are read, and the receive is bad.
    std::vector<LoadMeta> list;
    for (int i = 0; i < kUnpackMaxEntries + 1; ++i) {
        list.push_back(LoadMeta{static_cast<uint32_t>(i) * 16, 16, static_cast<uint64_t>(i) * 16});
    }
    std::vector<uint8_t> expect(kDst, 0xa5);
    EXPECT_FALSE(
        unpack_reference(list.data(), list.size(), host_bounce_.data(), expect.data(), kDst));
    CUDA_OK(cudaMemset(dst_, 0xa5, kDst + 2 * kGuard));
    CUDA_OK(cudaMemcpy(entries_, list.data(), kUnpackMaxEntries * sizeof(LoadMeta),
                       cudaMemcpyHostToDevice));
    *count_ = list.size();
    *bad_ = 0;
    ASSERT_TRUE(launch_unpack(entries_, count_, bounce_, dst_ + kGuard, kDst, bad_, stream_).ok());
    CUDA_OK(cudaStreamSynchronize(stream_));
    EXPECT_NE(*bad_, 0u);
    std::vector<uint8_t> got(kDst);
    CUDA_OK(cudaMemcpy(got.data(), dst_ + kGuard, kDst, cudaMemcpyDeviceToHost));
    EXPECT_EQ(got, expect);
}

TEST(CudaMemory, PointersAreClassified) {
    if (device_count() == 0) GTEST_SKIP() << "no GPU";
    std::vector<uint8_t> host(100);
    EXPECT_EQ(classify(host.data(), host.size())->kind, MemKind::kHost);
    void* dev = nullptr;
    CUDA_OK(cudaMalloc(&dev, 1 << 20));
    auto info = classify(static_cast<uint8_t*>(dev) + 12345, (1 << 20) - 12345);
    ASSERT_TRUE(info.ok()) << info.status().to_string();
    EXPECT_EQ(info->kind, MemKind::kCuda);
    int current = -1;
    cudaGetDevice(&current);
    EXPECT_EQ(info->device, current);
    cudaFree(dev);
    void* pinned = nullptr;
    CUDA_OK(cudaMallocHost(&pinned, 4096));
    EXPECT_EQ(classify(pinned, 4096)->kind, MemKind::kHost);
    cudaFreeHost(pinned);
    EXPECT_EQ(classify(nullptr, 0)->kind, MemKind::kHost);
}

// The driver's virtual memory calls, reached through the runtime (as the library reaches its).
struct Vmm {
    CUresult (*reserve)(CUdeviceptr*, size_t, size_t, CUdeviceptr, unsigned long long) = nullptr;
    CUresult (*create)(CUmemGenericAllocationHandle*, size_t, const CUmemAllocationProp*,
                       unsigned long long) = nullptr;
    CUresult (*map)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle,
                    unsigned long long) = nullptr;
    CUresult (*access)(CUdeviceptr, size_t, const CUmemAccessDesc*, size_t) = nullptr;
    CUresult (*unmap)(CUdeviceptr, size_t) = nullptr;
    CUresult (*release)(CUmemGenericAllocationHandle) = nullptr;
    CUresult (*free)(CUdeviceptr, size_t) = nullptr;
    bool ok() const { return reserve && create && map && access && unmap && release && free; }
    template <typename F>
    static void get(const char* name, F* fn) {
        void* p = nullptr;
        cudaDriverEntryPointQueryResult q{};
        if (cudaGetDriverEntryPointByVersion(name, &p, 12000, cudaEnableDefault, &q) ==
                cudaSuccess &&
            q == cudaDriverEntryPointSuccess) {
            *fn = reinterpret_cast<F>(p);
        }
    }
    Vmm() {
        get("cuMemAddressReserve", &reserve);
        get("cuMemCreate", &create);
        get("cuMemMap", &map);
        get("cuMemSetAccess", &access);
        get("cuMemUnmap", &unmap);
        get("cuMemRelease", &release);
        get("cuMemAddressFree", &free);
    }
};

// A registration must be GPU memory throughout. Memory of the virtual memory API (PyTorch's
// expandable segments: one reserved range, mapped piece by piece) is, across its pieces; a range
// that runs into addresses with nothing mapped is refused (the engine's kernels would fault
// there, killing the context).
TEST(CudaMemory, ARangeMustBeMappedThroughout) {
    if (device_count() == 0) GTEST_SKIP() << "no GPU";
    Vmm vmm;
    if (!vmm.ok()) GTEST_SKIP() << "the driver gives no virtual memory calls";
    int gpu = -1;
    cudaGetDevice(&gpu);
    CUmemAllocationProp prop{};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = gpu;
    constexpr size_t kPiece = 2 << 20;  // the granularity on every GPU of the last years
    CUdeviceptr va = 0;
    ASSERT_EQ(vmm.reserve(&va, 4 * kPiece, 0, 0, 0), CUDA_SUCCESS);
    CUmemGenericAllocationHandle h[2] = {};
    for (int i = 0; i < 2; ++i) {  // two pieces mapped side by side, the rest left unmapped
        ASSERT_EQ(vmm.create(&h[i], kPiece, &prop, 0), CUDA_SUCCESS);
        ASSERT_EQ(vmm.map(va + i * kPiece, kPiece, 0, h[i], 0), CUDA_SUCCESS);
    }
    CUmemAccessDesc access{};
    access.location = prop.location;
    access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    ASSERT_EQ(vmm.access(va, 2 * kPiece, &access, 1), CUDA_SUCCESS);
    const void* p = reinterpret_cast<const void*>(va + 4096);
    auto both = classify(p, 2 * kPiece - 4096);
    ASSERT_TRUE(both.ok()) << both.status().to_string();
    EXPECT_EQ(both->kind, MemKind::kCuda);
    EXPECT_EQ(both->device, gpu);
    auto past = classify(p, 2 * kPiece);  // 4 KiB into the unmapped third piece
    EXPECT_EQ(past.status().code(), StatusCode::kOutOfRange) << past.status().to_string();
    for (int i = 0; i < 2; ++i) {
        vmm.unmap(va + i * kPiece, kPiece);
        vmm.release(h[i]);
    }
    vmm.free(va, 4 * kPiece);
}

// Synchronous copies out of GPU memory into pageable host memory (inline transfers) go through a
// pinned buffer of the copying stream up to Device::kBounceBytes, straight past it: every length
// around that bound lands byte for byte (there and back), nothing past either end is written,
// and threads copying at once (each with a stream and buffer of its own) do not mix their bytes.
TEST(CudaMemory, SmallCopiesOfPageableMemoryLandByteForByte) {
    if (device_count() == 0) GTEST_SKIP() << "no GPU";
    Device& dev = device();
    constexpr size_t kB = Device::kBounceBytes;
    constexpr size_t kGuard = 64;
    const size_t lens[] = {1, 7, 4096, 8193, kB - 1, kB, kB + 1, 3 * kB + 5};
    constexpr int kThreads = 4;
    std::vector<std::thread> threads;
    std::vector<std::string> failures(kThreads);
    for (int t = 0; t < kThreads; ++t) {
        threads.emplace_back([&, t] {
            uint8_t* gpu = nullptr;
            if (cudaMalloc(&gpu, 4 * kB + 2 * kGuard) != cudaSuccess) {
                failures[t] = "cudaMalloc";
                return;
            }
            std::mt19937_64 rng(static_cast<uint64_t>(t) + 1);
            for (int round = 0; round < 3 && failures[t].empty(); ++round) {
                for (size_t len : lens) {
                    std::vector<uint8_t> src(len), back(len + 2 * kGuard, 0xee);
                    for (auto& b : src) b = static_cast<uint8_t>(rng());
                    const uint8_t mark = static_cast<uint8_t>(0x40 + t);
                    // (the copies run on streams that do not wait for the legacy stream)
                    if (cudaMemset(gpu, mark, 4 * kB + 2 * kGuard) != cudaSuccess ||
                        cudaDeviceSynchronize() != cudaSuccess) {
                        failures[t] = "cudaMemset";
                        break;
                    }
                    Status st = dev.copy(0, gpu + kGuard, src.data(), len);
                    if (st.ok()) st = dev.copy_to_host(0, back.data() + kGuard, gpu + kGuard, len);
                    if (!st.ok()) {
                        failures[t] = st.to_string();
                        break;
                    }
                    if (std::memcmp(back.data() + kGuard, src.data(), len) != 0) {
                        failures[t] = "bytes differ at len " + std::to_string(len);
                        break;
                    }
                    for (size_t i = 0; i < kGuard; ++i) {
                        if (back[i] != 0xee || back[kGuard + len + i] != 0xee) {
                            failures[t] = "host guard written at len " + std::to_string(len);
                        }
                    }
                    std::vector<uint8_t> whole(4 * kB + 2 * kGuard);
                    cudaMemcpy(whole.data(), gpu, whole.size(), cudaMemcpyDeviceToHost);
                    for (size_t i = 0; i < kGuard; ++i) {
                        if (whole[i] != mark || whole[kGuard + len + i] != mark) {
                            failures[t] = "GPU guard written at len " + std::to_string(len);
                        }
                    }
                }
            }
            cudaFree(gpu);
        });
    }
    for (auto& th : threads) th.join();
    for (int t = 0; t < kThreads; ++t) EXPECT_EQ(failures[t], "") << "thread " << t;
    // Bad arguments are refused, not copied.
    std::vector<uint8_t> host(16);
    EXPECT_EQ(dev.copy_to_host(device_count(), host.data(), host.data(), 16).code(),
              StatusCode::kInvalidArgument);
    EXPECT_EQ(dev.copy(-1, host.data(), host.data(), 16).code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace tcpx::cuda
