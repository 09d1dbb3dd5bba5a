// The target side of `tcpx-p2p bench engine` (the responder): its endpoints, their memory, and the
// initiator's commands.
#include "bench/engine/target.h"

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "bench/engine/common.h"
#include "bench/harness/measure.h"
#include "bench/harness/raw_tcp.h"
#include "bench/kv_workload.h"
#include "common/status_util.h"
#include "common/strings.h"

namespace tcpx::bench::engine_bench {
namespace {

// Commands (one line each, replies "ok" unless said otherwise):
//   endpoints <n> [pergpu]         creates n endpoints (pergpu: endpoint i on GPU i)
//                                  -> "md <hex metadata>..."
//   accept <ms>                    waits until every endpoint has its peer (accept())
//   mem <type> <bytes>             a registered region of at least `bytes` of memory `type`
//                                  (host|vram) per endpoint (with --bidir two: one per direction)
//                                  -> "mem <hex descriptor>..."
//   rmem <type> <hex descriptor>...  --bidir: the initiator's regions the targets' own transfers
//                                  go to or come from, one per endpoint
//   xfer write|read <type> <count> <size> <batch> <conc> <n>   --bidir: the same transfers as the
//                                  initiator's, from the first n endpoints toward theirs, from or
//                                  into the second regions -> "secs <seconds per endpoint>..."
//   prep write|read <type> <run> <off> <len> <n> [rev]   before a verified measurement: poisons
//                                  (write) or patterns (read) [off, off + len) of the first n
//                                  regions of that type (rev: of the second regions)
//   check <type> <run> <off> <len> <n> [rev]   after one: checks the pattern there
//   kvshape <layers> <tokens> <heads> <dim> <dtype> <pool> <blocks>   the KV workload's shape
//   channels                       -> "channels <n>": the data channels its endpoints offer
//   cpu                            -> "cpu <seconds>": this process's CPU time so far
//   kvfill|kvcheck <type> <run> <request>   --verify of a KV request: patterns, or checks, the
//                                  pieces of request <request> in the first endpoint's region
//   raw-*                          the raw TCP baseline, in the first host region's memory
//   quit                           -> "bye"
// GPU memory is allocated on the GPU the endpoint serves (Config::gpu_index). On a side channel
// the commands come from the network: numbers that do not parse are an error reply, and what a
// command may make us allocate or wait for is bounded (TargetLimits).
class Target {
 public:
    Target(Config config, const std::string& interface, bool bidir, const TargetLimits& limits)
        : config_(std::move(config)),
          bidir_(bidir),
          limits_(limits),
          raw_(interface, limits.raw_wait_ms) {}
    ~Target() { close(); }

    Status serve(Channel* ch) {
        // The raw baseline's own memory, not the engine's regions: the engine may still hold
        // a served read's last send completion (the initiator has its bytes already), and its
        // threads must never share bytes with the baseline's.
        // It is host memory, counted with the registered host regions against side_bytes.
        const RawTcpResponder::BufferFn raw_buffer = [this](uint64_t bytes) -> StatusOr<uint8_t*> {
            if (raw_mem_.size() >= bytes) return raw_mem_.data();
            const uint64_t held = registered(MemType::kHost);
            if (bytes > limits_.side_bytes - std::min(held, limits_.side_bytes)) {
                return invalid_argument(
                    strformat("raw TCP baseline: %s beside %s of registered host memory is more "
                              "than %s per side",
                              format_bytes(bytes).c_str(), format_bytes(held).c_str(),
                              format_bytes(limits_.side_bytes).c_str()));
            }
            std::vector<uint8_t>().swap(raw_mem_);  // the old one goes before the new one comes
            raw_mem_.resize(bytes);
            return raw_mem_.data();
        };
        // Without progress threads (--progress-thread off) the endpoints move only while
        // something calls in: between commands, poll get_notifications() on each of them
        // without pause, as a NIXL target agent without a progress thread polls getNotifs.
        IdleWork idle;
        idle.every_ms = [this] {
            return config_.progress_thread == "off" && !eps_.empty() ? 0 : -1;
        };
        idle.run = [this] {
            for (const auto& ep : eps_) (void)ep->get_notifications();
        };
        return serve_commands(
            ch,
            [&](const std::vector<std::string>& w, const std::string& line, std::string* reply) {
                return dispatch(w, line, raw_buffer, reply);
            },
            [this] { close(); }, &idle);
    }

