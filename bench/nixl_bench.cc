// tcpx-nixl-bench: NIXL backends side by side (TCPX and UCX by default), in one run, through
// NIXL's public agent API only (nixlAgent) — what an application using NIXL would see.
//
// Two processes on this host: the program forks before any agent or thread exists; the child is
// the target, the parent the initiator, and a socketpair between them carries the line-oriented
// commands of the harness (bench/harness/roles.h: a ForkPeer; metadata as hex, preparing and
// checking bytes for --verify). For
// each backend, both processes create an agent holding that backend alone (with NIXL's progress
// thread unless --progress-thread off),
// register one region each and the initiator loads the target's metadata. Then, for every op and
// size, the initiator creates one transfer request per slot (createXferReq, `--batch`
// descriptors of `size` each) and measures
//   - throughput: `--depth` requests in flight, each reposted (postXferReq on the same handle) as
//     soon as it completes, for about `--time` seconds and at least `--iters` rounds of `--depth`;
//   - latency: one request at a time, post to completion, median and p99.
// The target application does nothing but poll getNotifs until the initiator says stop: the
// transfers are one-sided. Every 1 ms with progress threads; without them (--progress-thread
// off, as nixlbench runs), without pause, since only its calls move its side's data. A backend that
// cannot be created is reported and skipped.
//
// UCX: unless UCX_TLS is set, the program sets UCX_TLS=tcp before the fork (so both agents see
// it), for a TCP-against-TCP comparison.
#include <nixl.h>
#include <poll.h>
#include <signal.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "bench/harness/measure.h"
#include "bench/harness/memory.h"
#include "bench/harness/report.h"
#include "bench/harness/roles.h"
#include "bench/kv_workload.h"
#include "common/params.h"
#include "common/status_util.h"
#include "common/strings.h"

namespace tcpx::bench {
namespace {

constexpr char kProgram[] = "tcpx-nixl-bench";
constexpr char kInitiatorName[] = "tcpx-nixl-bench-initiator";
constexpr char kTargetName[] = "tcpx-nixl-bench-target";
// The notification attached to each request of a --verify round.
constexpr char kVerifyNotif[] = "tcpx-nixl-bench-verify";

enum class Op { kWrite, kRead };

const char* op_name(Op op) { return op == Op::kWrite ? "WRITE" : "READ"; }
nixl_xfer_op_t nixl_op(Op op) { return op == Op::kWrite ? NIXL_WRITE : NIXL_READ; }

struct Options {
    std::vector<std::string> backends = {"TCPX", "UCX"};
    std::vector<Op> ops = {Op::kWrite, Op::kRead};
    std::vector<uint64_t> sizes;
    int depth = 8;  // requests in flight (fewer where they would pass max_memory)
    int batch = 1;  // descriptors per request
    uint64_t max_memory = kMaxInFlightBytes;  // per side
    double min_seconds = 0.5;
    int min_iters = 5;
    bool vram = false;
    int initiator_gpu = 0;
    int target_gpu = 0;
    std::string interface = "=lo";  // the TCPX backend's "interface" parameter
    // Backend parameters from --param BACKEND:key=value, applied over the plugin's defaults.
    std::vector<std::pair<std::string, std::pair<std::string, std::string>>> params;
    bool verify = true;
    bool latency = true;
    bool json = false;
    bool progress = true;
    bool progress_thread = true;  // NIXL's, in both agents (nixlAgentConfig::useProgThread)
    double stall_seconds = 60;    // no completion for this long: the backend is stuck
    bool kv = false;              // the KV workload (bench/kv_workload.h) instead of the sweep
    KvShape kv_shape;
};

const char* mem_name(const Options& o) { return o.vram ? "VRAM" : "DRAM"; }

Status from_nixl(nixl_status_t st, const std::string& what) {
    if (st == NIXL_SUCCESS) return Status();
    return internal_error(what + ": " + nixlEnumStrings::statusStr(st));
}

// Requests in flight for `size`: --depth, fewer where depth x batch x size would pass
// --max-memory (but at least one).
int depth_for(const Options& o, uint64_t size) {
    const uint64_t request = size * static_cast<uint64_t>(o.batch);
    const uint64_t fit = std::max<uint64_t>(1, o.max_memory / std::max<uint64_t>(request, 1));
    return static_cast<int>(std::min<uint64_t>(static_cast<uint64_t>(o.depth), fit));
}

// The region each side registers: room for the largest case.
uint64_t region_bytes(const Options& o) {
    uint64_t bytes = 0;
    for (uint64_t size : o.sizes) {
        bytes = std::max(bytes, size * static_cast<uint64_t>(o.batch) *
                                    static_cast<uint64_t>(depth_for(o, size)));
    }
    return bytes;
}

// --- memory: host or GPU -------------------------------------------------------------------------

// One region in DRAM or VRAM (bench::Buffer), with the --verify helpers: slot s of `slot_bytes`
// carries the pattern pattern_seed(run, s).
class Memory {
 public:
    static StatusOr<std::unique_ptr<Memory>> allocate(bool vram, int gpu, uint64_t len) {
        if (vram) {
            auto gpus = usable_gpus();
            if (!gpus.ok()) return Status(gpus.status()).with_context("--mem vram");
            if (gpu < 0 || gpu >= *gpus) {
                return invalid_argument(
                    strformat("--gpus: GPU %d does not exist (%d here)", gpu, *gpus));
            }
        }
        auto m = std::make_unique<Memory>();
        TCPX_ASSIGN_OR_RETURN(
            m->buf_, Buffer::allocate(vram ? MemType::kVram : MemType::kHost, gpu, len, 0x5a));
        m->gpu_ = vram ? gpu : -1;
        return m;
    }

    uint8_t* data() const { return buf_.data(); }
    uint64_t size() const { return buf_.size(); }
    const Buffer& buffer() const { return buf_; }
    nixl_mem_t segment() const { return gpu_ >= 0 ? VRAM_SEG : DRAM_SEG; }
    uint64_t dev_id() const { return gpu_ >= 0 ? static_cast<uint64_t>(gpu_) : 0; }

    // Fills (pattern) or poisons the first `slots` slots of `slot_bytes`.
    Status prepare(uint64_t run, uint64_t slot_bytes, int slots, bool pattern) {
        TCPX_RETURN_IF_ERROR(check_range(slot_bytes, slots));
        for (int s = 0; s < slots; ++s) {
            TCPX_RETURN_IF_ERROR(prepare_bytes(buf_, static_cast<uint64_t>(s) * slot_bytes,
                                               slot_bytes, pattern, pattern_seed(run, s)));
        }
        return Status();
    }

    // OK when every slot holds its pattern; else where the first difference is.
    Status check(uint64_t run, uint64_t slot_bytes, int slots, const std::string& what) const {
        TCPX_RETURN_IF_ERROR(check_range(slot_bytes, slots));
        for (int s = 0; s < slots; ++s) {
            TCPX_RETURN_IF_ERROR(check_bytes(buf_, static_cast<uint64_t>(s) * slot_bytes,
                                             slot_bytes, pattern_seed(run, s),
                                             strformat("%s, request slot %d", what.c_str(), s)));
        }
        return Status();
    }

