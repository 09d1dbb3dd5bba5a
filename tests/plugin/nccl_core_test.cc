// The NCCL plugin's core in-process with TCPX_P2P_NCCL_CUDA=on: GPU buffers (NCCL_PTR_CUDA)
// staged through pinned host memory, host buffers through the same handles and requests. GPU
// memory is real where there is a GPU (the device machine) and emulated elsewhere (HostDevice:
// the same core code, copies on the CPU), so CI runs every path. Every byte is checked, and so
// are the buffers' surroundings.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <thread>
#include <vector>

#include "cuda/device.h"
#include "nccl_plugin.h"
#include "tests/support/host_device.h"
#include "tests/support/net_test_util.h"
#include "tests/support/test_buffer.h"

namespace tcpx {
namespace {

using testing::TestBuffer;

constexpr auto kTimeout = std::chrono::seconds(30);

// Staging is decided at the core's first init, once per process: the environment and the GPU
// layer are set before it.
class CoreEnv : public ::testing::Environment {
 public:
    void SetUp() override {
        if (cuda::device().count() == 0) {
            emu_ = std::make_unique<testing::HostDevice>(2);
            cuda::set_device_for_testing(emu_.get());
        }
        testing::set_socket_env(testing::loopback_settings());
        setenv("TCPX_P2P_NCCL_CUDA", "on", 1);
    }
    static testing::HostDevice* emu() { return emu_.get(); }