 private:
    // w[i] as a number of at most `max`: decimal digits and nothing else (std::stoull would
    // take "-1" and "1x").
    static Status number(const std::vector<std::string>& w, size_t i, uint64_t max, uint64_t* out) {
        if (parse_uint(w[i], max, out)) return Status();
        return invalid_argument(strformat("%s: '%s' is not a number in 0..%llu", w[0].c_str(),
                                          w[i].substr(0, 40).c_str(),
                                          static_cast<unsigned long long>(max)));
    }
    static Status number(const std::vector<std::string>& w, size_t i, int* out) {
        uint64_t v = 0;
        TCPX_RETURN_IF_ERROR(number(w, i, INT_MAX, &v));
        *out = static_cast<int>(v);
        return Status();
    }

    Status dispatch(const std::vector<std::string>& w, const std::string& line,
                    const RawTcpResponder::BufferFn& raw_buffer, std::string* reply) {
        MemType type = MemType::kHost;
        const bool rev = w.back() == "rev";
        const size_t nw = w.size() - (rev ? 1 : 0);
        uint64_t a = 0;
        uint64_t b = 0;
        uint64_t c = 0;
        int n = 0;
        if (w[0] == "endpoints" && (w.size() == 2 || (w.size() == 3 && w[2] == "pergpu"))) {
            TCPX_RETURN_IF_ERROR(number(w, 1, &n));
            return endpoints(n, w.size() == 3, reply);
        } else if (w[0] == "accept" && w.size() == 2) {
            TCPX_RETURN_IF_ERROR(number(w, 1, INT64_MAX, &a));
            return accept(static_cast<int64_t>(a));
        } else if (w[0] == "mem" && w.size() == 3 && parse_mem(w[1], &type)) {
            TCPX_RETURN_IF_ERROR(number(w, 2, UINT64_MAX, &a));
            return mem(type, a, reply);
        } else if (w[0] == "rmem" && w.size() >= 2 && parse_mem(w[1], &type)) {
            return rmem(type, w);
        } else if (w[0] == "xfer" && w.size() == 8 && (w[1] == "write" || w[1] == "read") &&
                   parse_mem(w[2], &type)) {
            return xfer(w, type, reply);
        } else if (w[0] == "prep" && nw == 7 && (w[1] == "write" || w[1] == "read") &&
                   parse_mem(w[2], &type)) {
            TCPX_RETURN_IF_ERROR(number(w, 3, UINT64_MAX, &a));
            TCPX_RETURN_IF_ERROR(number(w, 4, UINT64_MAX, &b));
            TCPX_RETURN_IF_ERROR(number(w, 5, UINT64_MAX, &c));
            TCPX_RETURN_IF_ERROR(number(w, 6, &n));
            return prep(w[1] == "write", type, a, b, c, n, rev);
        } else if (w[0] == "check" && nw == 6 && parse_mem(w[1], &type)) {
            TCPX_RETURN_IF_ERROR(number(w, 2, UINT64_MAX, &a));
            TCPX_RETURN_IF_ERROR(number(w, 3, UINT64_MAX, &b));
            TCPX_RETURN_IF_ERROR(number(w, 4, UINT64_MAX, &c));
            TCPX_RETURN_IF_ERROR(number(w, 5, &n));
            return check(type, a, b, c, n, rev);
        } else if (w[0] == "stats" && w.size() == 1) {
            *reply = stats_line(sum_stats(eps_));
            return Status();
        } else if (w[0] == "channels" && w.size() == 1) {
            *reply = strformat("channels %lld", static_cast<long long>(config_.channels));
            return Status();
        } else if (w[0] == "cpu" && w.size() == 1) {
            *reply = strformat("cpu %.9f", process_cpu_seconds());
            return Status();
        } else if (w[0] == "kvshape" && w.size() == 8) {
            return kv_shape(w);
        } else if ((w[0] == "kvfill" || w[0] == "kvcheck") && w.size() == 4 &&
                   parse_mem(w[1], &type)) {
            TCPX_RETURN_IF_ERROR(number(w, 2, UINT64_MAX, &a));
            TCPX_RETURN_IF_ERROR(number(w, 3, &n));
            return kv_pieces(w[0] == "kvfill", type, a, n);
        }
        Status st;
        if (!raw_.handle(w, raw_buffer, &st, reply)) {
            return invalid_argument("unknown command: " + line.substr(0, 200));
        }
        return st;
    }