 private:
    Status check_range(uint64_t slot_bytes, int slots) const {
        if (slots < 0 || slot_bytes * static_cast<uint64_t>(slots) > buf_.size()) {
            return out_of_range("slots beyond the registered region");
        }
        return Status();
    }

    Buffer buf_;
    int gpu_ = -1;
};

// --- agents
// ---------------------------------------------------------------------------------------

// One nixlAgent holding one backend, with NIXL's progress thread as --progress-thread says.
struct Agent {
    std::unique_ptr<nixlAgent> agent;
    nixlBackendH* backend = nullptr;
    nixl_b_params_t params;  // the backend's, after creation
};

std::string join_plugins(const std::vector<nixl_backend_t>& plugins) {
    std::string out;
    for (const auto& p : plugins) out += (out.empty() ? "" : ", ") + p;
    return out.empty() ? "none" : out;
}

StatusOr<Agent> create_agent(const std::string& name, const std::string& backend,
                             const Options& o) {
    Agent a;
    nixlAgentConfig cfg;
    cfg.useProgThread = o.progress_thread;
    try {
        a.agent = std::make_unique<nixlAgent>(name, cfg);
    } catch (const std::exception& e) {
        return internal_error(std::string("creating a NIXL agent: ") + e.what());
    }
    std::vector<nixl_backend_t> plugins;
    TCPX_RETURN_IF_ERROR(from_nixl(a.agent->getAvailPlugins(plugins), "getAvailPlugins"));
    if (std::find(plugins.begin(), plugins.end(), backend) == plugins.end()) {
        const char* dir = std::getenv("NIXL_PLUGIN_DIR");
        return not_found(strformat("no NIXL plugin '%s' (NIXL_PLUGIN_DIR=%s; found: %s)",
                                   backend.c_str(), dir != nullptr ? dir : "(unset)",
                                   join_plugins(plugins).c_str()));
    }
    nixl_mem_list_t mems;
    nixl_b_params_t params;
    const nixl_status_t loaded = a.agent->getPluginParams(backend, mems, params);
    if (loaded == NIXL_ERR_NOT_FOUND) {
        return not_found(
            strformat("NIXL plugin '%s' was found but did not load (NIXL_LOG_LEVEL=INFO says "
                      "why; often a library of the plugin's that LD_LIBRARY_PATH must name)",
                      backend.c_str()));
    }
    TCPX_RETURN_IF_ERROR(from_nixl(loaded, "getPluginParams"));
    if (backend == "TCPX" && !o.interface.empty()) params["interface"] = o.interface;
    for (const auto& [b, kv] : o.params) {
        if (b == backend) params[kv.first] = kv.second;
    }
    const nixl_mem_t seg = o.vram ? VRAM_SEG : DRAM_SEG;
    if (std::find(mems.begin(), mems.end(), seg) == mems.end()) {
        return unimplemented(strformat("backend %s does not take %s", backend.c_str(),
                                       nixlEnumStrings::memTypeStr(seg).c_str()));
    }
    TCPX_RETURN_IF_ERROR(from_nixl(a.agent->createBackend(backend, params, a.backend),
                                   "creating backend " + backend));
    TCPX_RETURN_IF_ERROR(
        from_nixl(a.agent->getBackendParams(a.backend, mems, a.params), "getBackendParams"));
    return a;
}

nixl_reg_dlist_t region_dlist(const Memory& m) {
    nixl_reg_dlist_t d(m.segment());
    d.addDesc(nixlBlobDesc(reinterpret_cast<uintptr_t>(m.data()), m.size(), m.dev_id(), ""));
    return d;
}

// --- the target (the child process) --------------------------------------------------------------

// Commands (one line each; replies "ok" unless said otherwise, "error <status>" on failure):
//   alloc <bytes>                          the region (DRAM or VRAM per the options)
//   begin <backend>                        an agent with that backend, the region registered
//                                          -> "ok <hex metadata> <address> <devId>"
//   prepare <run> <slot_bytes> <slots> fill|poison
//                                          before a --verify round; forgets notifications
//   check <run> <slot_bytes> <slots> <notifs> data|nodata
//                                          after it: waits for the round's notifications and
//                                          (data) checks the written pattern
//   end                                    the agent goes away
//   cpu                                    -> "cpu <seconds>": this process's CPU time so far
//   kvshape <layers> <tokens> <heads> <dim> <dtype> <pool> <blocks>   the KV workload's shape
//   kvfill <run> <request>                 --kv --verify: patterns the pieces of the request;
//                                          forgets notifications
//   kvcheck <run> <request> <notifs>       waits for the notifications, checks the pieces
//   quit                                   -> "bye"; the process exits
// Between commands the target only polls getNotifs.
class Target {
 public:
    Target(const Options& o, int fd) : o_(o), fd_(fd), channel_(fd, fd) {}

    int serve() {
        while (true) {
            if (agent_.agent) poll_notifs();
            pollfd p{fd_, POLLIN, 0};
            const int r = ::poll(&p, 1, !agent_.agent ? -1 : o_.progress_thread ? 1 : 0);
            if (r <= 0) continue;
            std::string line;
            if (!channel_.read_line(&line)) return 1;  // the initiator is gone
            const auto w = words(line);
            if (!w.empty() && w[0] == "quit") {
                end();
                channel_.write_line("bye");
                return 0;
            }
            std::string reply = "ok";
            Status st = handle(w, &reply);
            if (!st.ok()) reply = "error " + st.to_string();
            if (!channel_.write_line(reply)) return 1;
        }
    }

 private:
    Status handle(const std::vector<std::string>& w, std::string* reply) {
        if (w.size() == 2 && w[0] == "alloc") {
            memory_.reset();
            TCPX_ASSIGN_OR_RETURN(memory_,
                                  Memory::allocate(o_.vram, o_.target_gpu, std::stoull(w[1])));
            return Status();
        }
        if (w.size() == 2 && w[0] == "begin") return begin(w[1], reply);
        if (w.size() == 5 && w[0] == "prepare") {
            if (!memory_) return failed_precondition("prepare before alloc");
            notifs_ = 0;
            return memory_->prepare(std::stoull(w[1]), std::stoull(w[2]), std::stoi(w[3]),
                                    w[4] == "fill");
        }
        if (w.size() == 6 && w[0] == "check") {
            return check(std::stoull(w[1]), std::stoull(w[2]), std::stoi(w[3]), std::stoi(w[4]),
                         w[5] == "data");
        }
        if (w.size() == 1 && w[0] == "end") {
            end();
            return Status();
        }
        if (w.size() == 1 && w[0] == "cpu") {
            *reply = strformat("cpu %.9f", process_cpu_seconds());
            return Status();
        }
        if (w.size() == 8 && w[0] == "kvshape") return parse_kv_shape_words(w, 1, &kv_);
        if (w.size() == 3 && w[0] == "kvfill") {
            TCPX_RETURN_IF_ERROR(kv_ready());
            notifs_ = 0;
            return kv_fill(memory_->buffer(), kv_, target_offsets(std::stoi(w[2])),
                           std::stoull(w[1]));
        }
        if (w.size() == 4 && w[0] == "kvcheck") {
            TCPX_RETURN_IF_ERROR(kv_ready());
            TCPX_RETURN_IF_ERROR(wait_notifs(std::stoi(w[3])));
            Status st = kv_check(memory_->buffer(), kv_, target_offsets(std::stoi(w[2])),
                                 std::stoull(w[1]), "target memory");
            if (!st.ok()) {
                return internal_error("VERIFICATION FAILED: " + std::string(st.message()));
            }
            return Status();
        }
        return invalid_argument("unknown command");
    }

