// The target side of tcpx-nixl-bench: one region, an agent per backend in turn, and the
// initiator's commands; between them it only polls getNotifs (the transfers are one-sided).
#include "bench/nixl/target.h"

#include <chrono>
#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "bench/harness/measure.h"
#include "bench/harness/roles.h"
#include "bench/kv_workload.h"
#include "bench/nixl/agent.h"
#include "common/status_util.h"
#include "common/strings.h"

namespace tcpx::bench::nixl_bench {
namespace {

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
//   quit                                   -> "bye"; the target is done
// Between commands the target only polls getNotifs: every 1 ms with progress threads; without
// them (--progress-thread off), without pause, since only its calls move its side's data.
class Target {
 public:
    Target(const Options& o, uint64_t max_region) : o_(o), max_region_(max_region) {}
    ~Target() { end(); }

    Status serve(Channel* ch) {
        IdleWork idle;
        idle.every_ms = [this] { return !agent_.agent ? -1 : o_.progress_thread ? 1 : 0; };
        idle.run = [this] { poll_notifs(); };
        return serve_commands(
            ch,
            [this](const std::vector<std::string>& w, const std::string&, std::string* reply) {
                return handle(w, reply);
            },
            [this] { end(); }, &idle);
    }

 private:
    Status handle(const std::vector<std::string>& w, std::string* reply) {
        // The numbers of a command are the network's: whole decimal words within bounds, where
        // std::stoull took "-1" as 2^64 - 1 and "12abc" as 12.
        uint64_t u1 = 0, u2 = 0;
        int i1 = 0, i2 = 0;
        const auto u64 = [](const std::string& word, uint64_t* out) {
            return parse_uint(word, std::numeric_limits<uint64_t>::max(), out);
        };
        const auto count = [](const std::string& word, int* out) {
            return parse_int(word, 0, std::numeric_limits<int>::max(), out);
        };
        const Status bad = invalid_argument("malformed command");
        if (w.size() == 2 && w[0] == "alloc") return u64(w[1], &u1) ? alloc(u1) : bad;
        if (w.size() == 2 && w[0] == "begin") return begin(w[1], reply);
        if (w.size() == 5 && w[0] == "prepare") {
            if (!memory_) return failed_precondition("prepare before alloc");
            if (!u64(w[1], &u1) || !u64(w[2], &u2) || !count(w[3], &i1)) return bad;
            notifs_ = 0;
            return memory_->prepare(u1, u2, i1, w[4] == "fill");
        }
        if (w.size() == 6 && w[0] == "check") {
            if (!u64(w[1], &u1) || !u64(w[2], &u2) || !count(w[3], &i1) || !count(w[4], &i2)) {
                return bad;
            }
            return check(u1, u2, i1, i2, w[5] == "data");
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
            if (!u64(w[1], &u1) || !count(w[2], &i1)) return bad;
            notifs_ = 0;
            return kv_fill(memory_->buffer(), kv_, target_offsets(i1), u1);
        }
        if (w.size() == 4 && w[0] == "kvcheck") {
            TCPX_RETURN_IF_ERROR(kv_ready());
            if (!u64(w[1], &u1) || !count(w[2], &i1) || !count(w[3], &i2)) return bad;
            TCPX_RETURN_IF_ERROR(wait_notifs(i2));
            Status st = kv_check(memory_->buffer(), kv_, target_offsets(i1), u1, "target memory");
            if (!st.ok()) {
                return internal_error("VERIFICATION FAILED: " + std::string(st.message()));
            }
            return Status();
        }
        return invalid_argument("unknown command");
    }

    Status alloc(uint64_t bytes) {
        if (bytes == 0) return invalid_argument("alloc: 0 bytes");
        if (bytes > max_region_) {
            return invalid_argument(
                strformat("alloc: more than %s per side", format_bytes(max_region_).c_str()));
        }
        end();  // the agent's registration is of the old region
        memory_.reset();
        TCPX_ASSIGN_OR_RETURN(memory_, Memory::allocate(o_.vram, o_.target_gpu, bytes));
        return Status();
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
    const uint64_t max_region_;
    std::unique_ptr<Memory> memory_;
    Agent agent_;  // after memory_: goes first
    bool registered_ = false;
    int notifs_ = 0;  // verify notifications since the last prepare
    KvShape kv_;      // --kv
};

}  // namespace

Status serve_target(const Options& o, Channel* ch, uint64_t max_region) {
    Target target(o, max_region);
    return target.serve(ch);
}

}  // namespace tcpx::bench::nixl_bench
