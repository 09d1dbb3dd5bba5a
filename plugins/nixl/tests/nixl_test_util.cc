#include "nixl_test_util.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "common/splitmix.h"
#include "common/strings.h"

#if TCPX_P2P_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace tcpx::nixl_test {
namespace {

uint64_t pattern_word(uint64_t seed, uint64_t word) {
    return splitmix64(splitmix64(seed) ^ (word * 0xd6e8feb86659fd93ull));
}

// Run by hand rather than by CTest (which sets it), the tests still find the plugin they were
// built with. Before main(): NIXL reads the variable once.
const bool kPluginDirSet = [] {
    return ::setenv("NIXL_PLUGIN_DIR", TCPX_NIXL_PLUGIN_DIR, 0) == 0;
}();

}  // namespace

nixl_b_params_t loopback_params() { return {{"interface", "=lo"}, {"nsocks", "2"}}; }

// --- byte patterns ------------------------------------------------------------------------------

uint8_t pattern_byte(uint64_t seed, uint64_t index) {
    return static_cast<uint8_t>(pattern_word(seed, index / 8) >> (8 * (index % 8)));
}

void fill_pattern(uint8_t* dst, size_t len, uint64_t seed, uint64_t start) {
    size_t k = 0;
    while (k < len) {
        const uint64_t i = start + k;
        const uint64_t w = pattern_word(seed, i / 8);
        for (uint64_t b = i % 8; b < 8 && k < len; ++b, ++k) {
            dst[k] = static_cast<uint8_t>(w >> (8 * b));
        }
    }
}

std::vector<uint8_t> make_pattern(size_t len, uint64_t seed, uint64_t start) {
    std::vector<uint8_t> v(len);
    fill_pattern(v.data(), len, seed, start);
    return v;
}

size_t pattern_mismatch(const uint8_t* p, size_t len, uint64_t seed, uint64_t start) {
    constexpr size_t kStep = 1 << 20;
    std::vector<uint8_t> want;
    for (size_t done = 0; done < len; done += kStep) {
        const size_t n = std::min(kStep, len - done);
        want.resize(n);
        fill_pattern(want.data(), n, seed, start + done);
        if (std::memcmp(p + done, want.data(), n) == 0) continue;
        for (size_t i = 0; i < n; ++i) {
            if (p[done + i] != want[i]) return done + i;
        }
    }
    return kNoMismatch;
}

// The project's hex (common/strings.h), for strings.
std::string to_hex(std::string_view bytes) { return tcpx::to_hex(bytes.data(), bytes.size()); }

std::string from_hex(std::string_view hex) {
    std::vector<uint8_t> raw;
    if (!tcpx::from_hex(hex, &raw)) return {};
    return std::string(raw.begin(), raw.end());
}

bool have_gpu() {
#if TCPX_P2P_HAVE_CUDA
    int n = 0;
    return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
#else
    return false;
#endif
}

// --- Buffer -------------------------------------------------------------------------------------

std::unique_ptr<Buffer> Buffer::create(nixl_mem_t mem, size_t size) {
    const size_t total = size + 2 * kGuard;
    uint8_t* base = nullptr;
    if (mem == VRAM_SEG) {
#if TCPX_P2P_HAVE_CUDA
        if (!have_gpu() || cudaSetDevice(0) != cudaSuccess) return nullptr;
        void* p = nullptr;
        if (cudaMalloc(&p, total) != cudaSuccess) return nullptr;
        base = static_cast<uint8_t*>(p);
        if (cudaMemset(base, kGuardByte, total) != cudaSuccess ||
            cudaMemset(base + kGuard, 0, size) != cudaSuccess ||
            cudaDeviceSynchronize() != cudaSuccess) {
            cudaFree(base);
            return nullptr;
        }
#else
        return nullptr;
#endif
    } else {
        base = static_cast<uint8_t*>(std::malloc(total));
        if (base == nullptr) return nullptr;
        std::memset(base, kGuardByte, total);
        std::memset(base + kGuard, 0, size);
    }
    return std::unique_ptr<Buffer>(new Buffer(mem, base, size));
}