    Status begin(const std::string& backend, std::string* reply) {
        end();
        if (!memory_) return failed_precondition("begin before alloc");
        TCPX_ASSIGN_OR_RETURN(agent_, create_agent(kTargetName, backend, o_));
        TCPX_RETURN_IF_ERROR(
            from_nixl(agent_.agent->registerMem(region_dlist(*memory_)), "registerMem"));
        registered_ = true;
        nixl_blob_t md;
        TCPX_RETURN_IF_ERROR(from_nixl(agent_.agent->getLocalMD(md), "getLocalMD"));
        *reply =
            strformat("ok %s %llu %llu", hex_blob(md).c_str(),
                      static_cast<unsigned long long>(reinterpret_cast<uintptr_t>(memory_->data())),
                      static_cast<unsigned long long>(memory_->dev_id()));
        return Status();
    }

    Status check(uint64_t run, uint64_t slot_bytes, int slots, int want_notifs, bool data) {
        if (!agent_.agent || !memory_) return failed_precondition("check outside begin/end");
        TCPX_RETURN_IF_ERROR(wait_notifs(want_notifs));
        if (!data) return Status();
        Status st = memory_->check(run, slot_bytes, slots, "target memory");
        if (!st.ok()) return internal_error("VERIFICATION FAILED: " + std::string(st.message()));
        return Status();
    }

    // Until `want` verify notifications arrived since the last prepare (or --timeout passed).
    Status wait_notifs(int want) {
        if (!agent_.agent) return failed_precondition("notifications outside begin/end");
        const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                                 std::chrono::duration<double>(o_.stall_seconds));
        while (notifs_ < want && Clock::now() < deadline) {
            poll_notifs();
            if (notifs_ < want) std::this_thread::sleep_for(std::chrono::microseconds(100));
        }
        if (notifs_ < want) {
            return internal_error(
                strformat("VERIFICATION FAILED: %d of %d notifications arrived", notifs_, want));
        }
        return Status();
    }

    Status kv_ready() const {
        if (!memory_ || memory_->size() < kv_.pool) return failed_precondition("no KV pool");
        return Status();
    }

    std::vector<uint64_t> target_offsets(int request) const {
        return kv_offsets(kv_, kv_seed(request, KvSide::kTarget));
    }

    void poll_notifs() {
        nixl_notifs_t notifs;
        if (agent_.agent->getNotifs(notifs) != NIXL_SUCCESS) return;
        for (const auto& [from, msgs] : notifs) {
            for (const auto& m : msgs) {
                if (from == kInitiatorName && m == kVerifyNotif) ++notifs_;
            }
        }
    }

    void end() {
        if (registered_) (void)agent_.agent->deregisterMem(region_dlist(*memory_));
        registered_ = false;
        agent_ = Agent();
    }

    const Options& o_;
    int fd_;
    FdChannel channel_;
    std::unique_ptr<Memory> memory_;
    Agent agent_;  // after memory_: goes first
    bool registered_ = false;
    int notifs_ = 0;  // verify notifications since the last prepare
    KvShape kv_;      // --kv
};

// --- the initiator (this process) ----------------------------------------------------------------

class Initiator {
 public:
    Initiator(const Options& o, Peer* peer, Memory* memory) : o_(o), peer_(peer), memory_(memory) {}
    ~Initiator() { end(); }

    // An agent with `backend` here and there, metadata loaded, connected.
    Status begin(const std::string& backend) {
        end();
        TCPX_ASSIGN_OR_RETURN(agent_, create_agent(kInitiatorName, backend, o_));
        TCPX_RETURN_IF_ERROR(
            from_nixl(agent_.agent->registerMem(region_dlist(*memory_)), "registerMem"));
        registered_ = true;
        target_begun_ = true;
        TCPX_ASSIGN_OR_RETURN(std::string reply, peer_->call("begin " + backend));
        const auto w = words(reply);
        std::string md;
        if (w.size() != 4 || w[0] != "ok" || !unhex_blob(w[1], &md)) {
            return protocol_error("target: " + reply);
        }
        remote_addr_ = std::stoull(w[2]);
        remote_dev_ = std::stoull(w[3]);
        TCPX_RETURN_IF_ERROR(from_nixl(agent_.agent->loadRemoteMD(md, target_), "loadRemoteMD"));
        nixl_opt_args_t args;
        args.backends = {agent_.backend};
        TCPX_RETURN_IF_ERROR(from_nixl(agent_.agent->makeConnection(target_, &args),
                                       "makeConnection to " + target_));
        return Status();
    }

    const nixl_b_params_t& params() const { return agent_.params; }

    // One request per slot for (op, size).
    Status prepare(Op op, uint64_t size) {
        release();
        op_ = op;
        slot_bytes_ = size * static_cast<uint64_t>(o_.batch);
        handles_.assign(static_cast<size_t>(depth_for(o_, size)), nullptr);
        const uintptr_t local = reinterpret_cast<uintptr_t>(memory_->data());
        for (size_t s = 0; s < handles_.size(); ++s) {
            nixl_xfer_dlist_t l(memory_->segment());
            nixl_xfer_dlist_t r(memory_->segment());
            for (int j = 0; j < o_.batch; ++j) {
                const uint64_t off = s * slot_bytes_ + static_cast<uint64_t>(j) * size;
                l.addDesc(nixlBasicDesc(local + off, size, memory_->dev_id()));
                r.addDesc(nixlBasicDesc(remote_addr_ + off, size, remote_dev_));
            }
            nixl_opt_args_t args;
            args.backends = {agent_.backend};
            TCPX_RETURN_IF_ERROR(from_nixl(
                agent_.agent->createXferReq(nixl_op(op), l, r, target_, handles_[s], &args),
                "createXferReq"));
        }
        return Status();
    }

    int depth() const { return static_cast<int>(handles_.size()); }
    uint64_t round_bytes() const { return slot_bytes_ * handles_.size(); }

    // Every slot once, each request with a notification: the source patterned and the
    // destination poisoned before, the destination checked after (here for READ, there for
    // WRITE), and every notification must have arrived.
    Status verify(uint64_t run) {
        const int n = depth();
        const std::string slots = strformat(" %llu %llu %d", static_cast<unsigned long long>(run),
                                            static_cast<unsigned long long>(slot_bytes_), n);
        const bool write = op_ == Op::kWrite;
        TCPX_RETURN_IF_ERROR(memory_->prepare(run, slot_bytes_, n, write));
        TCPX_RETURN_IF_ERROR(
            peer_->call("prepare" + slots + (write ? " poison" : " fill")).status());
        nixl_opt_args_t notif;
        notif.notif = kVerifyNotif;
        TCPX_RETURN_IF_ERROR(requests(static_cast<uint64_t>(n), &notif).status());
        if (!write) {
            Status st = memory_->check(run, slot_bytes_, n, "initiator memory");
            if (!st.ok())
                return internal_error("VERIFICATION FAILED: " + std::string(st.message()));
        }
        return peer_->call("check" + slots + strformat(" %d ", n) + (write ? "data" : "nodata"))
            .status();
    }