    Status endpoints(int n, bool per_gpu, std::string* reply) {
        if (!eps_.empty()) return failed_precondition("endpoints exist already");
        if (n < 1 || n > limits_.endpoints) {
            return invalid_argument(strformat("endpoints: n not in 1..%d", limits_.endpoints));
        }
        // All or none: made aside and kept only once every one is (one that failed part way left
        // endpoints without their regions, and the next mem or rmem indexed past them).
        std::vector<std::unique_ptr<Endpoint>> eps;
        std::vector<int> gpus;
        std::string md = "md";
        for (int i = 0; i < n; ++i) {
            Config c = config_;
            if (per_gpu) c.gpu_index = i;
            TCPX_ASSIGN_OR_RETURN(auto ep,
                                  Endpoint::create(c, "bench-target-" + std::to_string(i)));
            md += " " + hex_blob(ep->metadata());
            eps.push_back(std::move(ep));
            gpus.push_back(static_cast<int>(c.gpu_index));
        }
        regions_.resize(static_cast<size_t>(n));
        rev_.resize(static_cast<size_t>(n));
        remote_.resize(static_cast<size_t>(n));
        eps_ = std::move(eps);
        gpus_ = std::move(gpus);
        *reply = std::move(md);
        return Status();
    }

    // One-sided transfers need no accept(); the benchmark uses it to know that both ends of every
    // connection are established before it measures (see setup()), and --bidir to know the peer
    // its own transfers go to.
    Status accept(int64_t timeout_ms) {
        if (timeout_ms < 0 || timeout_ms > limits_.accept_ms) {
            return invalid_argument(
                strformat("accept: ms not in 0..%lld", static_cast<long long>(limits_.accept_ms)));
        }
        peers_.clear();
        for (size_t i = 0; i < eps_.size(); ++i) {
            auto peer = eps_[i]->accept(std::chrono::milliseconds(timeout_ms));
            if (!peer.ok()) {
                return Status(peer.status())
                    .with_context("target " + std::to_string(i) + ": accept");
            }
            peers_.push_back(*peer);
        }
        return Status();
    }

    // Bytes of `type` registered with the endpoints (both sets with --bidir).
    uint64_t registered(MemType type) const {
        uint64_t sum = 0;
        for (const auto& set : {&regions_, &rev_}) {
            for (const auto& r : *set) sum += r[type].buf.size();
        }
        return sum;
    }

    Status mem(MemType type, uint64_t bytes, std::string* reply) {
        if (eps_.empty()) return failed_precondition("mem before endpoints");
        // The raw baseline's buffer counts with host memory: it is made again, within what the
        // regions leave, by the next raw command.
        if (type == MemType::kHost) std::vector<uint8_t>().swap(raw_mem_);
        if (bytes > limits_.side_bytes / eps_.size() / (bidir_ ? 2 : 1)) {
            return invalid_argument("mem: more than " + format_bytes(limits_.side_bytes) +
                                    " per side");
        }
        *reply = "mem";
        for (size_t i = 0; i < eps_.size(); ++i) {
            const std::string who = "target " + std::to_string(i);
            Region& r = regions_[i][type];
            TCPX_RETURN_IF_ERROR(
                ensure_region(eps_[i].get(), &r, type, gpus_[i], bytes).with_context(who));
            if (bidir_) {
                TCPX_RETURN_IF_ERROR(
                    ensure_region(eps_[i].get(), &rev_[i][type], type, gpus_[i], bytes)
                        .with_context(who));
            }
            TCPX_ASSIGN_OR_RETURN(RemoteMem d, eps_[i]->describe(r.mem));
            *reply += " " + hex_blob(d.serialize());
        }
        return Status();
    }

    Status rmem(MemType type, const std::vector<std::string>& w) {
        if (w.size() != eps_.size() + 2)
            return invalid_argument("rmem: one descriptor per endpoint");
        for (size_t i = 0; i < eps_.size(); ++i) {
            std::string blob;
            if (!unhex_blob(w[i + 2], &blob)) return invalid_argument("rmem: bad hex");
            TCPX_ASSIGN_OR_RETURN(remote_[i][type], RemoteMem::parse(blob));
        }
        return Status();
    }