Buffer::~Buffer() {
#if TCPX_P2P_HAVE_CUDA
    if (mem_ == VRAM_SEG) {
        cudaFree(base_);
        return;
    }
#endif
    std::free(base_);
}

void Buffer::copy_in(uint8_t* dst, const void* src, size_t len) {
#if TCPX_P2P_HAVE_CUDA
    if (mem_ == VRAM_SEG) {
        ASSERT_EQ(cudaMemcpy(dst, src, len, cudaMemcpyHostToDevice), cudaSuccess);
        return;
    }
#endif
    std::memcpy(dst, src, len);
}

void Buffer::copy_out(void* dst, const uint8_t* src, size_t len) const {
#if TCPX_P2P_HAVE_CUDA
    if (mem_ == VRAM_SEG) {
        ASSERT_EQ(cudaMemcpy(dst, src, len, cudaMemcpyDeviceToHost), cudaSuccess);
        return;
    }
#endif
    std::memcpy(dst, src, len);
}

void Buffer::write(uint64_t offset, const void* src, size_t len) {
    ASSERT_LE(offset + len, size_);
    if (len > 0) copy_in(base_ + kGuard + offset, src, len);
}

void Buffer::read(uint64_t offset, void* dst, size_t len) const {
    ASSERT_LE(offset + len, size_);
    if (len > 0) copy_out(dst, base_ + kGuard + offset, len);
}

std::vector<uint8_t> Buffer::read_all() const {
    std::vector<uint8_t> v(size_);
    read(0, v.data(), size_);
    return v;
}

void Buffer::fill(uint64_t seed) { write_all(make_pattern(size_, seed)); }

bool Buffer::guards_intact() const {
    std::vector<uint8_t> g(kGuard);
    for (const uint8_t* at : {base_, base_ + kGuard + size_}) {
        copy_out(g.data(), at, kGuard);
        if (std::any_of(g.begin(), g.end(), [](uint8_t b) { return b != kGuardByte; })) {
            return false;
        }
    }
    return true;
}

// --- TestAgent ----------------------------------------------------------------------------------

TestAgent::TestAgent(std::string name, AgentOptions options)
    : name_(std::move(name)), options_(std::move(options)) {
    nixlAgentConfig cfg(options_.prog_thread);
    cfg.syncMode = options_.sync;
    agent_ = std::make_unique<nixlAgent>(name_, cfg);
    const nixl_status_t st = agent_->createBackend(kBackend, options_.params, backend_);
    EXPECT_EQ(st, NIXL_SUCCESS) << "agent '" << name_ << "': createBackend(TCPX)";
    EXPECT_NE(backend_, nullptr);
}

TestAgent::~TestAgent() { dereg_all(); }

bool TestAgent::reg(const Buffer& buffer, uint64_t offset, size_t len) {
    nixl_reg_dlist_t list(buffer.mem());
    nixlBlobDesc desc(buffer.addr(offset), len, 0, "");
    list.addDesc(desc);
    nixl_opt_args_t args;
    args.backends.push_back(backend_);
    const nixl_status_t st = agent_->registerMem(list, &args);
    EXPECT_EQ(st, NIXL_SUCCESS) << "agent '" << name_ << "': registerMem";
    if (st != NIXL_SUCCESS) return false;
    regs_.emplace_back(buffer.mem(), desc);
    return true;
}

bool TestAgent::dereg(const Buffer& buffer, uint64_t offset, size_t len) {
    auto it = std::find_if(regs_.begin(), regs_.end(), [&](const auto& r) {
        return r.first == buffer.mem() && r.second.addr == buffer.addr(offset) &&
               r.second.len == len;
    });
    if (it == regs_.end()) {
        ADD_FAILURE() << "agent '" << name_ << "': dereg of a range reg() never registered";
        return false;
    }
    nixl_reg_dlist_t list(it->first);
    list.addDesc(it->second);
    const nixl_status_t st = agent_->deregisterMem(list);
    EXPECT_EQ(st, NIXL_SUCCESS) << "agent '" << name_ << "': deregisterMem";
    regs_.erase(it);
    return st == NIXL_SUCCESS;
}

