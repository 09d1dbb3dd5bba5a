// Support for the tests of the NIXL backend "TCPX". The tests drive the built plugin only through
// NIXL's public agent API (nixlAgent), as an application would: agents with the TCPX backend,
// buffers in host or GPU memory with guard bytes around them, byte patterns that can be checked
// anywhere (the same seed and index give the same byte in every process), and waiting that keeps
// every agent involved progressing.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "nixl.h"

namespace tcpx::nixl_test {

inline constexpr char kBackend[] = "TCPX";
// How long anything that should happen at once may take before a test gives up on it.
inline constexpr std::chrono::seconds kTimeout{20};

// Backend parameters for tests: loopback only, 2 data sockets (light on a small machine).
nixl_b_params_t loopback_params();

// --- byte patterns ------------------------------------------------------------------------------

// Byte `index` of the pattern `seed`.
uint8_t pattern_byte(uint64_t seed, uint64_t index);
// Bytes [start, start + len) of the pattern `seed` into dst.
void fill_pattern(uint8_t* dst, size_t len, uint64_t seed, uint64_t start = 0);
std::vector<uint8_t> make_pattern(size_t len, uint64_t seed, uint64_t start = 0);
// Where [p, p + len) first differs from bytes [start, ...) of the pattern, or kNoMismatch.
inline constexpr size_t kNoMismatch = static_cast<size_t>(-1);
size_t pattern_mismatch(const uint8_t* p, size_t len, uint64_t seed, uint64_t start = 0);

// Hex text of binary bytes (metadata and messages cross a line-oriented pipe this way).
std::string to_hex(std::string_view bytes);
std::string from_hex(std::string_view hex);

// True when a CUDA GPU is usable (always false in a build without CUDA).
bool have_gpu();

// Host or GPU memory: `size` usable bytes between two guards that nothing may touch.
class Buffer {
 public:
    static constexpr size_t kGuard = 4096;
    static constexpr uint8_t kGuardByte = 0x5a;

    // Null when VRAM is asked for and there is no GPU.
    static std::unique_ptr<Buffer> create(nixl_mem_t mem, size_t size);
    ~Buffer();
    Buffer(const Buffer&) = delete;
    Buffer& operator=(const Buffer&) = delete;

    nixl_mem_t mem() const { return mem_; }
    size_t size() const { return size_; }
    uintptr_t addr(uint64_t offset = 0) const {
        return reinterpret_cast<uintptr_t>(base_ + kGuard + offset);
    }

    void write(uint64_t offset, const void* src, size_t len);
    void read(uint64_t offset, void* dst, size_t len) const;
    std::vector<uint8_t> read_all() const;
    void write_all(const std::vector<uint8_t>& bytes) { write(0, bytes.data(), bytes.size()); }
    // The pattern `seed` over the whole usable part (byte i is pattern byte i).
    void fill(uint64_t seed);
    bool guards_intact() const;

 private:
    Buffer(nixl_mem_t mem, uint8_t* base, size_t size) : mem_(mem), base_(base), size_(size) {}
    void copy_in(uint8_t* dst, const void* src, size_t len);
    void copy_out(void* dst, const uint8_t* src, size_t len) const;

    nixl_mem_t mem_;
    uint8_t* base_;  // the first guard
    size_t size_;
};

// A received notification.
struct Notif {
    std::string from;
    std::string msg;
    friend bool operator==(const Notif& a, const Notif& b) {
        return a.from == b.from && a.msg == b.msg;
    }
};

struct AgentOptions {
    bool prog_thread = true;
    nixl_thread_sync_t sync = nixl_thread_sync_t::NIXL_THREAD_SYNC_DEFAULT;
    nixl_b_params_t params = loopback_params();
};

// A nixlAgent with the TCPX backend, its registrations (deregistered before it goes) and the
// notifications it has received so far.
class TestAgent {
 public:
    explicit TestAgent(std::string name, AgentOptions options = {});
    ~TestAgent();
    TestAgent(const TestAgent&) = delete;
    TestAgent& operator=(const TestAgent&) = delete;

    nixlAgent& agent() { return *agent_; }
    nixlAgent* operator->() { return agent_.get(); }
    const std::string& name() const { return name_; }
    nixlBackendH* backend() const { return backend_; }
    bool prog_thread() const { return options_.prog_thread; }

    // Registers [offset, offset + len) of `buffer` with the backend; true on success.
    bool reg(const Buffer& buffer, uint64_t offset, size_t len);
    bool reg(const Buffer& buffer) { return reg(buffer, 0, buffer.size()); }
    // Deregisters what reg(buffer, offset, len) registered; true on success.
    bool dereg(const Buffer& buffer, uint64_t offset, size_t len);
    // Deregisters everything registered through reg().
    void dereg_all();

    std::string metadata();
    // Loads `md` (another agent's metadata); returns the agent's name, empty on failure.
    std::string load(const std::string& md);
    std::string load(TestAgent& other) { return load(other.metadata()); }

    // One getNotifs(): what arrived is appended to received() (and handed to on_notif first).
    nixl_status_t pump();
    const std::vector<Notif>& received() const { return received_; }
    size_t count(const Notif& n) const;
    // Called for each notification as it is seen, before it is recorded.
    std::function<void(const Notif&)> on_notif;

 private:
    std::string name_;
    AgentOptions options_;
    std::unique_ptr<nixlAgent> agent_;
    nixlBackendH* backend_ = nullptr;
    std::vector<std::pair<nixl_mem_t, nixlBlobDesc>> regs_;
    std::vector<Notif> received_;
};

using Agents = std::initializer_list<TestAgent*>;

// Polls `req` of `initiator` until it leaves NIXL_IN_PROG or `timeout` passes (then
// NIXL_IN_PROG), pumping the notifications of `others` in between: an agent without a progress
// thread progresses only inside such calls.
nixl_status_t wait_xfer(TestAgent& initiator, nixlXferReqH* req, Agents others = {},
                        std::chrono::milliseconds timeout = kTimeout);
// Posts `req` (with `args`) and, when it is in flight, waits for it as wait_xfer() does; the
// final status.
nixl_status_t post_and_wait(TestAgent& initiator, nixlXferReqH* req, Agents others = {},
                            const nixl_opt_args_t* args = nullptr);
// Pumps `agent` and `others` until `agent` has received `n` notifications in all; false on
// timeout.
bool wait_notifs(TestAgent& agent, size_t n, Agents others = {},
                 std::chrono::milliseconds timeout = kTimeout);
// Pumps `agents` for `duration` (to see that nothing more arrives).
void pump_for(std::chrono::milliseconds duration, Agents agents);

// A transfer descriptor list of `ranges` ({offset, length}) of `buffer`.
nixl_xfer_dlist_t xfer_list(const Buffer& buffer,
                            const std::vector<std::pair<uint64_t, uint64_t>>& ranges);

// Optional arguments that attach a notification.
nixl_opt_args_t with_notif(const std::string& msg);

}  // namespace tcpx::nixl_test