    // `total` requests with depth() in flight, each slot reposted as it completes. Returns the
    // seconds from the first post to the last completion.
    StatusOr<double> requests(uint64_t total, const nixl_opt_args_t* args = nullptr) {
        nixl_opt_args_t plain;  // no notification (clears one a handle was posted with)
        if (args == nullptr) args = &plain;
        Window w;
        w.count = total;
        w.window = depth();
        w.stall_seconds = o_.stall_seconds;
        w.what = strformat("%s of %s", op_name(op_), format_bytes(slot_bytes_).c_str());
        w.post = [&](size_t, int slot) { return post(static_cast<size_t>(slot), args); };
        w.done = [&](size_t, int slot) -> StatusOr<bool> {
            const nixl_status_t st = agent_.agent->getXferStatus(handles_[slot]);
            if (st == NIXL_IN_PROG) return false;
            TCPX_RETURN_IF_ERROR(from_nixl(st, "transfer"));
            return true;
        };
        TCPX_ASSIGN_OR_RETURN(std::vector<double> seconds, run_window(w));
        return seconds[0];
    }

    // Both sides' CPU seconds so far (the target is the other process: it reports its own).
    StatusOr<CpuTimes> cpu_seconds() { return both_cpu_seconds(peer_, true); }

    // --kv: one request per KV request of the workload (its every piece a descriptor, local
    // and remote blocks chosen by the two sides' seeds), then one of the same bytes as one
    // descriptor (the contiguous baseline), for `op`.
    Status prepare_kv(Op op) {
        release();
        op_ = op;
        const KvShape& k = o_.kv_shape;
        const uintptr_t local = reinterpret_cast<uintptr_t>(memory_->data());
        auto create = [&](const std::vector<uint64_t>& here, const std::vector<uint64_t>& there,
                          uint64_t len) -> Status {
            nixl_xfer_dlist_t l(memory_->segment());
            nixl_xfer_dlist_t r(memory_->segment());
            for (size_t i = 0; i < here.size(); ++i) {
                l.addDesc(nixlBasicDesc(local + here[i], len, memory_->dev_id()));
                r.addDesc(nixlBasicDesc(remote_addr_ + there[i], len, remote_dev_));
            }
            nixl_opt_args_t args;
            args.backends = {agent_.backend};
            handles_.push_back(nullptr);
            return from_nixl(
                agent_.agent->createXferReq(nixl_op(op), l, r, target_, handles_.back(), &args),
                "createXferReq");
        };
        for (int r = 0; r < kKvRequests; ++r) {
            TCPX_RETURN_IF_ERROR(create(kv_offsets(k, kv_seed(r, KvSide::kInitiator)),
                                        kv_offsets(k, kv_seed(r, KvSide::kTarget)),
                                        k.block_bytes()));
        }
        TCPX_RETURN_IF_ERROR(create({0}, {0}, k.request_bytes()));
        return Status();
    }

    // --kv: `count` requests one at a time (a decode pulling one sequence's cache), cycling
    // through the KV requests, or with `contiguous` the contiguous one. The seconds they took.
    StatusOr<double> kv_requests(bool contiguous, uint64_t count,
                                 const nixl_opt_args_t* args = nullptr) {
        nixl_opt_args_t plain;
        if (args == nullptr) args = &plain;
        const auto start = Clock::now();
        for (uint64_t n = 0; n < count; ++n) {
            const size_t h = contiguous ? kKvRequests : static_cast<size_t>(n % kKvRequests);
            TCPX_RETURN_IF_ERROR(post(h, args));
            TCPX_RETURN_IF_ERROR(wait(h).with_context(kv_what(contiguous)));
        }
        return seconds_since(start);
    }

    // --kv --verify: one request (the first KV request, or the contiguous one) with a
    // notification, its source patterned and its destination pool poisoned first; after it,
    // every byte of the destination's pieces must hold its pattern.
    Status verify_kv(uint64_t run, bool contiguous) {
        const KvShape& k = o_.kv_shape;
        const Buffer& local = memory_->buffer();
        const uint64_t total = k.request_bytes();
        const std::vector<uint64_t> offsets = kv_offsets(k, kv_seed(0, KvSide::kInitiator));
        const auto ull = [](uint64_t v) { return static_cast<unsigned long long>(v); };
        const bool write = op_ == Op::kWrite;
        if (write) {
            TCPX_RETURN_IF_ERROR(contiguous ? memory_->prepare(run, total, 1, /*pattern=*/true)
                                            : kv_fill(local, k, offsets, run));
            TCPX_RETURN_IF_ERROR(peer_
                                     ->call(strformat("prepare %llu %llu 1 poison", ull(run),
                                                      ull(contiguous ? total : k.pool)))
                                     .status());
        } else {
            TCPX_RETURN_IF_ERROR(
                peer_
                    ->call(contiguous ? strformat("prepare %llu %llu 1 fill", ull(run), ull(total))
                                      : strformat("kvfill %llu 0", ull(run)))
                    .status());
            TCPX_RETURN_IF_ERROR(
                memory_->prepare(run, contiguous ? total : k.pool, 1, /*pattern=*/false));
        }
        nixl_opt_args_t notif;
        notif.notif = kVerifyNotif;
        TCPX_RETURN_IF_ERROR(kv_requests(contiguous, 1, &notif).status());  // request 0
        if (write) {
            return peer_
                ->call(contiguous ? strformat("check %llu %llu 1 1 data", ull(run), ull(total))
                                  : strformat("kvcheck %llu 0 1", ull(run)))
                .status();
        }
        Status st = contiguous ? memory_->check(run, total, 1, "initiator memory")
                               : kv_check(local, k, offsets, run, "initiator memory");
        if (!st.ok()) return internal_error("VERIFICATION FAILED: " + std::string(st.message()));
        return peer_->call(strformat("check %llu 0 0 1 nodata", ull(run))).status();
    }

    // `count` requests one at a time (slot 0): microseconds from post to completion each.
    StatusOr<std::vector<double>> singles(uint64_t count) {
        std::vector<double> us;
        us.reserve(count);
        nixl_opt_args_t plain;
        for (uint64_t i = 0; i < count; ++i) {
            const auto start = Clock::now();
            TCPX_RETURN_IF_ERROR(post(0, &plain));
            nixl_status_t st;
            uint64_t spins = 0;
            while ((st = agent_.agent->getXferStatus(handles_[0])) == NIXL_IN_PROG) {
                if (++spins % 1024 == 0 && seconds_since(start) > o_.stall_seconds) {
                    return timeout_error("a single transfer did not complete");
                }
            }
            TCPX_RETURN_IF_ERROR(from_nixl(st, "transfer"));
            us.push_back(seconds_since(start) * 1e6);
        }
        return us;
    }

    void end() {
        release();
        if (registered_) (void)agent_.agent->deregisterMem(region_dlist(*memory_));
        registered_ = false;
        if (agent_.agent && !target_.empty()) (void)agent_.agent->invalidateRemoteMD(target_);
        target_.clear();
        agent_ = Agent();
        if (target_begun_) (void)peer_->call("end");
        target_begun_ = false;
    }

