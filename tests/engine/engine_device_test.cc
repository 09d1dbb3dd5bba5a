// The engine with GPU memory: every mix of host and device memory on both sides, READ and WRITE,
// send/recv and vectors, every byte verified and the canaries around each region checked.
//
// One source, two builds: tcpx_engine_device_tests runs it on the device emulation
// (tests/support/host_device.h) in CI; tcpx_gpu_tests (TCPX_TEST_REAL_GPU) on real GPUs, skipping
// where there is none. Each runs over the socket net (the staging path) and over the emulated TCPX
// plugin (the unpack path).
#include <dirent.h>
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "common/cache_lines.h"
#include "common/socket.h"
#include "cuda/device.h"
#if TCPX_TEST_REAL_GPU
#include <cuda_runtime_api.h>
#endif
#include "tests/support/engine_test_util.h"
#include "tests/support/host_device.h"
#include "tests/support/log_capture.h"
#include "tests/support/net_test_util.h"
#include "tests/support/sanitizers.h"
#include "tests/support/test_buffer.h"

namespace tcpx::testing {
namespace {

using namespace std::chrono_literals;

enum class Transport { kSocket, kFakeTcpx, kFakeTcpxNoWire };

std::string transport_name(const ::testing::TestParamInfo<Transport>& info) {
    switch (info.param) {
        case Transport::kSocket:
            return "SocketNet";
        case Transport::kFakeTcpx:
            return "FakeTcpx";
        default:
            return "FakeTcpxNoWire";
    }
}

// `after` (a whole buffer) holds pattern `seed` at [off, off + len) and is `before` everywhere
// else.
::testing::AssertionResult landed_only_there(const std::vector<uint8_t>& before,
                                             const std::vector<uint8_t>& after, uint64_t off,
                                             uint64_t len, uint64_t seed) {
    if (const int64_t bad = find_pattern_mismatch(after.data() + off, len, seed); bad != -1) {
        return ::testing::AssertionFailure() << "wrong byte at " << off + bad;
    }
    if (std::memcmp(after.data(), before.data(), off) != 0) {
        return ::testing::AssertionFailure() << "changed before " << off;
    }
    if (std::memcmp(after.data() + off + len, before.data() + off + len,
                    after.size() - off - len) != 0) {
        return ::testing::AssertionFailure() << "changed after " << off + len;
    }
    return ::testing::AssertionSuccess();
}

class EngineDevice : public ::testing::TestWithParam<Transport> {
 protected:
    static constexpr size_t kSize = 6 << 20;

    void SetUp() override {
#if TCPX_TEST_REAL_GPU
        if (cuda::device_count() == 0) GTEST_SKIP() << "no GPU";
        gpus_ = cuda::device_count();
#else
        emu_.emplace(2);
        gpus_ = 2;
        // The emulated TCPX plugin's "GPU" memory is then host memory too, GPU or not.
        ::setenv("FAKETCPX_MEMORY", "host", 1);
#endif
        Config config = engine_test_config();
        // Small chunks and the fewest staging slots: many chunks per transfer, the ring wraps.
        config.xfer_chunk_size = 64 * 1024;
        config.staging_slots = 2;
        if (GetParam() != Transport::kSocket) config.net_plugin = TCPX_FAKE_TCPX_PATH;
        if (GetParam() == Transport::kFakeTcpxNoWire) {
            ::setenv("FAKETCPX_NO_WIRE", "1", 1);
            no_wire_set_ = true;
        }
        // Each endpoint serves the GPU of its device buffer (the plugin's bounce buffers land
        // there).
        config.gpu_index = 0;
        a_config_ = config;
        a_ = make_endpoint("alpha", config);
        config.gpu_index = gpus_ - 1;
        b_ = make_endpoint("beta", config);
        ASSERT_TRUE(a_ && b_);
        link_ = link(a_.get(), b_.get());
        ASSERT_NE(link_.a_to_b, 0u);
        // a: host and GPU 0; b: host and the last GPU.
        add(a_.get(), host_buffer(kSize), &a_bufs_);
        add(a_.get(), device_buffer(kSize, 0, emulation()), &a_bufs_);
        add(b_.get(), host_buffer(kSize), &b_bufs_);
        add(b_.get(), device_buffer(kSize, gpus_ - 1, emulation()), &b_bufs_);
    }

    void TearDown() override {
        for (auto* bufs : {&a_bufs_, &b_bufs_}) {
            for (auto& r : *bufs) EXPECT_TRUE(r.buf->canaries_intact());
        }
        a_.reset();
        b_.reset();
        a_bufs_.clear();
        b_bufs_.clear();
        if (no_wire_set_) ::unsetenv("FAKETCPX_NO_WIRE");
    }

    HostDevice* emulation() { return emu_ ? &emu_->get() : nullptr; }

    struct Reg {
        std::unique_ptr<TestBuffer> buf;
        MemId mem = 0;
        RemoteMem desc;
    };
    void add(Endpoint* ep, std::unique_ptr<TestBuffer> buf, std::vector<Reg>* out) {
        ASSERT_NE(buf, nullptr) << "allocation failed";
        Reg r;
        auto mem = ep->reg(buf->data(), buf->size());
        ASSERT_TRUE(mem.ok()) << mem.status().to_string();
        r.mem = *mem;
        r.desc = *ep->describe(r.mem);
        r.buf = std::move(buf);
        out->push_back(std::move(r));
    }

    // An endpoint without a progress thread (the caller's calls do everything) connected to b_,
    // with one device buffer of kSize on GPU 0 in `bufs` (which outlives it, whatever fails).
    void polled_endpoint(std::unique_ptr<Endpoint>* ep, PeerId* to_b, std::vector<Reg>* bufs) {
        Config config = a_config_;
        config.progress_thread = "off";
        *ep = make_endpoint("polled", config);
        ASSERT_NE(*ep, nullptr);
        auto peer = (*ep)->connect(b_->metadata());
        ASSERT_TRUE(peer.ok()) << peer.status().to_string();
        *to_b = *peer;
        add(ep->get(), device_buffer(kSize, 0, emulation()), bufs);
    }

    // Two more endpoints with `config`, as the fixture's pair: "alpha-<suffix>" serving GPU 0 and
    // "beta-<suffix>" the last GPU, connected.
    struct Pair {
        std::unique_ptr<Endpoint> a, b;
        Link link;
    };
    void connected_pair(Config config, const std::string& suffix, Pair* out) {
        config.gpu_index = 0;
        out->a = make_endpoint("alpha-" + suffix, config);
        config.gpu_index = gpus_ - 1;
        out->b = make_endpoint("beta-" + suffix, config);
        ASSERT_TRUE(out->a && out->b);
        out->link = link(out->a.get(), out->b.get());
        ASSERT_NE(out->link.a_to_b, 0u);
    }

    // Two endpoints over the emulated plugin copying every third piece of each CUDA receive to
    // its place itself (FAKETCPX_LINEAR=3, as Google's does with data the NIC left in host
    // memory), with a device buffer each.
    void linear_pair(const Config& config, Pair* pair, std::vector<Reg>* abufs,
                     std::vector<Reg>* bbufs) {
        ::setenv("FAKETCPX_LINEAR", "3", 1);
        connected_pair(config, "linear", pair);
        ::unsetenv("FAKETCPX_LINEAR");
        ASSERT_NE(pair->a, nullptr);
        add(pair->a.get(), device_buffer(kSize, 0, emulation()), abufs);
        add(pair->b.get(), device_buffer(kSize, gpus_ - 1, emulation()), bbufs);
    }

    // 200 small pieces (1 B to 6000 B, several to a 64 KiB chunk, unaligned gaps) from `from` to
    // `to`, `from`'s filled with a pattern of the piece's seed.
    void small_pieces(uint64_t seed, const Reg& from, const Reg& to, std::vector<IoVec>* iov,
                      std::vector<uint64_t>* seeds) {
        std::mt19937_64 rng(seed);
        uint64_t local = 0, remote = 0;
        for (int k = 0; k < 200; ++k) {
            const uint64_t len = 1 + rng() % 6000;
            iov->push_back(IoVec{from.mem, local, to.desc, remote, len});
            seeds->push_back(rng());
            fill(from.buf.get(), local, len, seeds->back());
            local += len + rng() % 9;
            remote += len + rng() % 9;
        }
    }

    // The least MAX_STAGING_BYTES_TOTAL takes with `c`'s chunks and slots: a channel's gather
    // ring and GPU twin, for a send and for a receive (sends leave one for receives).
    static uint64_t least_staging(const Config& c) {
        return 2 * ((2 * static_cast<uint64_t>(c.staging_slots) + 1) * c.xfer_chunk_size + 16384);
    }
    // The staging tests' server: alpha's settings with the least staging total, serving the last
    // GPU, its device buffer of kSize in `bufs`.
    Config staging_config() const {
        Config c = a_config_;
        c.gpu_index = gpus_ - 1;
        c.max_staging_bytes_total = least_staging(c);
        return c;
    }
    void staging_server(const Config& config, std::unique_ptr<Endpoint>* server,
                        std::vector<Reg>* bufs) {
        *server = make_endpoint("staging-server", config);
        ASSERT_NE(*server, nullptr);
        add(server->get(), device_buffer(kSize, gpus_ - 1, emulation()), bufs);
    }

    void fill(TestBuffer* b, uint64_t off, size_t len, uint64_t seed) {
        std::vector<uint8_t> v(len);
        fill_pattern(v.data(), len, seed);
        b->upload(off, v.data(), len);
    }
    int64_t mismatch(TestBuffer* b, uint64_t off, size_t len, uint64_t seed) {
        return find_pattern_mismatch(b->download(off, len).data(), len, seed);
    }

    Status write(const Reg& from, uint64_t off, const Reg& to, uint64_t roff, uint64_t len) {
        auto x = a_->write(link_.a_to_b, from.mem, off, to.desc, roff, len);
        if (!x.ok()) return x.status();
        return a_->wait(*x, 30s);
    }
    Status read(const Reg& into, uint64_t off, const Reg& from, uint64_t roff, uint64_t len) {
        auto x = a_->read(link_.a_to_b, into.mem, off, from.desc, roff, len);
        if (!x.ok()) return x.status();
        return a_->wait(*x, 30s);
    }