void TestAgent::dereg_all() {
    for (const auto& [mem, desc] : regs_) {
        nixl_reg_dlist_t list(mem);
        list.addDesc(desc);
        EXPECT_EQ(agent_->deregisterMem(list), NIXL_SUCCESS) << "agent '" << name_ << "'";
    }
    regs_.clear();
}

std::string TestAgent::metadata() {
    std::string md;
    EXPECT_EQ(agent_->getLocalMD(md), NIXL_SUCCESS) << "agent '" << name_ << "': getLocalMD";
    return md;
}

std::string TestAgent::load(const std::string& md) {
    std::string remote;
    EXPECT_EQ(agent_->loadRemoteMD(md, remote), NIXL_SUCCESS)
        << "agent '" << name_ << "': loadRemoteMD";
    return remote;
}

nixl_status_t TestAgent::pump() {
    nixl_notifs_t notifs;
    const nixl_status_t st = agent_->getNotifs(notifs);
    for (auto& [from, msgs] : notifs) {
        for (auto& msg : msgs) {
            Notif n{from, std::move(msg)};
            if (on_notif) on_notif(n);
            received_.push_back(std::move(n));
        }
    }
    return st;
}

size_t TestAgent::count(const Notif& n) const {
    return static_cast<size_t>(std::count(received_.begin(), received_.end(), n));
}

// --- waiting ------------------------------------------------------------------------------------

namespace {
void breathe() { std::this_thread::sleep_for(std::chrono::microseconds(20)); }
}  // namespace

nixl_status_t wait_xfer(TestAgent& initiator, nixlXferReqH* req, Agents others,
                        std::chrono::milliseconds timeout) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (true) {
        for (TestAgent* a : others) EXPECT_EQ(a->pump(), NIXL_SUCCESS);
        const nixl_status_t st = initiator->getXferStatus(req);
        if (st != NIXL_IN_PROG) return st;
        if (std::chrono::steady_clock::now() > deadline) return NIXL_IN_PROG;
        breathe();
    }
}

nixl_status_t post_and_wait(TestAgent& initiator, nixlXferReqH* req, Agents others,
                            const nixl_opt_args_t* args) {
    const nixl_status_t st = initiator->postXferReq(req, args);
    if (st != NIXL_IN_PROG) return st;
    return wait_xfer(initiator, req, others);
}

bool wait_notifs(TestAgent& agent, size_t n, Agents others, std::chrono::milliseconds timeout) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (agent.received().size() < n) {
        if (std::chrono::steady_clock::now() > deadline) return false;
        EXPECT_EQ(agent.pump(), NIXL_SUCCESS);
        for (TestAgent* a : others) EXPECT_EQ(a->pump(), NIXL_SUCCESS);
        breathe();
    }
    return true;
}

void pump_for(std::chrono::milliseconds duration, Agents agents) {
    const auto until = std::chrono::steady_clock::now() + duration;
    while (std::chrono::steady_clock::now() < until) {
        for (TestAgent* a : agents) EXPECT_EQ(a->pump(), NIXL_SUCCESS);
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
}

nixl_xfer_dlist_t xfer_list(const Buffer& buffer,
                            const std::vector<std::pair<uint64_t, uint64_t>>& ranges) {
    nixl_xfer_dlist_t list(buffer.mem());
    for (const auto& [offset, len] : ranges) {
        list.addDesc(nixlBasicDesc(buffer.addr(offset), len, 0));
    }
    return list;
}

nixl_opt_args_t with_notif(const std::string& msg) {
    nixl_opt_args_t args;
    args.notif = msg;
    return args;
}

}  // namespace tcpx::nixl_test