    Status xfer(const std::vector<std::string>& w, MemType type, std::string* reply) {
        Shape s;
        s.op = w[1] == "write" ? Op::kWrite : Op::kRead;
        uint64_t count = 0;
        int n = 0;
        TCPX_RETURN_IF_ERROR(number(w, 3, UINT64_MAX, &count));
        TCPX_RETURN_IF_ERROR(number(w, 4, UINT64_MAX, &s.size));
        TCPX_RETURN_IF_ERROR(number(w, 5, &s.batch));
        TCPX_RETURN_IF_ERROR(number(w, 6, &s.conc));
        TCPX_RETURN_IF_ERROR(number(w, 7, &n));
        if (s.size == 0 || s.batch < 1 || s.conc < 1 || count == 0) {
            return invalid_argument("xfer: a size, batch, concurrency or count of 0");
        }
        // The initiator's own bounds (--batch, --concurrency), and a size no region here holds
        // more of: the slot arithmetic below cannot overflow.
        if (s.size > limits_.side_bytes || s.batch > 65536 || s.conc > 4096) {
            return invalid_argument("xfer: a size, batch or concurrency past its bound");
        }
        // No more than one timed run of the initiator's asks for (measure_throughput): a run the
        // target would serve for days is not a measurement.
        if (count > kMaxRunCount) {
            return invalid_argument(strformat("xfer: a count past %llu",
                                              static_cast<unsigned long long>(kMaxRunCount)));
        }
        if (!bidir_) return failed_precondition("xfer without --bidir");
        TCPX_RETURN_IF_ERROR(in_range(n));
        if (peers_.size() < static_cast<size_t>(n))
            return failed_precondition("xfer before accept");
        std::vector<Lane> lanes;
        for (size_t i = 0; i < static_cast<size_t>(n); ++i) {
            const Region& r = rev_[i][type];
            if (r.mem == 0 || r.buf.size() < s.slot_bytes() * static_cast<uint64_t>(s.conc + 1)) {
                return failed_precondition("xfer: no region of that size");
            }
            lanes.push_back(Lane{eps_[i].get(), peers_[i], r.mem, remote_[i][type]});
        }
        TCPX_ASSIGN_OR_RETURN(std::vector<double> secs, run_lanes(lanes, s, count));
        *reply = "secs";
        for (double v : secs) *reply += strformat(" %.9f", v);
        return Status();
    }

    Status in_range(int n) const {
        if (n < 1 || static_cast<size_t>(n) > regions_.size()) {
            return invalid_argument("no such region");
        }
        return Status();
    }

    Status prep(bool write, MemType type, uint64_t run, uint64_t off, uint64_t len, int n,
                bool rev) {
        TCPX_RETURN_IF_ERROR(in_range(n));
        for (int i = 0; i < n; ++i) {
            const auto k = static_cast<size_t>(i);
            TCPX_RETURN_IF_ERROR(prepare_bytes((rev ? rev_ : regions_)[k][type].buf, off, len,
                                               !write, pattern_seed(run, i)));
        }
        return Status();
    }

    Status check(MemType type, uint64_t run, uint64_t off, uint64_t len, int n, bool rev) {
        TCPX_RETURN_IF_ERROR(in_range(n));
        for (int i = 0; i < n; ++i) {
            const auto k = static_cast<size_t>(i);
            TCPX_RETURN_IF_ERROR(check_bytes((rev ? rev_ : regions_)[k][type].buf, off, len,
                                             pattern_seed(run, i), "target " + std::to_string(i)));
        }
        return Status();
    }

    Status kv_shape(const std::vector<std::string>& w) { return parse_kv_shape_words(w, 1, &kv_); }

    Status kv_pieces(bool fill, MemType type, uint64_t run, int request) {
        TCPX_RETURN_IF_ERROR(in_range(1));
        const Buffer& b = regions_[0][type].buf;
        if (b.size() < kv_.pool) return failed_precondition("no KV pool of that memory");
        const std::vector<uint64_t> offsets = kv_offsets(kv_, kv_seed(request, KvSide::kTarget));
        return fill ? kv_fill(b, kv_, offsets, run) : kv_check(b, kv_, offsets, run, "target");
    }

    void close() {
        raw_.close();
        eps_.clear();  // before the memory they may still touch
        regions_.clear();
        rev_.clear();
    }

    Config config_;
    bool bidir_;
    TargetLimits limits_;
    KvShape kv_;
    std::vector<ByMem<Region>> regions_;    // declared before eps_: outlive them
    std::vector<ByMem<Region>> rev_;        // --bidir: the regions of the targets' own transfers
    std::vector<ByMem<RemoteMem>> remote_;  // --bidir: the initiator's, for those
    std::vector<std::unique_ptr<Endpoint>> eps_;
    std::vector<uint8_t> raw_mem_;  // the raw TCP baseline's buffer
    std::vector<int> gpus_;         // per endpoint
    std::vector<PeerId> peers_;     // per endpoint: the initiator's endpoint (accept())
    RawTcpResponder raw_;
};

}  // namespace

Status serve_targets(const Config& config, const std::string& interface, bool bidir, Channel* ch,
                     const TargetLimits& limits) {
    Target target(config, interface, bidir, limits);
    return target.serve(ch);
}

}  // namespace tcpx::bench::engine_bench