    std::optional<ScopedHostDevice> emu_;
    Config a_config_;  // alpha's
    bool no_wire_set_ = false;
    int gpus_ = 0;
    std::unique_ptr<Endpoint> a_, b_;
    Link link_;
    std::vector<Reg> a_bufs_, b_bufs_;  // [0] host, [1] device
};

TEST_P(EngineDevice, DescriptorsSayKindAndGpu) {
    EXPECT_EQ(a_bufs_[0].desc.kind, MemKind::kHost);
    EXPECT_EQ(a_bufs_[1].desc.kind, MemKind::kCuda);
    EXPECT_EQ(a_bufs_[1].desc.device, 0);
    EXPECT_EQ(b_bufs_[1].desc.kind, MemKind::kCuda);
    EXPECT_EQ(b_bufs_[1].desc.device, gpus_ - 1);
    // A registration of part of a device buffer is device memory too.
    auto part = a_->reg(a_bufs_[1].buf->data() + 4097, 10000);
    ASSERT_TRUE(part.ok());
    EXPECT_EQ(a_->describe(*part)->kind, MemKind::kCuda);
    EXPECT_TRUE(a_->dereg(*part).ok());
}

// A registration of GPU memory must be GPU memory throughout: the engine's kernels and copies
// would otherwise fault past its end (killing the context) or touch what lies there. Only its
// start pointer was looked at.
// On a real GPU the memory right past a cudaMalloc may be another allocation, which is GPU memory
// too (CudaMemory.ARangeMustBeMappedThroughout covers the real check); the emulation knows
// each buffer's end.
TEST_P(EngineDevice, ARegistrationPastItsGpuAllocationIsRefused) {
    if (GetParam() != Transport::kSocket) GTEST_SKIP() << "no network involved";
    if (emulation() == nullptr) GTEST_SKIP() << "adjacent allocations on a real GPU";
    const Reg& dev = a_bufs_[1];
    auto past = a_->reg(dev.buf->data() + 4096, kSize + (2 << 20));
    EXPECT_EQ(past.status().code(), StatusCode::kOutOfRange) << past.status().to_string();
    auto inside = a_->reg(dev.buf->data() + 4096, kSize - 4096);
    ASSERT_TRUE(inside.ok()) << inside.status().to_string();
    EXPECT_TRUE(a_->dereg(*inside).ok());
}

TEST_P(EngineDevice, EveryMixOfHostAndDeviceMemoryWriteAndRead) {
    // Inline-sized, chunk-sized and many-chunk lengths at odd offsets.
    const uint64_t lens[] = {
        1, 100, 8192, 8193, 64 * 1024, 64 * 1024 + 1, 3 * 64 * 1024 + 123, (1 << 20) + 7, 5 << 20};
    std::mt19937_64 rng(99);
    uint64_t seed = 1;
    for (int src = 0; src < 2; ++src) {
        for (int dst = 0; dst < 2; ++dst) {
            for (uint64_t len : lens) {
                SCOPED_TRACE("src " + std::string(src ? "device" : "host") + " dst " +
                             (dst ? "device" : "host") + " len " + std::to_string(len));
                const Reg& from = a_bufs_[static_cast<size_t>(src)];
                const Reg& to = b_bufs_[static_cast<size_t>(dst)];
                const uint64_t off = rng() % (kSize - len + 1);
                const uint64_t roff = rng() % (kSize - len + 1);
                ++seed;
                fill(from.buf.get(), off, len, seed);
                std::vector<uint8_t> before = to.buf->download(0, kSize);
                ASSERT_TRUE(write(from, off, to, roff, len).ok());
                std::vector<uint8_t> after = to.buf->download(0, kSize);
                ASSERT_TRUE(landed_only_there(before, after, roff, len, seed));
                // Read it back into the other kind of memory on a.
                const Reg& back = a_bufs_[static_cast<size_t>(1 - src)];
                const uint64_t boff = rng() % (kSize - len + 1);
                std::vector<uint8_t> zeros(len, 0);
                back.buf->upload(boff, zeros.data(), len);
                ASSERT_TRUE(read(back, boff, to, roff, len).ok());
                ASSERT_EQ(mismatch(back.buf.get(), boff, len, seed), -1);
            }
        }
    }
#if !TCPX_TEST_REAL_GPU
    // The device paths ran, not some host shortcut.
    if (GetParam() == Transport::kSocket) {
        EXPECT_GT(emulation()->ring_copies(), 0u);
    } else {
        EXPECT_GT(emulation()->unpacks(), 0u);
    }
    EXPECT_GT(emulation()->rings_made(), 0);
#endif
}

TEST_P(EngineDevice, ManyTransfersInFlightAtOnce) {
    constexpr int kN = 24;
    constexpr uint64_t kLen = 200 * 1024 + 5;  // several chunks each
    const Reg& from = a_bufs_[1];
    const Reg& to = b_bufs_[1];
    std::vector<XferId> ids;
    for (int i = 0; i < kN; ++i) fill(from.buf.get(), i * kLen, kLen, 500 + i);
    for (int i = 0; i < kN; ++i) {
        auto x = a_->write(link_.a_to_b, from.mem, i * kLen, to.desc, i * kLen, kLen);
        ASSERT_TRUE(x.ok()) << x.status().to_string();
        ids.push_back(*x);
    }
    for (XferId id : ids) ASSERT_TRUE(a_->wait(id, 30s).ok());
    for (int i = 0; i < kN; ++i) ASSERT_EQ(mismatch(to.buf.get(), i * kLen, kLen, 500 + i), -1);
    // Reads into host memory, all in flight together, from device memory.
    const Reg& into = a_bufs_[0];
    ids.clear();
    for (int i = 0; i < kN; ++i) {
        auto x = a_->read(link_.a_to_b, into.mem, i * kLen, to.desc, i * kLen, kLen);
        ASSERT_TRUE(x.ok());
        ids.push_back(*x);
    }
    for (XferId id : ids) ASSERT_TRUE(a_->wait(id, 30s).ok());
    for (int i = 0; i < kN; ++i) ASSERT_EQ(mismatch(into.buf.get(), i * kLen, kLen, 500 + i), -1);
}

TEST_P(EngineDevice, SendRecvBetweenKinds) {
    struct Case {
        int src;
        int dst;
        uint64_t len;
    };
    const Case cases[] = {{1, 1, 100},     {1, 1, 3 << 20}, {0, 1, 70000},
                          {1, 0, 1 << 20}, {1, 1, 0},       {1, 0, 9000}};
    uint64_t tag = 10;
    for (const Case& c : cases) {
        SCOPED_TRACE("len " + std::to_string(c.len));
        const Reg& from = a_bufs_[static_cast<size_t>(c.src)];
        const Reg& to = b_bufs_[static_cast<size_t>(c.dst)];
        fill(from.buf.get(), 11, c.len, tag);
        auto r = b_->recv(link_.b_to_a, to.mem, 4099, c.len + 10, tag);
        auto s = a_->send(link_.a_to_b, from.mem, 11, c.len, tag);
        ASSERT_TRUE(r.ok() && s.ok());
        ASSERT_TRUE(a_->wait(*s, 30s).ok());
        ASSERT_TRUE(b_->wait(*r, 30s).ok());
        ASSERT_EQ(mismatch(to.buf.get(), 4099, c.len, tag), -1);
        ++tag;
    }
}

TEST_P(EngineDevice, VectorTransfersAcrossKinds) {
    std::mt19937_64 rng(7);
    for (int round = 0; round < 6; ++round) {
        std::vector<IoVec> iov;
        std::vector<uint64_t> seeds;
        uint64_t local = 0, remote = 0;
        for (int k = 0; k < 8; ++k) {
            const uint64_t len = rng() % (300 * 1024);
            const Reg& from = a_bufs_[rng() % 2];
            const Reg& to = b_bufs_[rng() % 2];
            // Pieces never overlap: each gets its own slice of both sides.
            IoVec v;
            v.mem = from.mem;
            v.offset = local;
            v.remote = to.desc;
            v.remote_offset = remote;
            v.len = len;
            local += len + rng() % 5000;
            remote += len + rng() % 5000;
            seeds.push_back(rng());
            fill(from.buf.get(), v.offset, len, seeds.back());
            iov.push_back(v);
        }
        auto w = a_->writev(link_.a_to_b, iov);
        ASSERT_TRUE(w.ok());
        ASSERT_TRUE(a_->wait(*w, 30s).ok());
        for (size_t k = 0; k < iov.size(); ++k) {
            TestBuffer* to =
                iov[k].remote.kind == MemKind::kCuda ? b_bufs_[1].buf.get() : b_bufs_[0].buf.get();
            ASSERT_EQ(mismatch(to, iov[k].remote_offset, iov[k].len, seeds[k]), -1) << k;
        }
        // And back into the other kind: readv with local and remote swapped roles.
        for (IoVec& v : iov) {
            const bool was_device = v.mem == a_bufs_[1].mem;
            v.mem = a_bufs_[was_device ? 0 : 1].mem;
        }
        auto r = a_->readv(link_.a_to_b, iov);
        ASSERT_TRUE(r.ok());
        ASSERT_TRUE(a_->wait(*r, 30s).ok());
        for (size_t k = 0; k < iov.size(); ++k) {
            TestBuffer* into =
                iov[k].mem == a_bufs_[1].mem ? a_bufs_[1].buf.get() : a_bufs_[0].buf.get();
            ASSERT_EQ(mismatch(into, iov[k].offset, iov[k].len, seeds[k]), -1) << k;
        }
    }
}

TEST_P(EngineDevice, ManySmallPiecesOfEveryKindPackedIntoChunks) {
    // Hundreds of pieces, most far smaller than the 64 KiB chunk: chunks of several pieces are
    // gathered and scattered through staging, all host, all GPU (the copy kernel on a real GPU)
    // or mixed; larger pieces are cut across chunks. Every byte checked, nothing else touched.
    std::mt19937_64 rng(31);
    for (int round = 0; round < 4; ++round) {
        SCOPED_TRACE("round " + std::to_string(round));
        // Round 0: all GPU on both sides; 1: all host; then mixed.
        std::vector<IoVec> iov;
        std::vector<uint64_t> seeds;
        uint64_t local = rng() % 32, remote = rng() % 32;
        for (int k = 0; k < 400; ++k) {
            const uint64_t len = rng() % 8 == 0 ? rng() % (200 * 1024) : 1 + rng() % 6000;
            if (local + len > kSize || remote + len > kSize) break;
            const size_t fi = round == 0 ? 1 : round == 1 ? 0 : rng() % 2;
            const size_t ti = round == 0 ? 1 : round == 1 ? 0 : rng() % 2;
            iov.push_back(IoVec{a_bufs_[fi].mem, local, b_bufs_[ti].desc, remote, len});
            seeds.push_back(rng());
            fill(a_bufs_[fi].buf.get(), local, len, seeds.back());
            local += len + rng() % 9;
            remote += len + rng() % 9;
        }
        const uint64_t direct_before = emulation() ? emulation()->direct_unpacks() : 0;
        auto w = a_->writev(link_.a_to_b, iov);
        ASSERT_TRUE(w.ok()) << w.status().to_string();
        Status st = a_->wait(*w, 60s);
        ASSERT_TRUE(st.ok()) << st.to_string();
        for (size_t k = 0; k < iov.size(); ++k) {
            TestBuffer* to = b_bufs_[iov[k].remote.kind == MemKind::kCuda ? 1 : 0].buf.get();
            ASSERT_EQ(mismatch(to, iov[k].remote_offset, iov[k].len, seeds[k]), -1) << k;
        }
        if (emulation() != nullptr && GetParam() == Transport::kFakeTcpx && round == 0) {
            // Over UNPACK, chunks of several GPU pieces were unpacked straight into them.
            EXPECT_GT(emulation()->direct_unpacks(), direct_before);
        }
        // Read them back into the other kind on a's side, at the same offsets.
        for (IoVec& v : iov) v.mem = a_bufs_[v.mem == a_bufs_[1].mem ? 0 : 1].mem;
        auto r = a_->readv(link_.a_to_b, iov);
        ASSERT_TRUE(r.ok()) << r.status().to_string();
        st = a_->wait(*r, 60s);
        ASSERT_TRUE(st.ok()) << st.to_string();
        for (size_t k = 0; k < iov.size(); ++k) {
            TestBuffer* into = a_bufs_[iov[k].mem == a_bufs_[1].mem ? 1 : 0].buf.get();
            ASSERT_EQ(mismatch(into, iov[k].offset, iov[k].len, seeds[k]), -1) << k;
        }
    }
}

// Over the socket transport, chunks received into the staging that a copy into GPU memory reads
// next are written back out of the CPU's caches as they land (Net::hint_device_reads; 64 KiB
// chunks here, under the transport's 1 MiB bound; counted whether or not the CPU can): so are
// a WRITE into GPU memory at the target, a READ into it at the initiator and a vector of GPU
// pieces; receives into host memory, and the sending sides, are not. Every byte checked.
TEST_P(EngineDevice, ReceivesAGpuCopyReadsNextAreWrittenBack) {
    if (GetParam() != Transport::kSocket) GTEST_SKIP() << "the socket transport's receives";
    const Reg& a_host = a_bufs_[0];
    const Reg& a_gpu = a_bufs_[1];
    const Reg& b_host = b_bufs_[0];
    const Reg& b_gpu = b_bufs_[1];
    constexpr uint64_t kLen = 1 << 20;  // past every inline limit: data channels
    struct Case {
        const char* what;
        bool read;
        const Reg* local;
        const Reg* remote;
        bool written_back;
    };
    const Case cases[] = {
        {"WRITE host to GPU", false, &a_host, &b_gpu, true},
        {"WRITE GPU to host", false, &a_gpu, &b_host, false},
        {"WRITE host to host", false, &a_host, &b_host, false},
        {"READ GPU into host", true, &a_host, &b_gpu, false},
        {"READ host into GPU", true, &a_gpu, &b_host, true},
    };
    uint64_t seed = 40;
    for (const Case& c : cases) {
        SCOPED_TRACE(c.what);
        const Reg& from = c.read ? *c.remote : *c.local;
        const Reg& to = c.read ? *c.local : *c.remote;
        fill(from.buf.get(), 3, kLen, ++seed);
        const uint64_t before = bytes_written_back();
        const Status st =
            c.read ? read(*c.local, 5, *c.remote, 3, kLen) : write(*c.local, 3, *c.remote, 5, kLen);
        ASSERT_TRUE(st.ok()) << st.to_string();
        const uint64_t written = bytes_written_back() - before;
        EXPECT_EQ(mismatch(to.buf.get(), 5, kLen, seed), -1);
        if (c.written_back) {
            EXPECT_EQ(written, kLen);
        } else {
            EXPECT_EQ(written, 0u);
        }
    }
    // Pieces of GPU memory packed into chunks: received into the gather slots, scattered next.
    std::vector<IoVec> iov;
    uint64_t total = 0;
    for (uint64_t k = 0; k < 64; ++k) {
        iov.push_back(IoVec{a_gpu.mem, k * 9000 + 1, b_gpu.desc, k * 8000 + 2, 7000});
        fill(a_gpu.buf.get(), iov.back().offset, 7000, 900 + k);
        total += 7000;
    }
    const uint64_t before = bytes_written_back();
    auto w = a_->writev(link_.a_to_b, iov);
    ASSERT_TRUE(w.ok()) << w.status().to_string();
    const Status st = a_->wait(*w, 30s);
    ASSERT_TRUE(st.ok()) << st.to_string();
    EXPECT_EQ(bytes_written_back() - before, total);
    for (uint64_t k = 0; k < iov.size(); ++k) {
        EXPECT_EQ(mismatch(b_gpu.buf.get(), iov[k].remote_offset, 7000, 900 + k), -1) << k;
    }
}

// STAGE_TIMES=on: when the peer goes, each side logs how many chunks it sent and received and
// their time per stage; off (the default), nothing. A WRITE and a READ of four 64 KiB chunks
// each, GPU memory on both sides (staging copies on both).
TEST_P(EngineDevice, StageTimesAreLoggedWhenThePeerGoes) {
    if (GetParam() != Transport::kSocket) GTEST_SKIP() << "the engine's own stages: one transport";
    for (const bool on : {true, false}) {
        SCOPED_TRACE(on ? "on" : "off");
        testing::LogCapture capture(LogLevel::kInfo);
        Config config = a_config_;
        config.stage_times = on ? "on" : "off";
        Pair pair;
        connected_pair(config, "st", &pair);
        if (HasFatalFailure()) return;
        auto& a = pair.a;
        auto& b = pair.b;
        const Link& l = pair.link;
        std::vector<Reg> abufs, bbufs;
        add(a.get(), device_buffer(kSize, 0, emulation()), &abufs);
        add(b.get(), device_buffer(kSize, gpus_ - 1, emulation()), &bbufs);
        constexpr uint64_t kLen = 256 * 1024;  // four chunks of the fixture's 64 KiB
        fill(abufs[0].buf.get(), 0, kLen, 71);
        auto w = a->write(l.a_to_b, abufs[0].mem, 0, bbufs[0].desc, 0, kLen);
        ASSERT_TRUE(w.ok()) << w.status().to_string();
        ASSERT_TRUE(a->wait(*w, 30s).ok());
        auto r = a->read(l.a_to_b, abufs[0].mem, kLen, bbufs[0].desc, 0, kLen);
        ASSERT_TRUE(r.ok()) << r.status().to_string();
        ASSERT_TRUE(a->wait(*r, 30s).ok());
        EXPECT_EQ(mismatch(abufs[0].buf.get(), kLen, kLen, 71), -1);
        a.reset();
        b.reset();
        const int expected = on ? 1 : 0;
        for (const char* line : {"endpoint 'alpha-st': peer 'beta-st' sent: 4 chunks; per chunk",
                                 "endpoint 'alpha-st': peer 'beta-st' received: 4 chunks;",
                                 "endpoint 'beta-st': peer 'alpha-st' sent: 4 chunks;",
                                 "endpoint 'beta-st': peer 'alpha-st' received: 4 chunks;"}) {
            EXPECT_EQ(capture.count(line), expected) << line;
        }
        EXPECT_EQ(capture.count("us in the transport"), on ? 4 : 0);
    }
}

TEST_P(EngineDevice, ShortGpuTransfersAreCutInSubChunksBothSidesAgreeOn) {
    // With 1 MiB chunks, transfers of 1 to 3 MiB touching GPU memory are cut in about four
    // (packer::transfer_chunk, carried by the request); host-only ones are not. Every byte
    // checked; on the emulation, the staging copies counted prove the cut.
    Config config = a_config_;
    config.xfer_chunk_size = 1 << 20;
    config.staging_slots = 4;
    Pair pair;
    connected_pair(config, "1m", &pair);
    if (HasFatalFailure()) return;
    auto& a = pair.a;
    auto& b = pair.b;
    const Link& l = pair.link;
    std::vector<Reg> abufs, bbufs;
    add(a.get(), host_buffer(kSize), &abufs);
    add(a.get(), device_buffer(kSize, 0, emulation()), &abufs);
    add(b.get(), host_buffer(kSize), &bbufs);
    add(b.get(), device_buffer(kSize, gpus_ - 1, emulation()), &bbufs);
    uint64_t seed = 500;
    for (const uint64_t len : {uint64_t{1} << 20, (uint64_t{3} << 20) + 5, uint64_t{300000}}) {
        for (int from = 0; from < 2; ++from) {
            for (int to = 0; to < 2; ++to) {
                SCOPED_TRACE(std::to_string(len) + " bytes, " + std::to_string(from) + " -> " +
                             std::to_string(to));
                const uint64_t copies_before = emulation() ? emulation()->ring_copies() : 0;
                fill(abufs[from].buf.get(), 7, len, ++seed);
                auto w = a->write(l.a_to_b, abufs[from].mem, 7, bbufs[to].desc, 11, len);
                ASSERT_TRUE(w.ok());
                Status st = a->wait(*w, 30s);
                ASSERT_TRUE(st.ok()) << st.to_string();
                ASSERT_EQ(mismatch(bbufs[to].buf.get(), 11, len, seed), -1);
                // And back: read b's bytes into a's other kind.
                auto r = a->read(l.a_to_b, abufs[1 - from].mem, 3, bbufs[to].desc, 11, len);
                ASSERT_TRUE(r.ok());
                st = a->wait(*r, 30s);
                ASSERT_TRUE(st.ok()) << st.to_string();
                ASSERT_EQ(mismatch(abufs[1 - from].buf.get(), 3, len, seed), -1);
                if (emulation() != nullptr && GetParam() == Transport::kSocket) {
                    // Over the socket net every GPU chunk is one staging copy per side: the
                    // write and the read each touch GPU memory on at least one side, so each
                    // was cut in chunks of max(len / 4, 128 KiB).
                    const uint64_t sub =
                        std::max<uint64_t>(((len + 3) / 4 + 4095) & ~4095ull, 128 * 1024);
                    const uint64_t chunks = (len + sub - 1) / sub;
                    const int gpu_ends = (from == 1) + (to == 1) + (1 - from == 1) + (to == 1);
                    EXPECT_EQ(emulation()->ring_copies() - copies_before,
                              chunks * static_cast<uint64_t>(gpu_ends));
                }
            }
        }
    }
    for (auto* bufs : {&abufs, &bbufs}) {
        for (auto& reg : *bufs) EXPECT_TRUE(reg.buf->canaries_intact());
    }
    a.reset();
    b.reset();
}

// The calling thread's current GPU, as the application sees it.
int caller_gpu() {
#if TCPX_TEST_REAL_GPU
    int d = -1;
    return cudaGetDevice(&d) == cudaSuccess ? d : -1;
#else
    return HostDevice::current();
#endif
}

void set_caller_gpu(int d) {
#if TCPX_TEST_REAL_GPU
    ASSERT_EQ(cudaSetDevice(d), cudaSuccess);
#else
    HostDevice::set_current(d);
#endif
}

TEST_P(EngineDevice, TheCallersCurrentGpuIsLeftAsItWas) {
    // The engine makes its GPU current for the transport's listen, connect and accept and for
    // its copies and kernels, in whatever thread makes progress: here the application's, which
    // has another GPU current. Every call must leave that one current, as NCCL's calls do.
    if (gpus_ < 2) GTEST_SKIP() << "one GPU: the engine's GPU is the caller's";
    const int mine = gpus_ - 1;  // the caller's; the polled endpoint serves GPU 0
    set_caller_gpu(mine);
    Config polled_config = a_config_;
    polled_config.progress_thread = "off";  // the caller's calls do everything
    std::vector<Reg> polled_bufs;
    auto polled = make_endpoint("polled", polled_config);
    ASSERT_NE(polled, nullptr);
    auto to_b = polled->connect(b_->metadata());
    ASSERT_TRUE(to_b.ok()) << to_b.status().to_string();
    EXPECT_EQ(caller_gpu(), mine) << "after connect()";
    add(polled.get(), device_buffer(kSize, 0, emulation()), &polled_bufs);
    set_caller_gpu(mine);  // the test's own allocation may have changed it
    const Reg& ours = polled_bufs[0];
    const Reg& theirs = b_bufs_[1];
    uint64_t seed = 1200;
    for (const uint64_t len : {uint64_t{100}, uint64_t{3} << 20}) {
        SCOPED_TRACE(len);
        fill(ours.buf.get(), 5, len, ++seed);
        set_caller_gpu(mine);
        auto w = polled->write(*to_b, ours.mem, 5, theirs.desc, 9, len);
        ASSERT_TRUE(w.ok()) << w.status().to_string();
        EXPECT_EQ(caller_gpu(), mine) << "after write()";
        ASSERT_TRUE(polled->wait(*w, 30s).ok());
        EXPECT_EQ(caller_gpu(), mine) << "after wait() of a write";
        EXPECT_EQ(mismatch(theirs.buf.get(), 9, len, seed), -1);

        fill(theirs.buf.get(), 11, len, ++seed);
        set_caller_gpu(mine);
        auto r = polled->read(*to_b, ours.mem, 13, theirs.desc, 11, len);
        ASSERT_TRUE(r.ok()) << r.status().to_string();
        ASSERT_TRUE(polled->wait(*r, 30s).ok());
        EXPECT_EQ(caller_gpu(), mine) << "after wait() of a read";
        EXPECT_EQ(mismatch(ours.buf.get(), 13, len, seed), -1);
    }
#if TCPX_TEST_REAL_GPU
    // The caller's pending CUDA error is its own (gpu.md): a registration of GPU 0 memory from
    // a thread with another GPU current, which switches to GPU 0 and back, leaves it pending
    // (putting the caller's GPU back cleared it).
    set_caller_gpu(mine);
    ASSERT_NE(cudaSetDevice(1 << 20), cudaSuccess);
    auto again = polled->reg(ours.buf->data(), 4096);
    ASSERT_TRUE(again.ok()) << again.status().to_string();
    EXPECT_EQ(cudaPeekAtLastError(), cudaErrorInvalidDevice) << "the caller's error was taken";
    cudaGetLastError();
    EXPECT_TRUE(polled->dereg(*again).ok());
#endif
    polled.reset();
    EXPECT_EQ(caller_gpu(), mine) << "after the endpoint's destruction";
    EXPECT_TRUE(ours.buf->canaries_intact());
}

TEST_P(EngineDevice, ReadNotificationFollowsTheDataIntoDeviceMemory) {
    // Into device memory, chunks still go through staging or the unpack kernel after the
    // transport delivered them: the target must hear of the read only after that. Two
    // initiators: a_, whose progress thread sends the notification while the application does
    // not poll; and one without a progress thread, polled one step at a time, standing still
    // between steps while the target listens, so a notification sent a step too early is seen
    // with the data still incomplete.
    std::vector<Reg> polled_bufs;  // outlives the endpoint, whatever fails
    std::unique_ptr<Endpoint> polled;
    PeerId to_b = 0;
    ASSERT_NO_FATAL_FAILURE(polled_endpoint(&polled, &to_b, &polled_bufs));
    struct Initiator {
        Endpoint* ep;
        PeerId peer;
        const Reg* into;
        const char* name;
    };
    const Initiator initiators[] = {{a_.get(), link_.a_to_b, &a_bufs_[1], "alpha"},
                                    {polled.get(), to_b, &polled_bufs[0], "polled"}};
    uint64_t seed = 900;
    for (const Initiator& in : initiators) {
        const bool stepped = in.ep == polled.get();
        for (const Reg* from : {&b_bufs_[0], &b_bufs_[1]}) {
            for (uint64_t len : {uint64_t{100}, uint64_t{5} << 20}) {
                SCOPED_TRACE(std::string(in.name) + " from " +
                             (from == &b_bufs_[1] ? "device" : "host") + " len " +
                             std::to_string(len));
                ++seed;
                fill(from->buf.get(), 7, len, seed);
                std::vector<uint8_t> zeros(len, 0);
                in.into->buf->upload(3, zeros.data(), len);
                const std::string payload = "read " + std::to_string(seed);
                auto x = in.ep->read(in.peer, in.into->mem, 3, from->desc, 7, len, payload);
                ASSERT_TRUE(x.ok()) << x.status().to_string();
                std::vector<Notification> got;
                auto heard = [&] {
                    for (Notification& n : b_->get_notifications()) got.push_back(std::move(n));
                    return !got.empty();
                };
                bool reported = false;
                auto step = [&] {
                    XferStatus st = in.ep->poll(*x);
                    EXPECT_NE(st.state, XferState::kFailed) << st.error.to_string();
                    reported = st.state != XferState::kInProgress;
                };
                if (stepped) {
                    while (!reported && !heard()) {
                        step();
                        // Long enough for the target's progress thread to wake up and read
                        // what that step sent, on a busy machine too.
                        const auto until = std::chrono::steady_clock::now() + 5ms;
                        while (!heard() && std::chrono::steady_clock::now() < until) {
                            std::this_thread::yield();
                        }
                    }
                }
                ASSERT_TRUE(eventually(heard, 30s));
                ASSERT_EQ(mismatch(in.into->buf.get(), 3, len, seed), -1)
                    << "notified before the data";
                if (stepped) {
                    while (!reported) step();
                } else {
                    ASSERT_TRUE(in.ep->wait(*x, 30s).ok());
                }
                ASSERT_EQ(got.size(), 1u);
                EXPECT_EQ(got[0].payload, payload);
                EXPECT_EQ(got[0].peer, in.name);
            }
        }
    }
    EXPECT_TRUE(polled_bufs[0].buf->canaries_intact());
}

// A read into device memory cancelled at any point writes nothing there once it reports
// CANCELLED: chunks staged or unpacked for it when it was cancelled land first (their copies and
// kernels finish), the rest lands in scratch; every byte is the old one or the read's. Pieces of
// every size, so that single chunks and packed ones (gather rings, the unpack kernel) are cut.
TEST_P(EngineDevice, ACancelledReadIntoDeviceMemoryWritesNothingOnceItReportsCancelled) {
    std::mt19937_64 rng(31);
    const Reg& into = a_bufs_[1];
    std::vector<std::string> cancelled;
    for (int round = 0; round < 8; ++round) {
        const Reg& from = b_bufs_[round % 2];
        SCOPED_TRACE("round " + std::to_string(round) + " from " + (round % 2 ? "device" : "host"));
        const uint64_t old_seed = 100 + round, seed = 200 + round;
        fill(into.buf.get(), 0, kSize, old_seed);
        fill(from.buf.get(), 0, kSize, seed);
        std::vector<IoVec> iov;
        for (uint64_t at = 0; at < kSize;) {
            const uint64_t len = std::min<uint64_t>(
                round % 4 < 2 ? 1 + rng() % (3000) : 1 + rng() % (400 << 10), kSize - at);
            IoVec v;
            v.mem = into.mem;
            v.offset = at;
            v.remote = from.desc;
            v.remote_offset = at;
            v.len = len;
            iov.push_back(v);
            at += len + rng() % 512;
        }
        const std::string note = "read " + std::to_string(round);
        auto x = a_->readv(link_.a_to_b, iov, note);
        ASSERT_TRUE(x.ok()) << x.status().to_string();
        std::this_thread::sleep_for(std::chrono::microseconds(500 * (round % 3)));
        const Status c = a_->cancel(*x);
        const Status end = a_->wait(*x, 30s);
        if (c.ok() || c.code() == StatusCode::kUnavailable) {
            cancelled.push_back(note);
            EXPECT_EQ(end.code(), StatusCode::kCancelled) << end.to_string();
        } else {
            EXPECT_EQ(c.code(), StatusCode::kFailedPrecondition) << c.to_string();
            EXPECT_TRUE(end.ok()) << end.to_string();
        }
        const std::vector<uint8_t> seen = into.buf->download(0, kSize);
        std::vector<uint8_t> was(kSize), want(kSize);
        fill_pattern(was.data(), kSize, old_seed);
        fill_pattern(want.data(), kSize, seed);
        size_t wrong = 0;
        for (size_t i = 0; i < kSize; ++i) wrong += seen[i] != was[i] && seen[i] != want[i];
        ASSERT_EQ(wrong, 0u) << "bytes that are neither the old ones nor the read's";
        // A read on every channel behind it: once it is done, everything of the cancelled one is.
        ASSERT_TRUE(read(a_bufs_[0], 0, b_bufs_[0], 0, 2 << 20).ok());
        EXPECT_EQ(into.buf->download(0, kSize), seen)
            << "the read wrote into device memory after it reported";
    }
    EXPECT_FALSE(cancelled.empty());
    for (const Notification& n : b_->get_notifications()) {
        EXPECT_EQ(std::count(cancelled.begin(), cancelled.end(), n.payload), 0)
            << "a cancelled read's notification: " << n.payload;
    }
}

TEST_P(EngineDevice, LocalCopiesBetweenKinds) {
    if (GetParam() != Transport::kSocket) GTEST_SKIP() << "no network involved";
    const Reg& host = a_bufs_[0];
    const Reg& dev = a_bufs_[1];
    fill(host.buf.get(), 3, 1 << 20, 71);
    const LocalCopy to_dev[] = {{dev.mem, 4096, host.mem, 3, 1 << 20}};
    ASSERT_TRUE(a_->copy(to_dev).ok());
    EXPECT_EQ(mismatch(dev.buf.get(), 4096, 1 << 20, 71), -1);
    const LocalCopy within_dev[] = {{dev.mem, 2 << 20, dev.mem, 4096, 1 << 20}};
    ASSERT_TRUE(a_->copy(within_dev).ok());
    const LocalCopy to_host[] = {{host.mem, 5 << 20, dev.mem, 2 << 20, 1 << 20}};
    ASSERT_TRUE(a_->copy(to_host).ok());
    EXPECT_EQ(mismatch(host.buf.get(), 5 << 20, 1 << 20, 71), -1);
}

// Staging memory of all peers together stays within MAX_STAGING_BYTES_TOTAL: three peers move GPU
// memory to and from one endpoint at once, single pieces (its staging ring, over the socket
// transport) and vectors of small pieces (its gather ring and GPU twin), where the total holds two
// channels' gather rings and twins and no more (the least it may be). Unbounded, each peer's
// channels kept theirs until the peer went (some 200 MiB a peer at the defaults, MAX_PEERS times).
// Chunks wait for staging that others' channels free once no request uses it; every byte lands, and
// the endpoint never held more than the total. On the emulation its ring work is held at first, so
// that the first channels keep theirs in use and the others wait for certain.
TEST_P(EngineDevice, StagingOfAllPeersTogetherStaysWithinItsTotal) {
    const Config config = staging_config();
    const uint64_t total = config.max_staging_bytes_total;
    std::unique_ptr<Endpoint> server;
    std::vector<Reg> sbufs;
    ASSERT_NO_FATAL_FAILURE(staging_server(config, &server, &sbufs));
    constexpr int kPeers = 3;
    constexpr uint64_t kSlice = kSize / kPeers;  // each peer's part of the server's buffer
    constexpr uint64_t kOne = 1 << 20;           // a single piece, then the pieces after it
    struct Client {
        std::unique_ptr<Endpoint> ep;
        PeerId to = 0;
        std::vector<Reg> bufs;
        std::vector<IoVec> iov;  // [0]: one piece of kOne; then small pieces
        std::vector<uint64_t> seeds;
    };
    std::vector<Client> clients(kPeers);
    std::mt19937_64 rng(41);
    for (int i = 0; i < kPeers; ++i) {
        Client& c = clients[static_cast<size_t>(i)];
        c.ep = make_endpoint("staging-client-" + std::to_string(i), a_config_);
        ASSERT_NE(c.ep, nullptr);
        auto peer = c.ep->connect(server->metadata());
        ASSERT_TRUE(peer.ok()) << peer.status().to_string();
        c.to = *peer;
        add(c.ep.get(), device_buffer(kSize, 0, emulation()), &c.bufs);
        add(c.ep.get(), device_buffer(kSize, 0, emulation()), &c.bufs);
        const uint64_t base = kSlice * static_cast<uint64_t>(i);
        c.iov.push_back(IoVec{c.bufs[0].mem, base, sbufs[0].desc, base, kOne});
        uint64_t at = base + kOne;
        while (true) {
            const uint64_t len = 1 + rng() % 6000;
            if (at + len > base + kSlice) break;
            c.iov.push_back(IoVec{c.bufs[0].mem, at, sbufs[0].desc, at, len});
            at += len + rng() % 9;
        }
        for (const IoVec& v : c.iov) {
            c.seeds.push_back(rng());
            fill(c.bufs[0].buf.get(), v.offset, v.len, c.seeds.back());
        }
    }
    // Until a chunk of this round waits at the server.
    const auto waits_seen = [&](uint64_t before) {
        for (int tries = 0; tries < 1000; ++tries) {
            if (server->stats().staging_waits > before) return true;
            std::this_thread::sleep_for(5ms);
        }
        return false;
    };
    for (bool reading : {false, true}) {
        SCOPED_TRACE(reading ? "readv" : "writev");
        const uint64_t waits_before = server->stats().staging_waits;
        if (emulation() != nullptr) emulation()->hold_ring_work(true);
        std::vector<XferId> xs;
        for (Client& c : clients) {
            std::vector<IoVec> iov = c.iov;
            if (reading) {
                for (IoVec& v : iov) v.mem = c.bufs[1].mem;  // back into its second buffer
            }
            // The single piece on its own (the staging ring), the small ones together.
            auto one = reading ? c.ep->readv(c.to, std::span<const IoVec>(iov.data(), 1))
                               : c.ep->writev(c.to, std::span<const IoVec>(iov.data(), 1));
            ASSERT_TRUE(one.ok()) << one.status().to_string();
            xs.push_back(*one);
            auto rest =
                reading
                    ? c.ep->readv(c.to, std::span<const IoVec>(iov.data() + 1, iov.size() - 1))
                    : c.ep->writev(c.to, std::span<const IoVec>(iov.data() + 1, iov.size() - 1));
            ASSERT_TRUE(rest.ok()) << rest.status().to_string();
            xs.push_back(*rest);
        }
        if (emulation() != nullptr) {
            EXPECT_TRUE(waits_seen(waits_before))
                << "no chunk waited for staging: the total was not in the way";
            emulation()->hold_ring_work(false);
        }
        for (size_t k = 0; k < xs.size(); ++k) {
            Endpoint* ep = clients[k / 2].ep.get();
            const Status st = ep->wait(xs[k], 60s);
            ASSERT_TRUE(st.ok()) << k << ": " << st.to_string();
        }
        for (const Client& c : clients) {
            for (size_t k = 0; k < c.iov.size(); ++k) {
                const IoVec& v = c.iov[k];
                if (!reading) {
                    ASSERT_EQ(mismatch(sbufs[0].buf.get(), v.remote_offset, v.len, c.seeds[k]), -1)
                        << k;
                } else {
                    ASSERT_EQ(mismatch(c.bufs[1].buf.get(), v.offset, v.len, c.seeds[k]), -1) << k;
                }
            }
        }
    }
    const Stats s = server->stats();
    EXPECT_GT(s.staging_peak_bytes, 0u);
    EXPECT_LE(s.staging_peak_bytes, total) << "the staging total was exceeded";
    EXPECT_LE(s.staging_bytes, total);
    if (emulation() != nullptr) {
        EXPECT_GT(s.staging_waits, 0u);
    }
    for (Client& c : clients) c.ep.reset();
}

// A peer that stops sending in the middle of a write holds the staging its chunks were given only
// until it is failed for moving nothing while others wait for it (half PEER_TIMEOUT_MS, named in
// its error; the channels' own stall check would take the whole timeout, and the waiting
// vector's sender, its send waiting meanwhile, could time out first): two stalled peers (each
// one's only data message dropped on its way) hold the whole total with their gather rings and
// twins, and another peer's vector waits. It lands whole once one is failed, and the total was
// never exceeded.
TEST_P(EngineDevice, StagingAStalledPeerHoldsIsFreedWhenItIsFailed) {
    Config config = staging_config();
    const uint64_t total = config.max_staging_bytes_total;
    config.peer_timeout_ms = 1000;  // (stalled peers failed after 500 ms while others wait)
    std::unique_ptr<Endpoint> server;
    std::vector<Reg> sbufs;
    ASSERT_NO_FATAL_FAILURE(staging_server(config, &server, &sbufs));
    struct Client {
        std::unique_ptr<Endpoint> ep;
        Link link;
        std::vector<Reg> bufs;
        std::vector<IoVec> iov;  // ten pieces of 4000 bytes: one chunk
        std::vector<uint64_t> seeds;
        XferId x = 0;
    };
    const size_t stalled = 2;
    std::vector<Client> clients(stalled + 1);  // the last one waits for the others
    Client& waiter = clients.back();
    for (size_t i = 0; i < clients.size(); ++i) {
        Client& c = clients[i];
        Config cc = a_config_;
        cc.peer_timeout_ms = config.peer_timeout_ms;  // (heartbeats: a quarter of it)
        if (i < stalled) cc.fault = "drop:isend:1";
        c.ep = make_endpoint("staging-client-" + std::to_string(i), cc);
        ASSERT_NE(c.ep, nullptr);
        c.link = link(c.ep.get(), server.get());
        ASSERT_NE(c.link.a_to_b, 0u);
        add(c.ep.get(), device_buffer(kSize, 0, emulation()), &c.bufs);
        const uint64_t base = (1 << 20) * i;
        for (uint64_t k = 0; k < 10; ++k) {
            c.iov.push_back(
                IoVec{c.bufs[0].mem, base + k * 5000, sbufs[0].desc, base + k * 5000, 4000});
            c.seeds.push_back(1000 * i + k);
            fill(c.bufs[0].buf.get(), base + k * 5000, 4000, c.seeds.back());
        }
    }
    for (size_t i = 0; i < stalled; ++i) {
        auto x = clients[i].ep->writev(clients[i].link.a_to_b, clients[i].iov);
        ASSERT_TRUE(x.ok()) << x.status().to_string();
        clients[i].x = *x;
    }
    // Until each holds staging at the server.
    bool settled = false;
    for (int tries = 0; tries < 400 && !settled; ++tries) {
        settled = true;
        for (size_t i = 0; i < stalled; ++i) {
            auto s = server->peer_stats(clients[i].link.b_to_a);
            settled = settled && s.ok() && s->staging_bytes > 0;
        }
        if (!settled) std::this_thread::sleep_for(5ms);
    }
    ASSERT_TRUE(settled) << "the stalled peers' chunks never took staging";
    EXPECT_EQ(server->stats().staging_waits, 0u);
    auto y = waiter.ep->writev(waiter.link.a_to_b, waiter.iov);
    ASSERT_TRUE(y.ok()) << y.status().to_string();
    const Status landed = waiter.ep->wait(*y, 30s);
    ASSERT_TRUE(landed.ok()) << landed.to_string();
    for (size_t k = 0; k < waiter.iov.size(); ++k) {
        const IoVec& v = waiter.iov[k];
        EXPECT_EQ(mismatch(sbufs[0].buf.get(), v.remote_offset, v.len, waiter.seeds[k]), -1) << k;
    }
    // At least one failed by the staging rule (its error names it); once the waiting vector has
    // its staging, nothing waits, and another may end by the channels' own stall check instead.
    size_t by_staging_rule = 0;
    for (size_t i = 0; i < stalled; ++i) {
        const Status st = clients[i].ep->wait(clients[i].x, 30s);
        EXPECT_FALSE(st.ok()) << "stalled peer " << i << "'s write completed";
        if (st.message().find("holding staging memory") != std::string::npos) ++by_staging_rule;
    }
    EXPECT_GE(by_staging_rule, 1u) << "no stalled peer was failed for the staging it held";
    const Stats s = server->stats();
    EXPECT_GT(s.staging_waits, 0u) << "the last peer's vector never waited";
    EXPECT_LE(s.staging_peak_bytes, total);
    EXPECT_EQ(s.errors, stalled) << "the stalled peers were not failed, or more were";
    for (Client& c : clients) c.ep.reset();
}

// Peers that keep their channels busy do not keep their staging while another waits: past a time
// slice (20 ms) they take no new chunks onto it, and the waiting peer's vector lands while the
// busy ones still stream. Every peer's bytes checked. (The emulation's streams leave their
// staging unused now and then, which lets a waiting chunk in by itself: without the slice the
// vector landed after 1-635 ms in a few runs, with it after 1-20 ms; the slice is what bounds it
// where a stream never pauses, and this test does not isolate it.)
TEST_P(EngineDevice, StagingABusyPeerGivesItsStagingToAWaitingOne) {
    const Config config = staging_config();
    std::unique_ptr<Endpoint> server;
    std::vector<Reg> sbufs;
    ASSERT_NO_FATAL_FAILURE(staging_server(config, &server, &sbufs));
    // Two busy peers of one channel each hold all of the total, a gather ring and twin each
    // (one channel: a peer's transfers then never wait on a channel of its own that waits for
    // staging, which held a stream of two channels back by itself).
    Config one_channel = a_config_;
    one_channel.channels = 1;
    constexpr int kBusy = 2;
    constexpr uint64_t kStreams = 4;  // vectors in flight per busy peer
    std::unique_ptr<Endpoint> busy[kBusy];
    Link to_busy[kBusy];
    std::vector<Reg> busy_bufs[kBusy];
    for (int b = 0; b < kBusy; ++b) {
        busy[b] = make_endpoint("staging-busy-" + std::to_string(b), one_channel);
        ASSERT_NE(busy[b], nullptr);
        to_busy[b] = link(busy[b].get(), server.get());
        ASSERT_NE(to_busy[b].a_to_b, 0u);
        add(busy[b].get(), device_buffer(kSize, 0, emulation()), &busy_bufs[b]);
    }
    std::unique_ptr<Endpoint> late = make_endpoint("staging-late", a_config_);
    ASSERT_NE(late, nullptr);
    const Link to_late = link(late.get(), server.get());
    ASSERT_NE(to_late.a_to_b, 0u);
    std::vector<Reg> late_bufs;
    add(late.get(), device_buffer(kSize, 0, emulation()), &late_bufs);
    // `n` pieces of 4000 bytes from `from` at `base` to the server's buffer there.
    const auto pieces = [&](const Reg& from, uint64_t base, uint64_t seed, uint64_t n) {
        std::vector<IoVec> iov;
        for (uint64_t k = 0; k < n; ++k) {
            iov.push_back(IoVec{from.mem, base + k * 5000, sbufs[0].desc, base + k * 5000, 4000});
            fill(from.buf.get(), base + k * 5000, 4000, seed + k);
        }
        return iov;
    };
    // Each busy peer: four vectors of 60 pieces (four chunks each) in flight at all times, each
    // to its own place, so that the server's channels always have its chunks queued.
    const auto place = [](int b, uint64_t j) { return (b * kStreams + j) * (512 << 10); };
    std::vector<std::vector<IoVec>> streams[kBusy];
    for (int b = 0; b < kBusy; ++b) {
        for (uint64_t j = 0; j < kStreams; ++j) {
            streams[b].push_back(
                pieces(busy_bufs[b][0], place(b, j), 100 * (b * kStreams + j), 60));
        }
    }
    // (30 pieces: past what a lone WRITE carries inline, 64 KiB, which takes no staging)
    const std::vector<IoVec> late_iov = pieces(late_bufs[0], 5 << 20, 7000, 30);
    std::atomic<bool> stop{false};
    std::atomic<bool> late_done{false};
    std::atomic<int> done_while_busy{0};
    Status stream_status[kBusy];
    std::vector<std::thread> streamers;
    for (int b = 0; b < kBusy; ++b) {
        streamers.emplace_back([&, b] {
            std::vector<XferId> inflight(kStreams, 0);
            bool seen = false;
            const auto until = std::chrono::steady_clock::now() + 30s;  // (a failure's bound)
            while (!stop.load() && std::chrono::steady_clock::now() < until) {
                for (size_t j = 0; j < kStreams; ++j) {
                    if (inflight[j] != 0) {
                        const Status st = busy[b]->wait(inflight[j], 30s);
                        if (!st.ok()) {
                            stream_status[b] = st;
                            return;
                        }
                    }
                    auto x = busy[b]->writev(to_busy[b].a_to_b, streams[b][j]);
                    if (!x.ok()) {
                        stream_status[b] = x.status();
                        return;
                    }
                    inflight[j] = *x;
                    if (late_done.load() && !seen) {
                        seen = true;
                        ++done_while_busy;
                    }
                }
            }
            for (XferId x : inflight) {
                if (x == 0) continue;
                const Status st = busy[b]->wait(x, 30s);
                if (!st.ok()) stream_status[b] = st;
            }
        });
    }
    // Until both busy peers hold staging at the server (all of the total).
    bool held = false;
    for (int tries = 0; tries < 400 && !held; ++tries) {
        held = true;
        for (int b = 0; b < kBusy; ++b) {
            auto st = server->peer_stats(to_busy[b].b_to_a);
            held = held && st.ok() && st->staging_bytes > 0;
        }
        if (!held) std::this_thread::sleep_for(5ms);
    }
    ASSERT_TRUE(held) << "the busy peers never took staging";
    auto x = late->writev(to_late.a_to_b, late_iov);
    ASSERT_TRUE(x.ok()) << x.status().to_string();
    const Status landed = late->wait(*x, 25s);  // (landing after the streams ended: a failure)
    late_done = true;
    // The streams go on a little, so that they are seen going on after the late one landed.
    std::this_thread::sleep_for(50ms);
    stop = true;
    for (auto& t : streamers) t.join();
    ASSERT_TRUE(landed.ok()) << landed.to_string();
    for (int b = 0; b < kBusy; ++b) {
        ASSERT_TRUE(stream_status[b].ok()) << b << ": " << stream_status[b].to_string();
    }
    EXPECT_EQ(done_while_busy.load(), kBusy)
        << "a busy peer's stream had ended when the vector landed";
    for (uint64_t k = 0; k < 30; ++k) {
        EXPECT_EQ(mismatch(sbufs[0].buf.get(), (5 << 20) + k * 5000, 4000, 7000 + k), -1) << k;
    }
    for (int b = 0; b < kBusy; ++b) {
        for (uint64_t j = 0; j < kStreams; ++j) {
            for (uint64_t k = 0; k < 60; ++k) {
                EXPECT_EQ(mismatch(sbufs[0].buf.get(), place(b, j) + k * 5000, 4000,
                                   100 * (b * kStreams + j) + k),
                          -1);
            }
        }
    }
    // (Whether the late vector waited depends on when it came: not asserted.)
    const Stats s = server->stats();
    EXPECT_LE(s.staging_peak_bytes, config.max_staging_bytes_total);
    EXPECT_EQ(s.errors, 0u);
}

// Staging a channel gives up for a waiting one is handed over, not freed and made again (a ring
// of pinned and GPU memory costs milliseconds to make and free, and freeing waits for the device:
// made at every hand-over, eight peers sharing half the staging they wanted moved a tenth of what
// they moved unbounded, on an H200). Four peers, one channel each, write vectors of GPU pieces at
// once through a total that holds the gather rings and twins of two: the server makes no more
// rings once each peer has been served once. (Whether peers meet at the bound depends on how the
// machine schedules them: each goes on past kRounds until one has waited, kMaxRounds at most.)
TEST_P(EngineDevice, StagingHandedOverIsReusedNotMadeAgain) {
    if (emulation() == nullptr) GTEST_SKIP() << "counts the rings the emulation makes";
    const Config config = staging_config();
    std::unique_ptr<Endpoint> server;
    std::vector<Reg> sbufs;
    ASSERT_NO_FATAL_FAILURE(staging_server(config, &server, &sbufs));
    constexpr int kPeers = 4;
    constexpr int kRounds = 10;
    constexpr int kMaxRounds = 500;
    Config one_channel = a_config_;
    one_channel.channels = 1;
    struct Client {
        std::unique_ptr<Endpoint> ep;
        Link link;
        std::vector<Reg> bufs;
        std::vector<IoVec> iov;  // 60 pieces of 4000 bytes: four chunks
        Status status;
    };
    std::vector<Client> clients(kPeers);
    for (int i = 0; i < kPeers; ++i) {
        Client& c = clients[static_cast<size_t>(i)];
        c.ep = make_endpoint("staging-client-" + std::to_string(i), one_channel);
        ASSERT_NE(c.ep, nullptr);
        c.link = link(c.ep.get(), server.get());
        ASSERT_NE(c.link.a_to_b, 0u);
        add(c.ep.get(), device_buffer(kSize, 0, emulation()), &c.bufs);
        const uint64_t base = static_cast<uint64_t>(i) << 20;
        for (uint64_t k = 0; k < 60; ++k) {
            c.iov.push_back(
                IoVec{c.bufs[0].mem, base + k * 5000, sbufs[0].desc, base + k * 5000, 4000});
            fill(c.bufs[0].buf.get(), base + k * 5000, 4000, 1000 * i + k);
        }
    }
    // Each served once, one after the other: every ring the test needs is made by then.
    for (Client& c : clients) {
        auto x = c.ep->writev(c.link.a_to_b, c.iov);
        ASSERT_TRUE(x.ok()) << x.status().to_string();
        ASSERT_TRUE(c.ep->wait(*x, 30s).ok());
    }
    const int made_before = emulation()->rings_made();
    const uint64_t waits_before = server->stats().staging_waits;
    std::vector<std::thread> threads;
    for (Client& c : clients) {
        threads.emplace_back([&c, &server, waits_before] {
            for (int round = 0; round < kMaxRounds && c.status.ok(); ++round) {
                if (round >= kRounds && server->stats().staging_waits > waits_before) break;
                auto x = c.ep->writev(c.link.a_to_b, c.iov);
                c.status = x.ok() ? c.ep->wait(*x, 30s) : x.status();
            }
        });
    }
    for (auto& t : threads) t.join();
    for (int i = 0; i < kPeers; ++i) {
        const Client& c = clients[static_cast<size_t>(i)];
        ASSERT_TRUE(c.status.ok()) << i << ": " << c.status.to_string();
        for (uint64_t k = 0; k < 60; ++k) {
            ASSERT_EQ(mismatch(sbufs[0].buf.get(), c.iov[k].remote_offset, 4000, 1000 * i + k), -1);
        }
    }
    const Stats s = server->stats();
    EXPECT_GT(s.staging_waits, waits_before) << "the peers never waited for each other's staging";
    EXPECT_LE(emulation()->rings_made() - made_before, 1)
        << "rings were made again at hand-overs (" << s.staging_waits - waits_before << " waits)";
    EXPECT_LE(s.staging_peak_bytes, config.max_staging_bytes_total);
}

// The emulated plugin's counts of its CUDA registrations (each holds a descriptor with
// FAKETCPX_MR_FD=1, as each of Google's holds a dma-buf fd) and of its deregMr calls refused
// because a request posted with the registration was not done.
struct FakeMrCounts {
    FakeMrCounts() {
        lib = ::dlopen(TCPX_FAKE_TCPX_PATH, RTLD_NOW);
        if (lib == nullptr) return;
        open = reinterpret_cast<int (*)()>(::dlsym(lib, "faketcpx_open_cuda_mrs"));
        peak = reinterpret_cast<int (*)()>(::dlsym(lib, "faketcpx_peak_cuda_mrs"));
        reset_peak = reinterpret_cast<void (*)()>(::dlsym(lib, "faketcpx_reset_peak_cuda_mrs"));
        busy_deregs = reinterpret_cast<int (*)()>(::dlsym(lib, "faketcpx_busy_deregs"));
    }
    ~FakeMrCounts() {
        if (lib != nullptr) ::dlclose(lib);
    }
    bool ok() const { return open && peak && reset_peak && busy_deregs; }
    void* lib = nullptr;
    int (*open)() = nullptr;
    int (*peak)() = nullptr;
    void (*reset_peak)() = nullptr;
    int (*busy_deregs)() = nullptr;
};

// Descriptors the process holds (/proc/self/fd).
int open_fds() {
    int n = 0;
    if (DIR* d = ::opendir("/proc/self/fd")) {
        while (::readdir(d) != nullptr) ++n;
        ::closedir(d);
    }
    return n;
}

struct BudgetForTest {
    explicit BudgetForTest(uint64_t budget) { set_socket_budget_for_testing(budget); }
    ~BudgetForTest() { set_socket_budget_for_testing(0); }
};

// FAKETCPX_MR_FD=1 while it lives (the emulation's CUDA registrations hold a descriptor each).
struct MrFdsForTest {
    MrFdsForTest() { ::setenv("FAKETCPX_MR_FD", "1", 1); }
    ~MrFdsForTest() { ::unsetenv("FAKETCPX_MR_FD"); }
};

// With a plugin whose GPU registrations each hold a descriptor (Google's: a dma-buf fd per comm
// and registration window), what peers can make the process hold is bounded by the descriptor
// budget (MAX_SOCKETS) it shares with the sockets: here room for five registrations beyond the
// sockets open, and ten GPU regions on each side, each written and read over two channels (forty
// registrations without the bound). Those no request uses are given up, least recently used
// first; none is given up under a request (the emulation refuses such a deregMr, counted), and
// every byte lands. Over the socket transport nothing is counted.
TEST_P(EngineDevice, GpuRegistrationsOfAPluginStayWithinTheDescriptorBudget) {
    FakeMrCounts fake;
    ASSERT_TRUE(fake.ok());
    constexpr int kRegions = 10;
    constexpr uint64_t kLen = 256 << 10;  // four chunks: both channels
    constexpr uint64_t kRoom = 5;         // two channels' registrations a side, and one
    const MrFdsForTest fds;
    std::vector<Reg> mine, theirs;
    for (int i = 0; i < kRegions; ++i) {
        add(a_.get(), device_buffer(kLen, 0, emulation()), &mine);
        add(b_.get(), device_buffer(kLen, gpus_ - 1, emulation()), &theirs);
    }
    const bool counted = GetParam() != Transport::kSocket;
    LogCapture log(LogLevel::kDebug);
    const int busy_before = fake.busy_deregs();
    const int cuda_before = fake.open();
    const int fds_before = open_fds();
    fake.reset_peak();
    {
        BudgetForTest budget(budget_used() + kRoom);
        for (int round = 0; round < 2; ++round) {
            for (int i = 0; i < kRegions; ++i) {
                const auto k = static_cast<size_t>(i);
                fill(mine[k].buf.get(), 0, kLen, 100 * round + i);
                ASSERT_TRUE(write(mine[k], 0, theirs[k], 0, kLen).ok()) << round << " " << i;
                ASSERT_EQ(mismatch(theirs[k].buf.get(), 0, kLen, 100 * round + i), -1) << i;
                fill(theirs[k].buf.get(), 0, kLen, 100 * round + i + 50);
                ASSERT_TRUE(read(mine[k], 0, theirs[k], 0, kLen).ok()) << round << " " << i;
                ASSERT_EQ(mismatch(mine[k].buf.get(), 0, kLen, 100 * round + i + 50), -1) << i;
                EXPECT_LE(registrations_held(), kRoom) << round << " " << i;
            }
        }
        // The budget's places: what the plugin holds, and its descriptors.
        EXPECT_LE(fake.peak() - cuda_before, static_cast<int>(kRoom));
        EXPECT_LE(open_fds() - fds_before, static_cast<int>(kRoom));
    }
    EXPECT_EQ(fake.busy_deregs(), busy_before) << "a registration went under a request";
    if (counted) {
        EXPECT_TRUE(log.contains("GPU registrations no request used given up")) << log.all();
        EXPECT_GT(registrations_held(), 0u);
    } else {
        EXPECT_EQ(registrations_held(), 0u);
    }
    // Unbounded again, every region's registrations stay (the bound was what held them down).
    for (int i = 0; i < kRegions; ++i) {
        const auto k = static_cast<size_t>(i);
        ASSERT_TRUE(write(mine[k], 0, theirs[k], 0, kLen).ok()) << i;
    }
    if (counted) {
        EXPECT_GT(registrations_held(), kRoom);
    }
    for (auto* regs : {&mine, &theirs}) {
        for (Reg& r : *regs) {
            EXPECT_TRUE((regs == &mine ? a_ : b_)->dereg(r.mem).ok());
            EXPECT_TRUE(r.buf->canaries_intact());
        }
    }
    EXPECT_EQ(registrations_held(), 0u) << "places not given back at deregistration";
    EXPECT_EQ(fake.open(), cuda_before);
}

// The registration given up is the one used least recently: with room for four (two a side,
// one channel), region 0 written between every other region's write stays registered on both
// sides, and every other region is registered once: 2 x (1 + 9) registrations in all (region
// 0 given up now and then meant more).
TEST_P(EngineDevice, TheGpuRegistrationGivenUpIsTheLeastRecentlyUsed) {
    if (GetParam() == Transport::kSocket) GTEST_SKIP() << "no registration is counted";
    FakeMrCounts fake;
    ASSERT_TRUE(fake.ok());
    auto made = reinterpret_cast<int (*)()>(::dlsym(fake.lib, "faketcpx_cuda_regs_made"));
    ASSERT_NE(made, nullptr);
    constexpr int kRegions = 10;
    constexpr uint64_t kLen = 64 << 10;  // one chunk
    Config config = a_config_;
    config.channels = 1;
    Pair pair;
    ASSERT_NO_FATAL_FAILURE(connected_pair(config, "lru", &pair));
    std::vector<Reg> mine, theirs;
    for (int i = 0; i < kRegions; ++i) {
        add(pair.a.get(), device_buffer(kLen, 0, emulation()), &mine);
        add(pair.b.get(), device_buffer(kLen, gpus_ - 1, emulation()), &theirs);
    }
    auto write_one = [&](int i, uint64_t seed) {
        const auto k = static_cast<size_t>(i);
        fill(mine[k].buf.get(), 0, kLen, seed);
        auto x = pair.a->write(pair.link.a_to_b, mine[k].mem, 0, theirs[k].desc, 0, kLen);
        ASSERT_TRUE(x.ok()) << x.status().to_string();
        ASSERT_TRUE(pair.a->wait(*x, 30s).ok()) << i;
        ASSERT_EQ(mismatch(theirs[k].buf.get(), 0, kLen, seed), -1) << i;
    };
    const int before = made();
    BudgetForTest budget(budget_used() + 4);
    for (int i = 1; i < kRegions; ++i) {
        ASSERT_NO_FATAL_FAILURE(write_one(0, 100 + i));
        ASSERT_NO_FATAL_FAILURE(write_one(i, i));
        EXPECT_LE(registrations_held(), 4u);
    }
    EXPECT_EQ(made() - before, 2 * kRegions);
}

// Registrations no request uses make way for a newcomer's sockets too: an endpoint whose
// listener finds the budget pressed (what one peer's channels take is not left) takes no one,
// and idle registrations held that room. They are given up on the engine's tick, and the
// newcomer connects and moves its bytes.
TEST_P(EngineDevice, IdleGpuRegistrationsMakeWayForANewPeersSockets) {
    if (GetParam() == Transport::kSocket) GTEST_SKIP() << "no registration is counted";
    constexpr int kRegions = 4;
    constexpr uint64_t kLen = 256 << 10;
    std::vector<Reg> mine, theirs;
    for (int i = 0; i < kRegions; ++i) {
        add(a_.get(), device_buffer(kLen, 0, emulation()), &mine);
        add(b_.get(), device_buffer(kLen, gpus_ - 1, emulation()), &theirs);
        const auto k = static_cast<size_t>(i);
        ASSERT_TRUE(write(mine[k], 0, theirs[k], 0, kLen).ok()) << i;
    }
    const uint64_t held = registrations_held();
    ASSERT_GE(held, 2u * kRegions);  // a's sends and b's receives, each region
    // Room for the newcomer's sockets only once the registrations go: b's listener leaves what
    // one peer's channels take (channels x (2 x (NSOCKS + 1) + 1)) free.
    const uint64_t channel_room = static_cast<uint64_t>(a_config_.channels) *
                                  (2 * (static_cast<uint64_t>(a_config_.nsocks) + 1) + 1);
    BudgetForTest budget(sockets_open() + channel_room + 6);
    ASSERT_TRUE(socket_budget_pressed(channel_room + 1));
    Config config = a_config_;
    config.connect_timeout_ms = 3000;
    auto c = make_endpoint("newcomer", config);
    ASSERT_NE(c, nullptr);
    const Link l = link(c.get(), b_.get());
    ASSERT_NE(l.a_to_b, 0u);
    EXPECT_LT(registrations_held(), held);
    std::vector<Reg> cbufs;
    add(c.get(), host_buffer(kLen), &cbufs);
    fill(cbufs[0].buf.get(), 0, kLen, 77);
    auto x = c->write(l.a_to_b, cbufs[0].mem, 0, theirs[0].desc, 0, kLen);
    ASSERT_TRUE(x.ok()) << x.status().to_string();
    ASSERT_TRUE(c->wait(*x, 30s).ok());
    EXPECT_EQ(mismatch(theirs[0].buf.get(), 0, kLen, 77), -1);
}

// At the descriptor budget with no registration of the endpoint to give up (the places held by
// sockets), a GPU transfer waits for half the peer timeout, then fails with the bound named; the
// endpoint serves on once there is room again.
TEST_P(EngineDevice, AGpuRegistrationWithNoPlaceFailsNamingTheBound) {
    if (GetParam() == Transport::kSocket) GTEST_SKIP() << "no registration is counted";
    FakeMrCounts fake;
    ASSERT_TRUE(fake.ok());
    constexpr uint64_t kLen = 256 << 10;
    Config config = a_config_;
    config.peer_timeout_ms = 2000;  // (the wait: 1 s)
    Pair pair;
    ASSERT_NO_FATAL_FAILURE(connected_pair(config, "full", &pair));
    std::vector<Reg> abufs, bbufs;
    add(pair.a.get(), device_buffer(kLen, 0, emulation()), &abufs);
    add(pair.b.get(), device_buffer(kLen, gpus_ - 1, emulation()), &bbufs);
    fill(abufs[0].buf.get(), 0, kLen, 7);
    {
        BudgetForTest budget(budget_used());
        const auto start = std::chrono::steady_clock::now();
        auto x = pair.a->write(pair.link.a_to_b, abufs[0].mem, 0, bbufs[0].desc, 0, kLen);
        ASSERT_TRUE(x.ok()) << x.status().to_string();
        const Status st = pair.a->wait(*x, 30s);
        EXPECT_FALSE(st.ok());
        EXPECT_GE(std::chrono::steady_clock::now() - start, 900ms) << st.to_string();
        // Whichever side needed a place first failed the peer with the bound in its error.
        const Status a_side = pair.a->peer_status(pair.link.a_to_b);
        const Status b_side = pair.b->peer_status(pair.link.b_to_a);
        const bool named =
            a_side.message().find("descriptors this process gives") != std::string::npos ||
            b_side.message().find("descriptors this process gives") != std::string::npos;
        EXPECT_TRUE(named) << a_side.to_string() << " / " << b_side.to_string();
    }
    EXPECT_EQ(registrations_held(), 0u);
    // Room again: a new connection moves the bytes.
    const Link again = link(pair.a.get(), pair.b.get());
    ASSERT_NE(again.a_to_b, 0u);
    auto x = pair.a->write(again.a_to_b, abufs[0].mem, 0, bbufs[0].desc, 0, kLen);
    ASSERT_TRUE(x.ok()) << x.status().to_string();
    ASSERT_TRUE(pair.a->wait(*x, 30s).ok());
    EXPECT_EQ(mismatch(bbufs[0].buf.get(), 0, kLen, 7), -1);
}

// Inline transfers of GPU memory are one synchronous copy a piece between the control message
// and the GPU, out of it through a pinned buffer up to cuda::Device::kBounceBytes and straight
// past it.
// With every length inline (XFER_INLINE_THRESHOLD at its 1 MiB most), lengths around that bound
// land byte for byte, WRITE and READ, between host and GPU memory and GPU and GPU, and nothing
// around them changes.
TEST_P(EngineDevice, InlineGpuTransfersOfEveryLengthLandWhole) {
    if (GetParam() != Transport::kSocket) GTEST_SKIP() << "the inline path is the engine's own";
    Config config = a_config_;
    config.xfer_inline_threshold = 1 << 20;
    config.xfer_inline_alone_read = 1 << 20;
    Pair pair;
    connected_pair(config, "inline", &pair);
    ASSERT_NE(pair.a, nullptr);
    std::vector<Reg> abufs, bbufs;
    add(pair.a.get(), host_buffer(kSize), &abufs);
    add(pair.a.get(), device_buffer(kSize, 0, emulation()), &abufs);
    add(pair.b.get(), device_buffer(kSize, gpus_ - 1, emulation()), &bbufs);
    constexpr uint64_t kB = cuda::Device::kBounceBytes;
    const uint64_t lens[] = {1, 4095, 8192, kB - 1, kB, kB + 1, 1 << 20};
    uint64_t seed = 700;
    for (int src = 0; src < 2; ++src) {
        for (uint64_t len : lens) {
            SCOPED_TRACE(std::string(src ? "device" : "host") + " len " + std::to_string(len));
            const Reg& from = abufs[static_cast<size_t>(src)];
            const Reg& to = bbufs[0];
            const uint64_t off = 4096 + 3, roff = 65536 + 5;
            fill(from.buf.get(), off, len, ++seed);
            std::vector<uint8_t> before = to.buf->download(0, kSize);
            auto w = pair.a->write(pair.link.a_to_b, from.mem, off, to.desc, roff, len);
            ASSERT_TRUE(w.ok()) << w.status().to_string();
            ASSERT_TRUE(pair.a->wait(*w, 30s).ok());
            std::vector<uint8_t> after = to.buf->download(0, kSize);
            ASSERT_TRUE(landed_only_there(before, after, roff, len, seed));
            // Back into the other kind of memory on a, between zeros that must stay.
            const Reg& back = abufs[static_cast<size_t>(1 - src)];
            const uint64_t boff = 1 << 21;
            std::vector<uint8_t> zeros(len + 2, 0);
            back.buf->upload(boff - 1, zeros.data(), len + 2);
            auto r = pair.a->read(pair.link.a_to_b, back.mem, boff, to.desc, roff, len);
            ASSERT_TRUE(r.ok()) << r.status().to_string();
            ASSERT_TRUE(pair.a->wait(*r, 30s).ok());
            ASSERT_EQ(mismatch(back.buf.get(), boff, len, seed), -1);
            std::vector<uint8_t> edges = back.buf->download(boff - 1, len + 2);
            EXPECT_EQ(edges.front(), 0);
            EXPECT_EQ(edges.back(), 0);
        }
    }
    pair.a.reset();
    pair.b.reset();
    for (auto* bufs : {&abufs, &bbufs}) {
        for (auto& r : *bufs) EXPECT_TRUE(r.buf->canaries_intact());
    }
}

#if TCPX_TEST_REAL_GPU
// Small transfers (inline: the bytes ride in the control message) are copied into and out of GPU
// memory on a stream of the engine's own, which does not wait for the application's work on the
// legacy default stream (PyTorch's default). They ran on the per-thread default stream, which
// does wait for it: here that stream is held by a host function that returns once the transfers
// are over, or after 10 s, when they would have waited for it.
struct LegacyStreamHold {
    std::atomic<bool> release{false};
    std::atomic<bool> timed_out{false};
    static void CUDART_CB run(void* arg) {
        auto* h = static_cast<LegacyStreamHold*>(arg);
        const auto deadline = std::chrono::steady_clock::now() + 10s;
        while (!h->release.load()) {
            if (std::chrono::steady_clock::now() > deadline) {
                h->timed_out = true;
                return;
            }
            std::this_thread::sleep_for(1ms);
        }
    }
};

TEST_P(EngineDevice, SmallGpuTransfersDoNotWaitForTheApplicationsLegacyStream) {
    if (GetParam() != Transport::kSocket) GTEST_SKIP() << "the inline path is the engine's own";
    const Reg& host = a_bufs_[0];
    const Reg& their_gpu = b_bufs_[1];
    fill(host.buf.get(), 0, 4096, 91);
    cudaSetDevice(0);
    LegacyStreamHold hold;
    ASSERT_EQ(cudaLaunchHostFunc(cudaStreamLegacy, &LegacyStreamHold::run, &hold), cudaSuccess);
    const Status w = write(host, 0, their_gpu, 8192, 4096);     // inline into their GPU memory
    const Status r = read(host, 65536, their_gpu, 8192, 4096);  // inline out of it
    hold.release = true;
    ASSERT_EQ(cudaStreamSynchronize(cudaStreamLegacy), cudaSuccess);
    EXPECT_TRUE(w.ok()) << w.to_string();
    EXPECT_TRUE(r.ok()) << r.to_string();
    EXPECT_FALSE(hold.timed_out.load()) << "the copies waited for the legacy stream";
    EXPECT_EQ(mismatch(host.buf.get(), 65536, 4096, 91), -1);
}

// The engine's kernels (gathers and scatters of GPU pieces) run in whatever thread makes
// progress: here the application's, which has left an error of its own pending (a failed CUDA
// call it has not checked yet). Launches asked cudaGetLastError() for their status, which
// reported that error as the launch's, and the transfer failed with the application's error.
TEST_P(EngineDevice, AnErrorTheApplicationLeftPendingIsNotTakenForTheEnginesOwn) {
    if (GetParam() != Transport::kSocket) GTEST_SKIP() << "the gather kernels of the socket path";
    std::vector<Reg> polled_bufs;
    std::unique_ptr<Endpoint> polled;
    PeerId to_b = 0;
    ASSERT_NO_FATAL_FAILURE(polled_endpoint(&polled, &to_b, &polled_bufs));
    const Reg& ours = polled_bufs[0];
    const Reg& theirs = b_bufs_[1];
    // 64 GPU pieces of 3000 bytes: chunks of many pieces, gathered and scattered by the kernel.
    std::vector<IoVec> iov;
    for (uint64_t k = 0; k < 64; ++k) {
        iov.push_back(IoVec{ours.mem, k * 4096 + 7, theirs.desc, k * 5000 + 3, 3000});
        fill(ours.buf.get(), iov.back().offset, 3000, 500 + k);
    }
    ASSERT_NE(cudaSetDevice(1 << 20), cudaSuccess);  // left pending, as the application's
    auto w = polled->writev(to_b, iov);
    ASSERT_TRUE(w.ok()) << w.status().to_string();
    const Status ws = polled->wait(*w, 30s);
    EXPECT_TRUE(ws.ok()) << ws.to_string();
    for (uint64_t k = 0; k < iov.size(); ++k) {
        EXPECT_EQ(mismatch(theirs.buf.get(), iov[k].remote_offset, 3000, 500 + k), -1) << k;
    }
    // And back into our GPU memory, 1 MiB further on, through the scatter kernel.
    for (IoVec& v : iov) v.offset += 1 << 20;
    ASSERT_NE(cudaSetDevice(1 << 20), cudaSuccess);
    auto r = polled->readv(to_b, iov);
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    const Status rs = polled->wait(*r, 30s);
    EXPECT_TRUE(rs.ok()) << rs.to_string();
    for (uint64_t k = 0; k < iov.size(); ++k) {
        EXPECT_EQ(mismatch(ours.buf.get(), iov[k].offset, 3000, 500 + k), -1) << k;
    }
    cudaGetLastError();
    polled.reset();
}

// A peer's teardown frees the staging rings its GPU transfers used; freeing GPU and pinned
// memory (cudaFree, cudaFreeHost) waits for every kernel on the device. Under the engine's lock,
// a disconnect() while the application's kernels run stalled every other peer and API call until
// they ended (here the legacy stream is held by a host function, as a long kernel would hold the
// device); freed by the progress thread, they stalled every request it serves for other peers (a
// read of this endpoint's memory, which no call of its application waits for). The rings are now
// freed on a thread of their own (engine/reaper.h).
TEST_P(EngineDevice, ADisconnectDoesNotWaitForTheApplicationsKernels) {
    if (GetParam() != Transport::kSocket) GTEST_SKIP() << "the staging rings are the socket path's";
    const Reg& mine = a_bufs_[1];
    const Reg& theirs = b_bufs_[1];
    fill(mine.buf.get(), 0, 1 << 20, 17);
    ASSERT_TRUE(write(mine, 0, theirs, 0, 1 << 20).ok());  // staging rings made on both sides
    // A bystander of host memory, linked before the hold.
    auto c = make_endpoint("gamma", a_config_);
    ASSERT_TRUE(c);
    const Link to_c = link(a_.get(), c.get());
    ASSERT_NE(to_c.a_to_b, 0u);
    auto c_buf = host_buffer(1 << 20);
    auto c_mem = c->reg(c_buf->data(), c_buf->size());
    ASSERT_TRUE(c_mem.ok());
    const RemoteMem c_desc = *c->describe(*c_mem);
    cudaSetDevice(0);
    LegacyStreamHold hold;
    ASSERT_EQ(cudaLaunchHostFunc(cudaStreamLegacy, &LegacyStreamHold::run, &hold), cudaSuccess);
    const Status gone = a_->disconnect(link_.a_to_b);
    // The peer's teardown and the freeing of its rings under way; then the bystander reads this
    // endpoint's memory (served by its progress thread) and this side writes to the bystander
    // (its wait() makes progress itself).
    std::this_thread::sleep_for(300ms);
    const RemoteMem a_desc = *a_->describe(a_bufs_[0].mem);
    auto r = c->read(to_c.b_to_a, *c_mem, 0, a_desc, 0, 64 * 1024);
    const Status served = r.ok() ? c->wait(*r, 30s) : r.status();
    auto x = a_->write(to_c.a_to_b, a_bufs_[0].mem, 0, c_desc, 0, 64 * 1024);
    const Status bystander = x.ok() ? a_->wait(*x, 30s) : x.status();
    hold.release = true;
    ASSERT_EQ(cudaStreamSynchronize(cudaStreamLegacy), cudaSuccess);
    EXPECT_TRUE(gone.ok()) << gone.to_string();
    EXPECT_TRUE(served.ok()) << served.to_string();
    EXPECT_TRUE(bystander.ok()) << bystander.to_string();
    EXPECT_FALSE(hold.timed_out.load()) << "the disconnect or the bystander waited for the device";
    c.reset();
}

// GPU memory held by others (an inference server takes most of it): a chunk of several GPU
// pieces needs a staging ring (streams, pinned and GPU memory) on first use, and when the GPU has
// no memory left the peer's transfers fail with CUDA's "out of memory", without waiting for the
// application's kernels. What the ring had allocated before the failing part was freed at once
// (cudaFreeHost, cudaFree), which waited for every kernel on the device with the engine's lock
// held: here 10 s, the hold's timeout. Now pinned memory is taken last, and what a ring made stays
// with it, freed with it off the lock. Once memory is back, a new connection works.
// (It takes all of the GPU's memory for a moment: "GpuMemoryRunsOut" tests run alone, see
// tests/CMakeLists.txt.)
TEST_P(EngineDevice, WhenGpuMemoryRunsOutThePeerFailsWithoutWaitingForTheDevice) {
    if (GetParam() != Transport::kSocket) GTEST_SKIP() << "the gather rings of the socket path";
    const Reg& mine = a_bufs_[1];
    const Reg& theirs = b_bufs_[0];  // host memory: only this side stages
    std::vector<IoVec> iov;
    for (uint64_t k = 0; k < 16; ++k) {
        iov.push_back(IoVec{mine.mem, k * 4096 + 5, theirs.desc, k * 3000 + 1, 2999});
        fill(mine.buf.get(), iov.back().offset, 2999, 700 + k);
    }
    cudaSetDevice(0);
    std::vector<void*> filler;  // every block cudaMalloc still gives, largest first
    for (size_t block = size_t{1} << 30; block >= 4096; block /= 2) {
        void* p = nullptr;
        while (cudaMalloc(&p, block) == cudaSuccess) filler.push_back(p);
        cudaGetLastError();
    }
    auto free_filler = [&] {
        for (void* p : filler) cudaFree(p);
        filler.clear();
    };
    LegacyStreamHold hold;
    ASSERT_EQ(cudaLaunchHostFunc(cudaStreamLegacy, &LegacyStreamHold::run, &hold), cudaSuccess);
    auto w = a_->writev(link_.a_to_b, iov);
    const Status failed = w.ok() ? a_->wait(*w, 30s) : w.status();
    hold.release = true;
    ASSERT_EQ(cudaStreamSynchronize(cudaStreamLegacy), cudaSuccess);
    free_filler();
    EXPECT_FALSE(failed.ok());
    EXPECT_NE(failed.to_string().find("out of memory"), std::string::npos) << failed.to_string();
    EXPECT_FALSE(hold.timed_out.load()) << "the failure waited for the device";
    // Memory is back: a new connection stages the same pieces, every byte checked.
    auto again = a_->connect(b_->metadata());
    ASSERT_TRUE(again.ok()) << again.status().to_string();
    auto w2 = a_->writev(*again, iov);
    ASSERT_TRUE(w2.ok()) << w2.status().to_string();
    const Status st = a_->wait(*w2, 30s);
    ASSERT_TRUE(st.ok()) << st.to_string();
    for (uint64_t k = 0; k < iov.size(); ++k) {
        EXPECT_EQ(mismatch(b_bufs_[0].buf.get(), iov[k].remote_offset, 2999, 700 + k), -1) << k;
    }
}
#endif

// dereg() gives peers' transfers PEER_TIMEOUT_MS, then disconnects them; a local copy has no
// peer to blame and ends by itself, so dereg() waits for it however long it takes: once dereg()
// returns, the application may free the memory, and nothing may touch it after that.
TEST_P(EngineDevice, ADeregWaitsForALocalCopyHoweverLong) {
    if (GetParam() != Transport::kSocket) GTEST_SKIP() << "no network involved";
    if (emulation() == nullptr) GTEST_SKIP() << "holds a copy in flight through the emulation";
    Config config = a_config_;
    config.peer_timeout_ms = 100;  // the shortest: a dereg waiting on peers gives up after it
    auto ep = make_endpoint("copier", config);
    ASSERT_TRUE(ep);
    std::vector<Reg> bufs;
    add(ep.get(), host_buffer(1 << 20), &bufs);
    add(ep.get(), device_buffer(1 << 20, 0, emulation()), &bufs);
    fill(bufs[0].buf.get(), 0, 1 << 20, 5);

    std::mutex mu;
    std::condition_variable cv;
    bool entered = false, released = false;
    emulation()->set_copy_hook([&] {
        std::unique_lock<std::mutex> lock(mu);
        entered = true;
        cv.notify_all();
        cv.wait(lock, [&] { return released; });
    });
    std::thread copier([&] {
        const LocalCopy to_dev[] = {{bufs[1].mem, 0, bufs[0].mem, 0, 1 << 20}};
        EXPECT_TRUE(ep->copy(to_dev).ok());
    });
    {
        std::unique_lock<std::mutex> lock(mu);
        cv.wait(lock, [&] { return entered; });
    }
    // The copy is under way (its regions held): let it go on for 4 peer timeouts.
    std::thread releaser([&] {
        std::this_thread::sleep_for(400ms);
        std::lock_guard<std::mutex> lock(mu);
        released = true;
        cv.notify_all();
    });
    const auto start = std::chrono::steady_clock::now();
    EXPECT_TRUE(ep->dereg(bufs[1].mem).ok());
    const auto took = std::chrono::steady_clock::now() - start;
    {
        // The copy was let go (and has let go of the region, its bytes copied) before dereg()
        // returned: before, dereg() returned after PEER_TIMEOUT_MS with the copy still held.
        std::lock_guard<std::mutex> lock(mu);
        EXPECT_TRUE(released) << "dereg() returned while a copy into the region was in flight";
    }
    EXPECT_GE(took, 300ms);
    releaser.join();
    copier.join();
    emulation()->set_copy_hook(nullptr);
    EXPECT_EQ(mismatch(bufs[1].buf.get(), 0, 1 << 20, 5), -1);
    ep.reset();
}

// Small requests for GPU memory are served inline, each a synchronous copy under the engine's
// lock; a peer streaming them had a whole buffer of them (thousands) served before any other
// peer was looked at. Now one peer's turn makes at most 64 such copies: another peer's write,
// sent while a flood of 2000 one-byte reads of GPU memory (each copy 200 us here) is being
// served, is answered long before the flood is over. Counted in copies, not timed.
TEST_P(EngineDevice, AStreamOfSmallGpuRequestsDoesNotKeepOtherPeersWaiting) {
    if (GetParam() != Transport::kSocket) GTEST_SKIP() << "the control path is every transport's";
    if (emulation() == nullptr) GTEST_SKIP() << "counts and slows copies through the emulation";
    auto c = make_endpoint("gamma", a_config_);
    ASSERT_TRUE(c);
    const Link to_c = link(c.get(), b_.get());
    ASSERT_NE(to_c.a_to_b, 0u);
    std::vector<Reg> c_bufs;
    add(c.get(), host_buffer(4096), &c_bufs);
    fill(c_bufs[0].buf.get(), 0, 64, 9);
    constexpr int kReads = 2000;
    fill(b_bufs_[1].buf.get(), 0, kReads, 3);
    std::atomic<uint64_t> copies{0};
    emulation()->set_copy_hook([&] {
        copies.fetch_add(1);
        std::this_thread::sleep_for(200us);
    });
    std::vector<XferId> reads;
    for (int i = 0; i < kReads; ++i) {
        auto x = a_->read(link_.a_to_b, a_bufs_[0].mem, static_cast<uint64_t>(i), b_bufs_[1].desc,
                          static_cast<uint64_t>(i), 1);
        ASSERT_TRUE(x.ok()) << x.status().to_string();
        reads.push_back(*x);
    }
    std::this_thread::sleep_for(30ms);  // (their requests at the target, and being served)
    auto w = c->write(to_c.a_to_b, c_bufs[0].mem, 0, b_bufs_[0].desc, 0, 64);
    ASSERT_TRUE(w.ok()) << w.status().to_string();
    const Status written = c->wait(*w, 30s);
    const uint64_t copies_then = copies.load();
    for (XferId x : reads) ASSERT_TRUE(a_->wait(x, 30s).ok());
    emulation()->set_copy_hook(nullptr);
    ASSERT_TRUE(written.ok()) << written.to_string();
    EXPECT_EQ(mismatch(b_bufs_[0].buf.get(), 0, 64, 9), -1);
    EXPECT_EQ(mismatch(a_bufs_[0].buf.get(), 0, kReads, 3), -1);
    EXPECT_GE(copies.load(), static_cast<uint64_t>(kReads));
    EXPECT_LT(copies_then, static_cast<uint64_t>(kReads) * 3 / 4)
        << "the other peer's write was answered only after " << copies_then
        << " of the flood's copies";
    c.reset();
}

// Google's plugin copies data the NIC left in host memory (no header split, a flow not yet
// steered to the GPU's queues) straight to its place in the buffer a receive was posted with,
// and lists only the rest (FAKETCPX_LINEAR=3 here: a third of every receive's pieces). Known
// of Google's plugin (PLUGIN_PLACES_BYTES=auto), every receive unpacked into several pieces
// has room of its own for such bytes from the start: the first vector lands whole. (Before,
// the endpoint learnt it from the first such receive, which failed its peer: on A3 hardware,
// the first KV-cache transfer of an endpoint.)
TEST_P(EngineDevice, BytesThePluginPlacesItselfLandFromTheFirstReceive) {
    if (GetParam() == Transport::kSocket) GTEST_SKIP() << "a TCPX plugin's behaviour";
    Pair pair;
    std::vector<Reg> abufs, bbufs;
    ASSERT_NO_FATAL_FAILURE(linear_pair(a_config_, &pair, &abufs, &bbufs));
    std::vector<IoVec> iov;
    std::vector<uint64_t> seeds;
    small_pieces(12, abufs[0], bbufs[0], &iov, &seeds);
    for (int round = 0; round < 2; ++round) {  // WRITE, then READ back new contents
        if (round == 1) {
            for (size_t k = 0; k < iov.size(); ++k) {
                fill(bbufs[0].buf.get(), iov[k].remote_offset, iov[k].len, ~seeds[k]);
            }
        }
        auto x = round == 0 ? pair.a->writev(pair.link.a_to_b, iov)
                            : pair.a->readv(pair.link.a_to_b, iov);
        ASSERT_TRUE(x.ok()) << x.status().to_string();
        const Status done = pair.a->wait(*x, 30s);
        ASSERT_TRUE(done.ok()) << done.to_string();
        for (size_t k = 0; k < iov.size(); ++k) {
            ASSERT_EQ(round == 0
                          ? mismatch(bbufs[0].buf.get(), iov[k].remote_offset, iov[k].len, seeds[k])
                          : mismatch(abufs[0].buf.get(), iov[k].offset, iov[k].len, ~seeds[k]),
                      -1)
                << "round " << round << " piece " << k;
        }
    }
    for (auto* bufs : {&abufs, &bbufs}) {
        for (auto& reg : *bufs) EXPECT_TRUE(reg.buf->canaries_intact());
    }
    pair.a.reset();
    pair.b.reset();
}

// The same with a plugin not known to place bytes (PLUGIN_PLACES_BYTES=off, as for a plugin
// of an unknown layout): a receive posted to be unpacked straight into several pieces has no
// buffer of its own, so the first such receive with placed bytes fails its peer, naming them;
// from then on the endpoint gives every such receive room of its own in the gather buffer, and
// they land whole. A receive posted with its destination (one contiguous piece) lands whole
// either way. Every byte checked; nothing else written.
TEST_P(EngineDevice, BytesAnUnknownPluginPlacesItselfAreLearntFromAFailedReceive) {
    if (GetParam() == Transport::kSocket) GTEST_SKIP() << "a TCPX plugin's behaviour";
    Pair pair;
    Config unknown = a_config_;
    unknown.plugin_places_bytes = "off";
    std::vector<Reg> abufs, bbufs;
    ASSERT_NO_FATAL_FAILURE(linear_pair(unknown, &pair, &abufs, &bbufs));
    const Reg& from = abufs[0];
    const Reg& to = bbufs[0];
    std::vector<IoVec> iov;
    std::vector<uint64_t> seeds;
    small_pieces(11, from, to, &iov, &seeds);
    auto w = pair.a->writev(pair.link.a_to_b, iov);
    ASSERT_TRUE(w.ok()) << w.status().to_string();
    const Status first = pair.a->wait(*w, 30s);
    EXPECT_FALSE(first.ok()) << "bytes placed in a shared buffer went unnoticed";
    EXPECT_NE(first.message().find("placed some of the receive's bytes"), std::string::npos)
        << first.to_string();
    // Connected again: room of their own now.
    const Link again = link(pair.a.get(), pair.b.get());
    ASSERT_NE(again.a_to_b, 0u);
    w = pair.a->writev(again.a_to_b, iov);
    ASSERT_TRUE(w.ok()) << w.status().to_string();
    const Status second = pair.a->wait(*w, 30s);
    ASSERT_TRUE(second.ok()) << second.to_string();
    for (size_t k = 0; k < iov.size(); ++k) {
        ASSERT_EQ(mismatch(to.buf.get(), iov[k].remote_offset, iov[k].len, seeds[k]), -1) << k;
    }
    // One piece, into its destination: WRITE, then READ (a's receive), and a's vectors after it.
    constexpr uint64_t kLen = 1 << 20;
    fill(from.buf.get(), 0, kLen, 41);
    auto x = pair.a->write(again.a_to_b, from.mem, 0, to.desc, kSize - kLen, kLen);
    ASSERT_TRUE(x.ok());
    ASSERT_TRUE(pair.a->wait(*x, 30s).ok());
    EXPECT_EQ(mismatch(to.buf.get(), kSize - kLen, kLen, 41), -1);
    fill(to.buf.get(), kSize - kLen, kLen, 43);
    x = pair.a->read(again.a_to_b, from.mem, 0, to.desc, kSize - kLen, kLen);
    ASSERT_TRUE(x.ok());
    ASSERT_TRUE(pair.a->wait(*x, 30s).ok());
    EXPECT_EQ(mismatch(from.buf.get(), 0, kLen, 43), -1);
    // The pieces read back with new contents.
    for (size_t k = 0; k < iov.size(); ++k) {
        fill(to.buf.get(), iov[k].remote_offset, iov[k].len, ~seeds[k]);
    }
    auto r = pair.a->readv(again.a_to_b, iov);
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    const Status read_back = pair.a->wait(*r, 30s);
    ASSERT_TRUE(read_back.ok()) << read_back.to_string();
    for (size_t k = 0; k < iov.size(); ++k) {
        ASSERT_EQ(mismatch(from.buf.get(), iov[k].offset, iov[k].len, ~seeds[k]), -1) << k;
    }
    for (auto* bufs : {&abufs, &bbufs}) {
        for (auto& reg : *bufs) EXPECT_TRUE(reg.buf->canaries_intact());
    }
    pair.a.reset();
    pair.b.reset();
}

TEST_P(EngineDevice, DisconnectWithDeviceTransfersInFlight) {
    const Reg& from = a_bufs_[1];
    const Reg& to = b_bufs_[1];
    // Writes out of and reads into device memory (unpacks into it, over the plugin), in flight
    // when the peer goes: the plugin's requests get their grace, the transfers end after it.
    std::vector<XferId> ids;
    for (int i = 0; i < 8; ++i) {
        auto x = i % 2 == 0 ? a_->write(link_.a_to_b, from.mem, 0, to.desc, 0, kSize)
                            : a_->read(link_.a_to_b, from.mem, 0, to.desc, 0, kSize);
        ASSERT_TRUE(x.ok());
        ids.push_back(*x);
    }
    ASSERT_TRUE(a_->disconnect(link_.a_to_b).ok());
    for (XferId id : ids) {
        const XferStatus xs = a_->poll(id);  // over when disconnect() returns
        EXPECT_NE(xs.state, XferState::kInProgress);
        EXPECT_TRUE(xs.error.ok() || xs.error.code() == StatusCode::kCancelled)
            << xs.error.to_string();
    }
    // The endpoints go on: connect again and move device memory.
    Link again = link(a_.get(), b_.get());
    ASSERT_NE(again.a_to_b, 0u);
    fill(from.buf.get(), 0, 1 << 20, 31);
    auto x = a_->write(again.a_to_b, from.mem, 0, to.desc, 0, 1 << 20);
    ASSERT_TRUE(x.ok());
    ASSERT_TRUE(a_->wait(*x, 30s).ok());
    EXPECT_EQ(mismatch(to.buf.get(), 0, 1 << 20, 31), -1);
}

// A transport plugin that reports a GPU receive done with a broken description of where its
// bytes are (the emulated TCPX plugin's FAKETCPX_MISBEHAVE: an unpack slot outside its queue, an
// entry count past the queue's, an entry placed past the receive's end; an entry read across
// the end of its bounce page or from past the bounce buffer's end, which the kernel would read
// (a fault ends every CUDA call of the process); two entries placed over each other, the bytes
// between never written though the lengths add up; a whole description whose pointers lead
// outside the comm's queue, from the first receive or after it). The transfer fails
// with an error instead of a hang or a crash, the endpoint goes on serving, and nothing outside
// the registration is written. (Entries that cover less than the receive are no longer among
// them: the real plugin places bytes in the receive's buffer itself and lists only the rest;
// EngineDevice.BytesThePluginPlacesItselfLand.) A contiguous transfer (the unpack path) and a
// vector of pieces (the unpack straight into the pieces), WRITE (the peer's receive) and READ
// (ours).
class EngineBrokenPlugin : public ::testing::TestWithParam<const char*> {
 protected:
    void SetUp() override {
#if TCPX_TEST_REAL_GPU
        if (cuda::device_count() == 0) GTEST_SKIP() << "no GPU";
#else
        emu_.emplace(1);
        ::setenv("FAKETCPX_MEMORY", "host", 1);
#endif
        ::setenv("FAKETCPX_MISBEHAVE", GetParam(), 1);  // read by accept: set before the link
        Config config = engine_test_config();
        config.net_plugin = TCPX_FAKE_TCPX_PATH;
        config.gpu_index = 0;
        config.xfer_chunk_size = 64 * 1024;
        // (otherqueue spares each comm's first receive: one channel, so that every transfer
        // here has a second)
        if (std::string_view(GetParam()) == "otherqueue") config.channels = 1;
        a_ = make_endpoint("alpha", config);
        b_ = make_endpoint("beta", config);
        ASSERT_TRUE(a_ && b_);
        link_ = link(a_.get(), b_.get());
        ASSERT_NE(link_.a_to_b, 0u);
        HostDevice* emu = emu_ ? &emu_->get() : nullptr;
        for (auto* buf : {&a_buf_, &b_buf_}) {
            *buf = device_buffer(kSize, 0, emu);
            ASSERT_NE(*buf, nullptr);
        }
        a_mem_ = *a_->reg(a_buf_->data(), kSize);
        b_mem_ = *b_->reg(b_buf_->data(), kSize);
        b_desc_ = *b_->describe(b_mem_);
    }
    void TearDown() override {
        a_.reset();
        b_.reset();
        ::unsetenv("FAKETCPX_MISBEHAVE");
    }