 private:
    std::string kv_what(bool contiguous) const {
        return strformat("%s of a KV request%s", op_name(op_), contiguous ? " (contiguous)" : "");
    }

    // Until the request of `slot` completes (or --timeout passes without it).
    Status wait(size_t slot) {
        const auto start = Clock::now();
        nixl_status_t st;
        uint64_t spins = 0;
        while ((st = agent_.agent->getXferStatus(handles_[slot])) == NIXL_IN_PROG) {
            if (++spins % 1024 == 0 && seconds_since(start) > o_.stall_seconds) {
                return timeout_error(
                    strformat("a request did not complete in %.0f s", o_.stall_seconds));
            }
        }
        return from_nixl(st, "transfer");
    }

    Status post(size_t slot, const nixl_opt_args_t* args) {
        const nixl_status_t st = agent_.agent->postXferReq(handles_[slot], args);
        if (st == NIXL_SUCCESS || st == NIXL_IN_PROG) return Status();
        return from_nixl(st, "postXferReq");
    }

    void release() {
        for (nixlXferReqH* h : handles_) {
            if (h != nullptr) (void)agent_.agent->releaseXferReq(h);
        }
        handles_.clear();
    }

    const Options& o_;
    Peer* peer_;
    Memory* memory_;
    Agent agent_;
    bool registered_ = false;
    bool target_begun_ = false;
    std::string target_;  // the target agent's name, from its metadata
    uint64_t remote_addr_ = 0;
    uint64_t remote_dev_ = 0;
    Op op_ = Op::kWrite;
    uint64_t slot_bytes_ = 0;
    std::vector<nixlXferReqH*> handles_;
};

// --- results
// ---------------------------------------------------------------------------------------

struct Row {
    std::string backend;
    Op op = Op::kWrite;
    uint64_t size = 0;
    int depth = 0;
    Throughput tp;
    Latency lat;
    bool verified = false;
    std::string error;  // the case failed
};

struct BackendInfo {
    std::string name;
    std::string error;  // could not be created (skipped), or failed part way
    nixl_b_params_t params;
};

struct Machine {
    long cores = 0;
    std::string cpu;
    std::string kernel;
    std::string ucx_tls;
    bool ucx_tls_set_here = false;
    std::string ucx_net_devices;
    std::string plugin_dir;
};

Machine machine_info() {
    Machine m;
    m.cores = ::sysconf(_SC_NPROCESSORS_ONLN);
    std::ifstream cpuinfo("/proc/cpuinfo");
    for (std::string line; std::getline(cpuinfo, line);) {
        if (line.rfind("model name", 0) == 0) {
            const size_t colon = line.find(':');
            if (colon != std::string::npos) m.cpu = std::string(trim(line.substr(colon + 1)));
            break;
        }
    }
    utsname u{};
    if (::uname(&u) == 0) m.kernel = std::string(u.sysname) + " " + u.release;
    return m;
}

// The ratio column's pair: TCPX against UCX.
const Row* find_row(const std::vector<Row>& rows, const std::string& backend, const Row& like) {
    for (const Row& r : rows) {
        if (r.backend == backend && r.op == like.op && r.size == like.size && r.error.empty()) {
            return &r;
        }
    }
    return nullptr;
}

std::string size_label(const Options& o, uint64_t size) {
    std::string s = format_bytes(size);
    return o.batch > 1 ? strformat("%dx%s", o.batch, s.c_str()) : s;
}

std::string sorted_params(const nixl_b_params_t& params) {
    std::map<std::string, std::string> sorted(params.begin(), params.end());
    std::string out;
    for (const auto& [k, v] : sorted) {
        out += (out.empty() ? "" : ", ") + k + "=" + (v.empty() ? "\"\"" : v);
    }
    return out.empty() ? "(none)" : out;
}

std::string usecs(double v) {
    return v >= 10000 ? strformat("%.2f ms", v / 1000) : strformat("%.1f us", v);
}

// The machine, the environment and every backend's parameters.
void print_header(const Options& o, const Machine& m, const std::vector<BackendInfo>& backends) {
    std::printf("%s: NIXL backends through nixlAgent, 2 processes on this host, %s%s\n", kProgram,
                mem_name(o), o.kv ? ", a paged KV cache (--kv), one request at a time" : "");
    std::printf("machine: %ld cores, %s, %s\n", m.cores, m.cpu.empty() ? "?" : m.cpu.c_str(),
                m.kernel.c_str());
    std::printf("UCX_TLS=%s%s", m.ucx_tls.c_str(),
                m.ucx_tls_set_here ? " (set by this program)" : " (from the environment)");
    if (!m.ucx_net_devices.empty()) std::printf(", UCX_NET_DEVICES=%s", m.ucx_net_devices.c_str());
    std::printf("\nNIXL_PLUGIN_DIR=%s\n", m.plugin_dir.empty() ? "(unset)" : m.plugin_dir.c_str());
    std::printf("NIXL progress threads: %s\n",
                o.progress_thread ? "on (both agents)"
                                  : "off (data moves inside the applications' calls; the target "
                                    "polls getNotifs without pause)");
    for (const BackendInfo& b : backends) {
        if (b.params.empty() && !b.error.empty()) {
            std::printf("%s: SKIPPED: %s\n", b.name.c_str(), b.error.c_str());
            continue;
        }
        std::printf("%s params: %s\n", b.name.c_str(), sorted_params(b.params).c_str());
        if (!b.error.empty()) std::printf("%s: FAILED: %s\n", b.name.c_str(), b.error.c_str());
    }
}

void print_table(const Options& o, const Machine& m, const std::vector<BackendInfo>& backends,
                 const std::vector<Row>& rows) {
    print_header(o, m, backends);
    const std::string gpus =
        o.vram ? strformat(", GPU %d -> GPU %d", o.initiator_gpu, o.target_gpu) : "";
    std::printf(
        "throughput: GB/s (10^9 B/s), `depth` requests of %d descriptor%s in flight, reposted as "
        "they complete\nlatency: one request at a time, post to completion%s\n"
        "CPU s/GB: CPU seconds (user + system, every thread) of both processes, initiator and "
        "target, per GB moved by the throughput run\n\n",
        o.batch, o.batch == 1 ? "" : "s", gpus.c_str());
    // A row and the UCX row of its case (for the ratios), when there is one.
    using Pair = std::pair<const Row*, const Row*>;
    auto tcpx_ucx = [&o](const Pair& p, bool latency) {
        if (p.first->backend != "TCPX" || p.second == nullptr) return std::string();
        if (!latency) return ratio(p.first->tp.gbps, p.second->tp.gbps);
        return o.latency ? ratio(p.first->lat.p50_us, p.second->lat.p50_us) : std::string();
    };
    const std::vector<Column<Pair>> cols = {
        {0, -7, "backend", [](const Pair& p) { return p.first->backend; }},
        {1, -5, "op", [](const Pair& p) { return std::string(op_name(p.first->op)); }},
        {1, -4, "mem", [&o](const Pair&) { return std::string(mem_name(o)); }},
        {1, 10, "size", [&o](const Pair& p) { return size_label(o, p.first->size); }},
        {1, 5, "depth", [](const Pair& p) { return std::to_string(p.first->depth); }},
        {1, 8, "GB/s", [](const Pair& p) { return strformat("%.2f", p.first->tp.gbps); }},
        {1, 9, "CPU s/GB", [](const Pair& p) { return cpu_cell(p.first->tp); }},
        {1, 10, "lat p50",
         [&o](const Pair& p) { return o.latency ? usecs(p.first->lat.p50_us) : "-"; }},
        {1, 10, "lat p99",
         [&o](const Pair& p) { return o.latency ? usecs(p.first->lat.p99_us) : "-"; }},
        {2, 13, "TCPX/UCX GB/s", [=](const Pair& p) { return tcpx_ucx(p, false); }},
        {1, 13, "TCPX/UCX p50", [=](const Pair& p) { return tcpx_ucx(p, true); }},
    };
    // The cells that name the case, before FAILED on a row that failed.
    const std::vector<Column<Pair>> case_cols(cols.begin(), cols.begin() + 4);
    std::printf("%s\n", table_head(cols).c_str());
    // Grouped by case, the backends of one case next to each other.
    for (Op op : o.ops) {
        for (uint64_t size : o.sizes) {
            for (const std::string& backend : o.backends) {
                for (const Row& r : rows) {
                    if (r.op != op || r.size != size || r.backend != backend) continue;
                    const Pair p{&r, find_row(rows, "UCX", r)};
                    if (!r.error.empty()) {
                        std::printf("%s  FAILED: %s\n", table_row(case_cols, p).c_str(),
                                    r.error.c_str());
                        continue;
                    }
                    std::printf("%s\n", table_row(cols, p).c_str());
                }
            }
        }
    }
    if (o.verify) {
        std::printf(
            "\nverified: the first round of every case (every slot once, with a notification)\n");
    }
}

// --kv: the rows' layout is bench/kv_workload's, as in `tcpx-p2p bench engine --kv`.
void print_kv_table(const Options& o, const Machine& m, const std::vector<BackendInfo>& backends,
                    const std::vector<KvRow>& rows) {
    print_header(o, m, backends);
    print_kv_shape(o.kv_shape);
    std::printf(
        "KV: one NIXL request per KV request, its pieces the descriptors; contiguous: one "
        "request of one descriptor%s\n",
        o.vram ? strformat(", GPU %d -> GPU %d", o.initiator_gpu, o.target_gpu).c_str() : "");
    print_kv_rows(rows, o.verify);
    if (o.verify) {
        std::printf(
            "\nverified: one request of every kind, every byte of its pieces (with a "
            "notification)\n");
    }
}

void print_json(const Options& o, const Machine& m, const std::vector<BackendInfo>& backends,
                const std::vector<Row>& rows, const std::vector<KvRow>& kv_rows) {
    using nlohmann::json;
    json out;
    out["benchmark"] = o.kv ? "nixl-kv" : "nixl";
    out["machine"] = {{"cores", m.cores}, {"cpu", m.cpu}, {"kernel", m.kernel}};
    out["env"] = {{"UCX_TLS", m.ucx_tls},
                  {"UCX_TLS_set_by_benchmark", m.ucx_tls_set_here},
                  {"UCX_NET_DEVICES", m.ucx_net_devices},
                  {"NIXL_PLUGIN_DIR", m.plugin_dir}};
    out["config"] = {{"mem", o.vram ? "vram" : "dram"},
                     {"batch", o.batch},
                     {"depth", o.depth},
                     {"max_memory", o.max_memory},
                     {"min_seconds", o.min_seconds},
                     {"min_iters", o.min_iters},
                     {"verify", o.verify},
                     {"progress_thread", o.progress_thread}};
    if (o.vram) out["config"]["gpus"] = {o.initiator_gpu, o.target_gpu};
    out["backends"] = json::array();
    for (const BackendInfo& b : backends) {
        json j = {{"name", b.name},
                  {"params", std::map<std::string, std::string>(b.params.begin(), b.params.end())}};
        if (!b.error.empty()) j["error"] = b.error;
        out["backends"].push_back(j);
    }
    out["results"] = json::array();
    if (o.kv) {
        out["kv"] = kv_shape_json(o.kv_shape);
        for (const KvRow& r : kv_rows) out["results"].push_back(kv_row_json(r));
    }
    for (const Row& r : rows) {
        json j = {{"backend", r.backend},
                  {"op", r.op == Op::kWrite ? "write" : "read"},
                  {"mem", o.vram ? "vram" : "dram"},
                  {"size", r.size},
                  {"batch", o.batch},
                  {"depth", r.depth}};
        if (!r.error.empty()) {
            j["error"] = r.error;
        } else {
            j.update(
                throughput_json(r.tp, "requests", r.tp.iters * static_cast<uint64_t>(r.depth)));
            if (o.latency) j["latency"] = latency_json(r.lat);
            j["verified"] = r.verified;
            if (r.backend == "TCPX") {
                const Row* ucx = find_row(rows, "UCX", r);
                if (ucx != nullptr) {
                    j["tcpx_over_ucx_gbps"] = r.tp.gbps / ucx->tp.gbps;
                    if (o.latency) j["tcpx_over_ucx_p50"] = r.lat.p50_us / ucx->lat.p50_us;
                }
            }
        }
        out["results"].push_back(j);
    }
    std::printf("%s\n", out.dump(2).c_str());
}

// --- the sweep
// -------------------------------------------------------------------------------------

// Runs every case of one backend (its agent already begun); appends rows. A failed case ends
// the backend's sweep (its agents may be unusable). Verification failures set *verify_failed.
Status sweep_backend(const Options& o, const std::string& backend, Initiator* init, Sweep* sweep,
                     uint64_t* run, std::vector<Row>* rows, bool* verify_failed) {
    for (Op op : o.ops) {
        for (uint64_t size : o.sizes) {
            Row row;
            row.backend = backend;
            row.op = op;
            row.size = size;
            row.depth = depth_for(o, size);
            const std::string what = backend + " " + op_name(op) + " " + size_label(o, size);
            Status st = [&]() -> Status {
                TCPX_RETURN_IF_ERROR(init->prepare(op, size));
                if (o.verify) {
                    Status v = init->verify(++*run);
                    if (!v.ok() && v.message().find("VERIFICATION FAILED") != std::string::npos) {
                        *verify_failed = true;
                    }
                    TCPX_RETURN_IF_ERROR(v);
                    row.verified = true;
                }
                // An iteration is a round: every slot once.
                TCPX_ASSIGN_OR_RETURN(
                    row.tp,
                    sweep->throughput(
                        what + ": throughput", init->round_bytes(), [&](uint64_t count) {
                            return init->requests(count * static_cast<uint64_t>(init->depth()));
                        }));
                if (o.latency) {
                    TCPX_ASSIGN_OR_RETURN(row.lat,
                                          sweep->latency(what + ": latency", [&](uint64_t count) {
                                              return init->singles(count);
                                          }));
                }
                return Status();
            }();
            if (!st.ok()) {
                row.error = st.to_string();
                rows->push_back(row);
                return st.with_context(what);
            }
            rows->push_back(row);
        }
    }
    return Status();
}

// --kv: every op of one backend (its agent already begun), KV requests and the contiguous
// request; appends rows. As sweep_backend for failures.
Status sweep_kv(const Options& o, const std::string& backend, Initiator* init, Sweep* sweep,
                uint64_t* run, std::vector<KvRow>* rows, bool* verify_failed) {
    const uint64_t bytes = o.kv_shape.request_bytes();
    for (Op op : o.ops) {
        KvRow row;
        row.backend = backend;
        row.op = op_name(op);
        row.mem = mem_name(o);
        Status st = [&]() -> Status {
            TCPX_RETURN_IF_ERROR(init->prepare_kv(op));
            for (bool contiguous : {false, true}) {
                const std::string what = strformat("%s %s, %s", backend.c_str(), op_name(op),
                                                   contiguous ? "contiguous" : "KV requests");
                Throughput& out = contiguous ? row.contiguous : row.kv;
                TCPX_ASSIGN_OR_RETURN(out, sweep->throughput(what, bytes, [&](uint64_t n) {
                    return init->kv_requests(contiguous, n);
                }));
                if (o.verify) {
                    Status v = init->verify_kv(++*run, contiguous).with_context(what);
                    if (!v.ok() && v.message().find("VERIFICATION FAILED") != std::string::npos) {
                        *verify_failed = true;
                    }
                    TCPX_RETURN_IF_ERROR(v);
                }
            }
            row.verified = o.verify;
            return Status();
        }();
        if (!st.ok()) {
            row.error = st.to_string();
            rows->push_back(row);
            return st;
        }
        rows->push_back(row);
    }
    return Status();
}

int run_initiator(const Options& o, std::unique_ptr<ForkPeer> peer, Machine machine) {
    int rc = 0;
    std::vector<BackendInfo> backends;
    std::vector<Row> rows;
    std::vector<KvRow> kv_rows;
    {
        std::unique_ptr<Memory> memory;
        // --kv: the pool, the same for the KV requests and the contiguous one.
        const uint64_t bytes = o.kv ? o.kv_shape.pool : region_bytes(o);
        Status st = [&]() -> Status {
            TCPX_ASSIGN_OR_RETURN(memory, Memory::allocate(o.vram, o.initiator_gpu, bytes));
            TCPX_RETURN_IF_ERROR(
                peer->call("alloc " + std::to_string(bytes)).status().with_context("target"));
            if (!o.kv) return Status();
            return peer->call("kvshape " + kv_shape_words(o.kv_shape))
                .status()
                .with_context("target");
        }();
        if (!st.ok()) {
            std::fprintf(stderr, "%s: %s\n", kProgram, st.to_string().c_str());
            return 1;  // ~ForkPeer: "quit", and the child is reaped
        }
        Initiator init(o, peer.get(), memory.get());
        // Measurements per backend.
        const size_t per_backend =
            o.kv ? o.ops.size() * 2 : o.ops.size() * o.sizes.size() * (o.latency ? 2 : 1);
        Progress progress(o.progress && !o.json, o.backends.size() * per_backend);
        Calibration cal;
        cal.min_seconds = o.min_seconds;
        cal.min_iters = static_cast<uint64_t>(o.min_iters);
        Sweep sweep(cal, &progress, [&] { return init.cpu_seconds(); });
        uint64_t run = 0;
        bool verify_failed = false;
        for (const std::string& backend : o.backends) {
            BackendInfo info;
            info.name = backend;
            Status begun = init.begin(backend);
            info.params = init.params();
            if (!begun.ok()) {
                info.error = begun.to_string();
                progress.clear();
                std::fprintf(stderr, "%s: backend %s skipped: %s\n", kProgram, backend.c_str(),
                             info.error.c_str());
                init.end();
                backends.push_back(info);
                progress.skip(per_backend);
                continue;
            }
            Status swept =
                o.kv ? sweep_kv(o, backend, &init, &sweep, &run, &kv_rows, &verify_failed)
                     : sweep_backend(o, backend, &init, &sweep, &run, &rows, &verify_failed);
            if (!swept.ok()) {
                info.error = swept.to_string();
                progress.clear();
                std::fprintf(stderr, "%s: %s\n", kProgram, info.error.c_str());
                rc = 1;
            }
            init.end();
            backends.push_back(info);
        }
        progress.clear();
        if (verify_failed) rc = 1;
        // Nothing measured at all (every backend skipped) is a failure too.
        if (rows.empty() && kv_rows.empty()) rc = 1;
    }
    peer.reset();  // "quit"; the target exits
    if (o.json) {
        print_json(o, machine, backends, rows, kv_rows);
    } else if (o.kv) {
        print_kv_table(o, machine, backends, kv_rows);
    } else {
        print_table(o, machine, backends, rows);
    }
    return rc;
}

// Splits "A,B" into words; false when empty.
bool split_list(const std::string& text, std::vector<std::string>* out) {
    *out = split_trimmed(text, ',');
    std::erase_if(*out, [](const std::string& s) { return s.empty(); });
    return !out->empty();
}

}  // namespace