 private:
    static inline std::unique_ptr<testing::HostDevice> emu_;
};
const auto* const g_env = ::testing::AddGlobalTestEnvironment(new CoreEnv);

const tcpx_ncclNet_v7_t& t() { return nccl_plugin::core(); }

std::unique_ptr<TestBuffer> gpu_buffer(size_t size, int gpu = 0) {
    const int gpus = cuda::device().count();
    return testing::device_buffer(size, gpu % (gpus > 0 ? gpus : 1), CoreEnv::emu());
}

struct Pair {
    void* listen = nullptr;
    void* send = nullptr;
    void* recv = nullptr;
};

Pair connect_pair() {
    Pair p;
    char handle[TCPX_NCCL_NET_HANDLE_MAXSIZE] = {};
    EXPECT_EQ(t().listen(0, handle, &p.listen), tcpx_ncclSuccess);
    const auto deadline = std::chrono::steady_clock::now() + kTimeout;
    while ((p.send == nullptr || p.recv == nullptr) &&
           std::chrono::steady_clock::now() < deadline) {
        if (p.send == nullptr) {
            EXPECT_EQ(t().connect(0, handle, &p.send, nullptr), tcpx_ncclSuccess);
        }
        if (p.recv == nullptr) {
            EXPECT_EQ(t().accept(p.listen, &p.recv, nullptr), tcpx_ncclSuccess);
        }
    }
    EXPECT_TRUE(p.send != nullptr && p.recv != nullptr);
    return p;
}

void close_pair(Pair p) {
    if (p.send != nullptr) {
        EXPECT_EQ(t().closeSend(p.send), tcpx_ncclSuccess);
    }
    if (p.recv != nullptr) {
        EXPECT_EQ(t().closeRecv(p.recv), tcpx_ncclSuccess);
    }
    if (p.listen != nullptr) {
        EXPECT_EQ(t().closeListen(p.listen), tcpx_ncclSuccess);
    }
}

// Tests `req` until done; the sizes it reports into `sizes`.
tcpx_ncclResult_t wait(void* req, int* sizes) {
    const auto deadline = std::chrono::steady_clock::now() + kTimeout;
    int done = 0;
    while (std::chrono::steady_clock::now() < deadline) {
        const tcpx_ncclResult_t rc = t().test(req, &done, sizes);
        if (rc != tcpx_ncclSuccess || done) return rc;
    }
    return tcpx_ncclRemoteError;  // stuck: fails the caller's check
}

template <typename Fn>
void* post(Fn fn) {
    void* req = nullptr;
    const auto deadline = std::chrono::steady_clock::now() + kTimeout;
    while (req == nullptr && std::chrono::steady_clock::now() < deadline) {
        if (fn(&req) != tcpx_ncclSuccess) return nullptr;
    }
    return req;
}

TEST(NcclCore, OffersGpuBuffers) {
    ASSERT_EQ(t().init(nullptr), tcpx_ncclSuccess);
    tcpx_ncclNetProperties_v7_t p{};
    ASSERT_EQ(t().getProperties(0, &p), tcpx_ncclSuccess);
    EXPECT_NE(p.ptrSupport & TCPX_NCCL_PTR_HOST, 0);
    EXPECT_NE(p.ptrSupport & TCPX_NCCL_PTR_CUDA, 0);
    EXPECT_EQ(p.ptrSupport & TCPX_NCCL_PTR_DMABUF, 0);
}

// Messages of mixed sizes between every pairing of host and GPU memory, on two GPUs where there
// are two: each lands intact, at its offset, and nothing around it moves.
TEST(NcclCore, StagedTransfersAreByteExact) {
    ASSERT_EQ(t().init(nullptr), tcpx_ncclSuccess);
    Pair p = connect_pair();
    ASSERT_TRUE(p.send != nullptr && p.recv != nullptr);
    constexpr size_t kBytes = 4 << 20;
    std::vector<std::unique_ptr<TestBuffer>> src, dst;
    src.push_back(testing::host_buffer(kBytes));
    src.push_back(gpu_buffer(kBytes, 0));
    dst.push_back(testing::host_buffer(kBytes));
    dst.push_back(gpu_buffer(kBytes, 1));
    std::vector<void*> smr(2), dmr(2);
    for (int i = 0; i < 2; ++i) {
        ASSERT_EQ(t().regMr(p.send, src[i]->data(), static_cast<int>(kBytes),
                            src[i]->on_device() ? TCPX_NCCL_PTR_CUDA : TCPX_NCCL_PTR_HOST, &smr[i]),
                  tcpx_ncclSuccess);
        ASSERT_EQ(t().regMr(p.recv, dst[i]->data(), static_cast<int>(kBytes),
                            dst[i]->on_device() ? TCPX_NCCL_PTR_CUDA : TCPX_NCCL_PTR_HOST, &dmr[i]),
                  tcpx_ncclSuccess);
    }
    testing::HostDevice* emu = CoreEnv::emu();
    const uint64_t copies_before = emu != nullptr ? emu->sync_copies() : 0;
    int staged_copies = 0;
    std::mt19937_64 rng(7);
    for (int m = 0; m < 64; ++m) {
        const int s = m % 2, d = (m / 2) % 2;
        const size_t len = m == 0 ? 0 : (rng() % 3 == 0 ? rng() % 64 : rng() % (kBytes / 2));
        const size_t soff = rng() % (kBytes - len + 1), doff = rng() % (kBytes - len + 1);
        std::vector<uint8_t> bytes(len);
        testing::fill_pattern(bytes.data(), len, static_cast<uint64_t>(m));
        src[s]->upload(soff, bytes.data(), len);
        std::vector<uint8_t> poison(len, 0xee);
        dst[d]->upload(doff, poison.data(), len);
        // A receive larger than the send, as the contract allows; within the registration.
        const size_t room = std::min(kBytes - doff, len + 100);
        void* rdata = dst[d]->data() + doff;
        int rsize = static_cast<int>(room);
        int tag = m;
        void* rreq =
            post([&](void** r) { return t().irecv(p.recv, 1, &rdata, &rsize, &tag, &dmr[d], r); });
        void* sreq = post([&](void** r) {
            return t().isend(p.send, src[s]->data() + soff, static_cast<int>(len), m, smr[s], r);
        });
        ASSERT_TRUE(rreq != nullptr && sreq != nullptr) << "message " << m;
        int ssize = -1, rsizes[1] = {-1};
        ASSERT_EQ(wait(sreq, &ssize), tcpx_ncclSuccess) << "message " << m;
        ASSERT_EQ(wait(rreq, rsizes), tcpx_ncclSuccess) << "message " << m;
        EXPECT_EQ(rsizes[0], static_cast<int>(len)) << "message " << m;
        // Nothing to flush: the bytes are in GPU memory once test() says so.
        void* freq = reinterpret_cast<void*>(1);
        EXPECT_EQ(t().iflush(p.recv, 1, &rdata, &rsize, &dmr[d], &freq), tcpx_ncclSuccess);
        EXPECT_EQ(freq, nullptr);
        staged_copies += (len > 0 ? (s == 1) + (d == 1) : 0);
        ASSERT_EQ(dst[d]->download(doff, len), bytes)
            << "message " << m << ": " << len << " bytes " << (s ? "gpu" : "host") << " -> "
            << (d ? "gpu" : "host");
    }
    // Each GPU side of a message was staged: one copy out of the GPU, one into it (the test's
    // own uploads and downloads do not go through the device layer).
    if (emu != nullptr) {
        EXPECT_EQ(emu->sync_copies() - copies_before, static_cast<uint64_t>(staged_copies));
    }
    for (int i = 0; i < 2; ++i) {
        EXPECT_EQ(t().deregMr(p.send, smr[i]), tcpx_ncclSuccess);
        EXPECT_EQ(t().deregMr(p.recv, dmr[i]), tcpx_ncclSuccess);
        EXPECT_TRUE(dst[i]->canaries_intact());
    }
    close_pair(p);
}

// A grouped receive (n = 3) of GPU and host buffers: each buffer gets its own message by tag.
TEST(NcclCore, GroupedReceiveMixesGpuAndHost) {
    ASSERT_EQ(t().init(nullptr), tcpx_ncclSuccess);
    Pair p = connect_pair();
    ASSERT_TRUE(p.send != nullptr && p.recv != nullptr);
    constexpr size_t kLen = 300000;
    auto src = gpu_buffer(3 * kLen);
    auto g1 = gpu_buffer(kLen), g2 = gpu_buffer(kLen, 1);
    auto h = testing::host_buffer(kLen);
    void *smr = nullptr, *m1 = nullptr, *m2 = nullptr, *mh = nullptr;
    ASSERT_EQ(t().regMr(p.send, src->data(), 3 * kLen, TCPX_NCCL_PTR_CUDA, &smr), tcpx_ncclSuccess);
    ASSERT_EQ(t().regMr(p.recv, g1->data(), kLen, TCPX_NCCL_PTR_CUDA, &m1), tcpx_ncclSuccess);
    ASSERT_EQ(t().regMr(p.recv, g2->data(), kLen, TCPX_NCCL_PTR_CUDA, &m2), tcpx_ncclSuccess);
    ASSERT_EQ(t().regMr(p.recv, h->data(), kLen, TCPX_NCCL_PTR_HOST, &mh), tcpx_ncclSuccess);
    std::vector<uint8_t> bytes(3 * kLen);
    testing::fill_pattern(bytes.data(), bytes.size(), 99);
    src->upload(0, bytes.data(), bytes.size());
    void* data[3] = {g1->data(), h->data(), g2->data()};
    int sizes[3] = {kLen, kLen, kLen};
    int tags[3] = {10, 11, 12};
    void* mhs[3] = {m1, mh, m2};
    void* rreq = post([&](void** r) { return t().irecv(p.recv, 3, data, sizes, tags, mhs, r); });
    ASSERT_NE(rreq, nullptr);
    std::vector<void*> sreqs;
    for (int i = 0; i < 3; ++i) {
        sreqs.push_back(post([&](void** r) {
            return t().isend(p.send, src->data() + i * kLen, kLen, 10 + i, smr, r);
        }));
        ASSERT_NE(sreqs.back(), nullptr);
    }
    for (void* s : sreqs) ASSERT_EQ(wait(s, nullptr), tcpx_ncclSuccess);
    int got[3] = {};
    ASSERT_EQ(wait(rreq, got), tcpx_ncclSuccess);
    TestBuffer* bufs[3] = {g1.get(), h.get(), g2.get()};
    for (int i = 0; i < 3; ++i) {
        EXPECT_EQ(got[i], static_cast<int>(kLen));
        EXPECT_EQ(bufs[i]->download(0, kLen),
                  std::vector<uint8_t>(bytes.begin() + i * kLen, bytes.begin() + (i + 1) * kLen))
            << "buffer " << i;
        EXPECT_TRUE(bufs[i]->canaries_intact());
    }
    for (void* m : {m1, m2, mh}) EXPECT_EQ(t().deregMr(p.recv, m), tcpx_ncclSuccess);
    EXPECT_EQ(t().deregMr(p.send, smr), tcpx_ncclSuccess);
    close_pair(p);
}

// What NCCL must never be able to do to us: handles that are not ours, memory outside a
// registration, "GPU" memory that is host memory. Each is an error, never a crash.
TEST(NcclCore, RefusesWhatIsNotOurs) {
    ASSERT_EQ(t().init(nullptr), tcpx_ncclSuccess);
    Pair p = connect_pair();
    ASSERT_TRUE(p.send != nullptr && p.recv != nullptr);
    auto g = gpu_buffer(1 << 16);
    std::vector<uint8_t> host(1 << 16);
    void* mr = nullptr;
    EXPECT_EQ(t().regMr(p.send, host.data(), 1 << 16, TCPX_NCCL_PTR_CUDA, &mr),
              tcpx_ncclInvalidArgument);
    EXPECT_EQ(mr, nullptr);
    ASSERT_EQ(t().regMr(p.send, g->data(), 1 << 16, TCPX_NCCL_PTR_CUDA, &mr), tcpx_ncclSuccess);
    void* req = reinterpret_cast<void*>(1);
    // Past the end, and before the start, of the registration.
    EXPECT_EQ(t().isend(p.send, g->data() + 1, 1 << 16, 0, mr, &req), tcpx_ncclInvalidArgument);
    EXPECT_EQ(t().isend(p.send, g->data() - 1, 8, 0, mr, &req), tcpx_ncclInvalidArgument);
    EXPECT_EQ(req, nullptr);
    // Handles and requests that are not ours.
    int junk[16] = {};
    EXPECT_EQ(t().isend(p.send, g->data(), 8, 0, junk, &req), tcpx_ncclInvalidArgument);
    int done = 0;
    EXPECT_EQ(t().test(junk, &done, nullptr), tcpx_ncclInvalidArgument);
    EXPECT_EQ(t().deregMr(p.send, junk), tcpx_ncclInvalidArgument);
    void* data = g->data();
    int size = 8, tag = 0;
    void* mh = junk;
    EXPECT_EQ(t().irecv(p.recv, 1, &data, &size, &tag, &mh, &req), tcpx_ncclInvalidArgument);
    // A registration of one comm used on another is the transport's to refuse.
    EXPECT_EQ(t().deregMr(p.send, mr), tcpx_ncclSuccess);
    // A deregistered handle is no longer ours.
    EXPECT_EQ(t().isend(p.send, g->data(), 8, 0, mr, &req), tcpx_ncclInvalidArgument);
    close_pair(p);
}

// Closing comms with staged requests in flight and registrations left behind frees them (the
// sanitizer builds would see a leak) and leaves the core working.
TEST(NcclCore, CloseWithRequestsInFlight) {
    ASSERT_EQ(t().init(nullptr), tcpx_ncclSuccess);
    for (int round = 0; round < 3; ++round) {
        Pair p = connect_pair();
        ASSERT_TRUE(p.send != nullptr && p.recv != nullptr);
        auto g = gpu_buffer(1 << 20);
        void *smr = nullptr, *rmr = nullptr;
        ASSERT_EQ(t().regMr(p.send, g->data(), 1 << 20, TCPX_NCCL_PTR_CUDA, &smr),
                  tcpx_ncclSuccess);
        auto h = testing::host_buffer(1 << 20);
        ASSERT_EQ(t().regMr(p.recv, h->data(), 1 << 20, TCPX_NCCL_PTR_HOST, &rmr),
                  tcpx_ncclSuccess);
        // Receives nobody sends to, and sends nobody receives past the first.
        for (int i = 0; i < 4; ++i) {
            void* data = h->data();
            int size = 1 << 18, tag = i;
            void* r = post(
                [&](void** out) { return t().irecv(p.recv, 1, &data, &size, &tag, &rmr, out); });
            EXPECT_NE(r, nullptr);
        }
        for (int i = 0; i < 6; ++i) {
            void* r = nullptr;
            EXPECT_EQ(t().isend(p.send, g->data(), 1 << 18, i, smr, &r), tcpx_ncclSuccess);
        }
        close_pair(p);
    }
    // Still fine afterwards.
    Pair p = connect_pair();
    EXPECT_TRUE(p.send != nullptr && p.recv != nullptr);
    close_pair(p);
}

}  // namespace
}  // namespace tcpx