    // `x` fails within a few seconds with something other than a timeout (naming `why` when
    // given); every byte of `into` outside [off, off + len) still holds its poison, and its
    // canaries are intact.
    void expect_fails_inside(StatusOr<XferId> x, TestBuffer* into, uint64_t off, uint64_t len,
                             const char* why = nullptr) {
        ASSERT_TRUE(x.ok()) << x.status().to_string();
        const Status st = a_->wait(*x, 10s);
        EXPECT_FALSE(st.ok()) << "a broken receive description went unnoticed";
        EXPECT_NE(st.code(), StatusCode::kTimeout) << st.to_string();
        if (why != nullptr) {
            EXPECT_NE(st.message().find(why), std::string::npos) << st.to_string();
        }
        const std::vector<uint8_t> got = into->download(0, kSize);
        for (uint64_t i = 0; i < kSize; i += 1) {
            if (i >= off && i < off + len) continue;
            ASSERT_EQ(got[i], kPoison) << "byte " << i << " outside the transfer was written";
        }
        EXPECT_TRUE(into->canaries_intact());
    }
    void poison(TestBuffer* b) {
        const std::vector<uint8_t> p(kSize, kPoison);
        b->upload(0, p.data(), kSize);
    }

    static constexpr size_t kSize = 1 << 20;
    static constexpr uint8_t kPoison = 0xee;
    std::optional<ScopedHostDevice> emu_;
    std::unique_ptr<Endpoint> a_, b_;
    Link link_;
    std::unique_ptr<TestBuffer> a_buf_, b_buf_;
    MemId a_mem_ = 0, b_mem_ = 0;
    RemoteMem b_desc_;
};

TEST_P(EngineBrokenPlugin, ABrokenReceiveDescriptionFailsTheTransferAndWritesNothingOutside) {
    constexpr uint64_t kOff = 128 * 1024, kLen = 200 * 1024;
    poison(b_buf_.get());
    // The receive that failed is the peer's: its BYE says why.
    constexpr const char* kPeersReason = "peer disconnected: PROTOCOL: data channel receive";
    expect_fails_inside(a_->write(link_.a_to_b, a_mem_, 0, b_desc_, kOff, kLen), b_buf_.get(), kOff,
                        kLen, kPeersReason);
    // A failed transfer drops its peer: a new link for the read.
    link_ = link(a_.get(), b_.get());
    ASSERT_NE(link_.a_to_b, 0u);
    poison(a_buf_.get());
    expect_fails_inside(a_->read(link_.a_to_b, a_mem_, kOff, b_desc_, 0, kLen), a_buf_.get(), kOff,
                        kLen);
    // Pieces, two in one chunk (and past the inline limit, so that they take a data channel):
    // the unpack straight into them.
    link_ = link(a_.get(), b_.get());
    ASSERT_NE(link_.a_to_b, 0u);
    poison(b_buf_.get());
    std::vector<IoVec> iov(2);
    for (size_t k = 0; k < iov.size(); ++k) {
        iov[k].mem = a_mem_;
        iov[k].offset = k * 65536;
        iov[k].remote = b_desc_;
        iov[k].remote_offset = kOff + k * 65536;
        iov[k].len = 40960;
    }
    expect_fails_inside(a_->writev(link_.a_to_b, iov), b_buf_.get(), kOff, 65536 + 40960,
                        kPeersReason);
    // Both endpoints go on serving: a transfer small enough to go inline (no receive of the
    // plugin) lands.
    link_ = link(a_.get(), b_.get());
    ASSERT_NE(link_.a_to_b, 0u);
    std::vector<uint8_t> pattern(4096);
    fill_pattern(pattern.data(), pattern.size(), 5);
    a_buf_->upload(0, pattern.data(), pattern.size());
    auto x = a_->write(link_.a_to_b, a_mem_, 0, b_desc_, 0, pattern.size());
    ASSERT_TRUE(x.ok());
    ASSERT_TRUE(a_->wait(*x, 10s).ok());
    EXPECT_EQ(find_pattern_mismatch(b_buf_->download(0, pattern.size()).data(), pattern.size(), 5),
              -1);
}

// A plugin whose unpack queue is not where it says: the device handle accept gave points at host
// memory CUDA does not know (a copy from it would crash the process), or the queue it describes
// names a bounce buffer in host memory (the unpack kernel would fault, ending every CUDA call
// of the process). The first GPU receive fails its peer with the reason; nothing is written;
// the endpoints serve on. Real GPUs only: the emulation's queues are host memory.
class EngineBrokenUnpackQueue : public EngineBrokenPlugin {};

TEST_P(EngineBrokenUnpackQueue, IsRefusedBeforeAnythingReadsIt) {
    constexpr uint64_t kOff = 128 * 1024, kLen = 200 * 1024;
    poison(b_buf_.get());
    expect_fails_inside(a_->write(link_.a_to_b, a_mem_, 0, b_desc_, kOff, kLen), b_buf_.get(), kOff,
                        kLen, "is not GPU memory");
    link_ = link(a_.get(), b_.get());
    ASSERT_NE(link_.a_to_b, 0u);
    std::vector<uint8_t> pattern(4096);
    fill_pattern(pattern.data(), pattern.size(), 6);
    a_buf_->upload(0, pattern.data(), pattern.size());
    auto x = a_->write(link_.a_to_b, a_mem_, 0, b_desc_, 0, pattern.size());
    ASSERT_TRUE(x.ok());
    ASSERT_TRUE(a_->wait(*x, 10s).ok());
    EXPECT_EQ(find_pattern_mismatch(b_buf_->download(0, pattern.size()).data(), pattern.size(), 6),
              -1);
}

#if TCPX_TEST_REAL_GPU
#define TCPX_ENGINE_DEVICE_SUITE Gpu
#else
#define TCPX_ENGINE_DEVICE_SUITE Emulated
#endif
// Every transport, except under ThreadSanitizer: there the no-wire fake is left out. It runs the
// engine's threads as the wire-mode fake does (the difference is inside the fake), and its copy
// of the suite took 42 s of CI's TSan run.
const std::vector<Transport> kTransports =
    kUnderThreadSanitizer ? std::vector<Transport>{Transport::kSocket, Transport::kFakeTcpx}
                          : std::vector<Transport>{Transport::kSocket, Transport::kFakeTcpx,
                                                   Transport::kFakeTcpxNoWire};
// Distinct names in the two binaries, so that CTest keeps them (and their labels) apart.
INSTANTIATE_TEST_SUITE_P(TCPX_ENGINE_DEVICE_SUITE, EngineDevice, ::testing::ValuesIn(kTransports),
                         transport_name);
// "src" (an entry read from past the end of the bounce buffer) only where that buffer is GPU
// memory whose extent the engine can ask for: the emulation's is host memory.
#if TCPX_TEST_REAL_GPU
INSTANTIATE_TEST_SUITE_P(TCPX_ENGINE_DEVICE_SUITE, EngineBrokenUnpackQueue,
                         ::testing::Values("handle", "bounce"));
#else
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(EngineBrokenUnpackQueue);
#endif
INSTANTIATE_TEST_SUITE_P(TCPX_ENGINE_DEVICE_SUITE, EngineBrokenPlugin,
                         ::testing::Values("slot", "count", "dst", "cross", "overlap", "elsewhere",
                                           "otherqueue"
#if TCPX_TEST_REAL_GPU
                                           ,
                                           "src"
#endif
                                           ));

}  // namespace
}  // namespace tcpx::testing