int nixl_bench_main(int argc, char** argv) {
    CLI::App app{
        "tcpx-nixl-bench: NIXL backends (TCPX, UCX, ...) side by side through nixlAgent, "
        "initiator and target in two processes on this host"};
    Options o;
    std::string backends = "TCPX,UCX";
    std::string ops = "write,read";
    std::string sizes = "4K,64K,1M,16M,64M";
    std::string mem = "dram";
    std::string gpus = "0,0";
    std::string max_memory = "512M";
    std::vector<std::string> params;
    bool no_latency = false;
    bool no_progress = false;
    app.add_option("--backends", backends, "NIXL backends to measure, in this order")
        ->capture_default_str();
    app.add_option("--ops", ops, "Operations: write, read or both")->capture_default_str();
    app.add_option("--sizes", sizes,
                   "Bytes per descriptor: a list (4K,1M) or a range (4K..64M, x4)")
        ->capture_default_str();
    app.add_option("--depth", o.depth,
                   "Requests in flight for throughput (fewer where they would pass --max-memory)")
        ->capture_default_str()
        ->check(CLI::Range(1, 4096));
    app.add_option("--batch", o.batch, "Descriptors per request")
        ->capture_default_str()
        ->check(CLI::Range(1, 65536));
    app.add_option("--max-memory", max_memory,
                   "Registered bytes per side at most (depth x batch x size)")
        ->capture_default_str();
    app.add_option("--time", o.min_seconds, "Seconds per measurement")
        ->capture_default_str()
        ->check(CLI::Range(0.01, 600.0));
    app.add_option("--iters", o.min_iters, "Minimum rounds (of --depth requests) per measurement")
        ->capture_default_str()
        ->check(CLI::Range(1, 1000000));
    app.add_option("--mem", mem, "Memory on both sides")
        ->capture_default_str()
        ->check(CLI::IsMember({"dram", "vram"}));
    app.add_option("--gpus", gpus, "With --mem vram: initiator GPU,target GPU")
        ->capture_default_str();
    app.add_option("--interface", o.interface,
                   "The TCPX backend's 'interface' parameter (TCPX_P2P_SOCKET_IFNAME syntax)")
        ->capture_default_str();
    app.add_option("--param", params,
                   "A backend parameter over the plugin's default, BACKEND:key=value (repeatable), "
                   "e.g. TCPX:nsocks=4 or UCX:num_workers=2");
    app.add_flag("--verify,!--no-verify", o.verify,
                 "Check the bytes (and notifications) of the first round of every case")
        ->capture_default_str();
    app.add_flag("--no-latency", no_latency, "Skip the one-at-a-time (latency) measurements");
    app.add_option("--timeout", o.stall_seconds,
                   "Seconds without a completion before a backend counts as stuck")
        ->capture_default_str()
        ->check(CLI::Range(1.0, 3600.0));
    KvCommandLine kv;
    add_kv_options(&app, &kv, &o.kv_shape);
    app.add_flag("--json", o.json, "Print JSON instead of a table");
    app.add_flag("--no-progress", no_progress, "No progress display on stderr");
    std::string progress_thread = "on";
    app.add_option("--progress-thread", progress_thread,
                   "NIXL's progress thread in both agents: on, or off (as nixlbench runs: data "
                   "moves only inside getXferStatus and getNotifs)")
        ->check(CLI::IsMember({"on", "off"}))
        ->capture_default_str();
    CLI11_PARSE(app, argc, argv);
    o.latency = !no_latency;
    o.progress = !no_progress;
    o.progress_thread = progress_thread == "on";

    auto usage = [](const std::string& msg) {
        std::fprintf(stderr, "%s: %s\n", kProgram, msg.c_str());
        return 2;
    };
    if (!split_list(backends, &o.backends)) return usage("--backends: no backend");
    o.kv = kv.kv;
    if (Status st = parse_kv_options(kv, &o.kv_shape); !st.ok()) {
        return usage(std::string(st.message()));
    }
    // As `tcpx-p2p bench engine --kv`: well-formed options that make no KV workload fail (1).
    if (o.kv) {
        Status st = o.batch != 1 ? invalid_argument("--kv: a request is its own batch (no --batch)")
                                 : check_kv_shape(o.kv_shape);
        if (!st.ok()) {
            std::fprintf(stderr, "%s: %s\n", kProgram, std::string(st.message()).c_str());
            return 1;
        }
    }
    std::vector<std::string> op_words;
    if (!split_list(ops, &op_words)) return usage("--ops: no operation");
    o.ops.clear();
    for (const std::string& w : op_words) {
        if (w == "write" || w == "WRITE") {
            o.ops.push_back(Op::kWrite);
        } else if (w == "read" || w == "READ") {
            o.ops.push_back(Op::kRead);
        } else {
            return usage("--ops: '" + w + "' is neither write nor read");
        }
    }
    if (!parse_size_list(sizes, &o.sizes)) {
        return usage("--sizes '" + sizes + "' is not a size list or range");
    }
    for (uint64_t s : o.sizes) {
        if (s == 0) return usage("--sizes: a size of 0");
    }
    if (!parse_size(max_memory, &o.max_memory) || o.max_memory == 0) {
        return usage("--max-memory '" + max_memory + "' is not a size");
    }
    o.vram = mem == "vram";
    if (o.vram) {
#ifndef TCPX_P2P_HAVE_CUDA
        return usage("--mem vram: this build has no CUDA (built without TCPX_P2P_HAVE_CUDA)");
#endif
        std::vector<int> g;
        if (!parse_gpu_pair(gpus, &g)) {
            return usage("--gpus: expected two GPU indices, initiator,target (e.g. 0,1)");
        }
        o.initiator_gpu = g[0];
        o.target_gpu = g[1];
    }
    for (const std::string& p : params) {
        const size_t colon = p.find(':');
        const size_t eq = p.find('=', colon == std::string::npos ? 0 : colon);
        if (colon == std::string::npos || colon == 0 || eq == std::string::npos ||
            eq == colon + 1) {
            return usage("--param '" + p + "': expected BACKEND:key=value");
        }
        o.params.push_back(
            {p.substr(0, colon), {p.substr(colon + 1, eq - colon - 1), p.substr(eq + 1)}});
    }

    // Environment for both processes, before any agent exists: UCX over TCP unless the user
    // chose its transports, and this build's plugin directory unless one is given.
#ifdef TCPX_NIXL_BENCH_PLUGIN_DIR
    if (std::getenv("NIXL_PLUGIN_DIR") == nullptr &&
        ::access(TCPX_NIXL_BENCH_PLUGIN_DIR, R_OK) == 0) {
        ::setenv("NIXL_PLUGIN_DIR", TCPX_NIXL_BENCH_PLUGIN_DIR, 1);
        // That directory links NIXL's own plugins (UCX), which find their libraries through
        // $ORIGIN/..: the loader takes $ORIGIN from the path a plugin was opened by, so through
        // a link it looks beside the link. NIXL's library directory on LD_LIBRARY_PATH fixes
        // that; the loader reads it only when a program starts, hence the new start.
        const char* ld = std::getenv("LD_LIBRARY_PATH");
        const std::string path = ld != nullptr ? ld : "";
        const auto dirs = split_trimmed(path, ':');
        if (std::find(dirs.begin(), dirs.end(), TCPX_NIXL_BENCH_LIB_DIR) == dirs.end()) {
            const std::string with =
                std::string(TCPX_NIXL_BENCH_LIB_DIR) + (path.empty() ? "" : ":" + path);
            ::setenv("LD_LIBRARY_PATH", with.c_str(), 1);
            // By its own path, not /proc/self/exe: that would rename the process "exe".
            char self[4096];
            const ssize_t n = ::readlink("/proc/self/exe", self, sizeof(self) - 1);
            if (n > 0) {
                self[n] = '\0';
                ::execv(self, argv);
            }
            std::perror("re-executing with LD_LIBRARY_PATH");  // carries on without it
        }
    }
#endif
    Machine machine = machine_info();
    if (const char* tls = std::getenv("UCX_TLS"); tls != nullptr) {
        machine.ucx_tls = tls;
    } else {
        ::setenv("UCX_TLS", "tcp", 1);
        machine.ucx_tls = "tcp";
        machine.ucx_tls_set_here = true;
    }
    if (const char* devs = std::getenv("UCX_NET_DEVICES"); devs != nullptr) {
        machine.ucx_net_devices = devs;
    }
    if (const char* dir = std::getenv("NIXL_PLUGIN_DIR"); dir != nullptr) machine.plugin_dir = dir;
    if (!o.json) {
        std::string devs;
        if (!machine.ucx_net_devices.empty()) devs = ", UCX_NET_DEVICES=" + machine.ucx_net_devices;
        std::fprintf(stderr, "%s: UCX_TLS=%s%s%s\n", kProgram, machine.ucx_tls.c_str(),
                     machine.ucx_tls_set_here ? " (set by this program)" : "", devs.c_str());
    }

    ::signal(SIGPIPE, SIG_IGN);
    // No agent, no thread and no CUDA context exists yet: both sides start clean.
    StatusOr<std::unique_ptr<ForkPeer>> peer = ForkPeer::fork([&o](int fd) {
        Target target(o, fd);
        return target.serve();
    });
    if (!peer.ok()) {
        std::fprintf(stderr, "%s: %s\n", kProgram, peer.status().to_string().c_str());
        return 1;
    }
    return run_initiator(o, std::move(*peer), machine);
}

}  // namespace tcpx::bench

int main(int argc, char** argv) { return tcpx::bench::nixl_bench_main(argc, argv); }
