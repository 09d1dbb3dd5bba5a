#include "bench/engine/sweep.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "bench/engine/common.h"
#include "bench/engine/initiator.h"
#include "bench/harness/measure.h"
#include "bench/harness/report.h"
#include "bench/kv_workload.h"
#include "common/status_util.h"
#include "common/strings.h"

namespace tcpx::bench::engine_bench {
namespace {

std::vector<Op> ops_of(const EngineBenchOptions& o) {
    std::vector<Op> ops;
    if (o.write) ops.push_back(Op::kWrite);
    if (o.read) ops.push_back(Op::kRead);
    return ops;
}

Calibration calibration_of(const EngineBenchOptions& o) {
    Calibration cal;
    cal.min_seconds = o.min_seconds;
    cal.min_iters = static_cast<uint64_t>(o.min_iters);
    return cal;
}

// --kv: every memory and op, the KV requests and the contiguous transfer of the same bytes.
StatusOr<std::vector<KvRow>> sweep_kv(const EngineBenchOptions& o, EngineInitiator* init) {
    TCPX_RETURN_IF_ERROR(init->prepare_kv().with_context("--kv: the pools"));
    const std::vector<Op> ops = ops_of(o);
    std::vector<MemType> mems = {o.mem};
    if (host_figures(o)) mems.push_back(MemType::kHost);
    Progress progress(o.progress && !o.json, mems.size() * ops.size() * 2);
    Sweep sweep(calibration_of(o), &progress, [init] { return init->cpu_seconds(); });
    const uint64_t bytes = o.kv_shape.request_bytes();
    std::vector<KvRow> rows;
    for (MemType mem : mems) {
        for (Op op : ops) {
            KvRow row;
            row.op = op_name(op);
            row.mem = mem_name(mem);
            for (bool contiguous : {false, true}) {
                const std::string what = strformat("%s, %s memory, %s", op_name(op), mem_name(mem),
                                                   contiguous ? "contiguous" : "KV requests");
                Throughput& out = contiguous ? row.contiguous : row.kv;
                TCPX_ASSIGN_OR_RETURN(out, sweep.throughput(what, bytes, [&](uint64_t n) {
                    return init->kv_transfers(op, mem, contiguous, n);
                }));
                TCPX_RETURN_IF_ERROR(init->verify_kv(op, mem, contiguous));
            }
            row.verified = o.verify;
            rows.push_back(row);
        }
    }
    progress.clear();
    return rows;
}

// Every size and op: the engine's throughput (the host figures, one peer, raw TCP beside it)
// and its latency (host, raw ping-pong beside it), as the options ask.
StatusOr<std::vector<Row>> sweep_sizes(const EngineBenchOptions& o, EngineInitiator* init) {
    const std::vector<Op> ops = ops_of(o);
    const bool single = o.peers > 1 && o.single_peer;
    const bool host = host_figures(o);
    const size_t per_op = 1 + (host ? 1 : 0) + (single ? 1 : 0) + (o.baseline ? 1 : 0) +
                          (o.latency ? 1 + (host ? 1 : 0) + (o.baseline ? 1 : 0) : 0);
    Progress progress(o.progress && !o.json, o.sizes.size() * ops.size() * per_op);
    Sweep sweep(calibration_of(o), &progress, [init] { return init->cpu_seconds(); });
    const std::string ours_what = strformat("engine (%s)", mem_name(o.mem));
    std::vector<Row> rows;
    for (uint64_t size : o.sizes) {
        TCPX_RETURN_IF_ERROR(init->prepare(size).with_context(format_bytes(size)));
        // At least one transfer per slot in flight.
        const uint64_t min_iters = std::max<uint64_t>(static_cast<uint64_t>(o.min_iters),
                                                      static_cast<uint64_t>(init->concurrency()));
        const uint64_t bytes = init->slot_bytes();
        // --bidir: the same again in the other direction.
        const uint64_t dirs = o.bidir ? 2 : 1;
        const uint64_t all_bytes = bytes * static_cast<uint64_t>(o.peers) * dirs;
        auto throughput = [&](const std::string& what, uint64_t n_bytes, Throughput* out,
                              const TimedRun& fn) -> Status {
            TCPX_ASSIGN_OR_RETURN(*out, sweep.throughput(what, n_bytes, fn, min_iters));
            return Status();
        };
        auto latency = [&](const std::string& what, Latency* out, const SampledRun& fn) -> Status {
            TCPX_ASSIGN_OR_RETURN(*out, sweep.latency(what, fn));
            return Status();
        };
        for (Op op : ops) {
            Row row;
            row.op = op;
            row.size = size;
            row.concurrency = init->concurrency();
            const std::string what = std::string(op_name(op)) + " " + format_bytes(size);
            TCPX_RETURN_IF_ERROR(
                throughput(what + ": " + ours_what + ", throughput", all_bytes, &row.ours,
                           [&](uint64_t n) { return init->transfers(op, o.mem, o.peers, n); }));
            split_directions(init->last().fwd, bytes, row.ours.iters, &row.fwd, &row.per_peer);
            split_directions(init->last().rev, bytes, row.ours.iters, &row.rev, &row.per_peer_rev);
            if (host) {
                TCPX_RETURN_IF_ERROR(throughput(
                    what + ": engine (host), throughput", all_bytes, &row.host,
                    [&](uint64_t n) { return init->transfers(op, MemType::kHost, o.peers, n); }));
            }
            if (single) {
                TCPX_RETURN_IF_ERROR(throughput(
                    what + ": " + ours_what + ", one peer, throughput", bytes * dirs, &row.single,
                    [&](uint64_t n) { return init->transfers(op, o.mem, 1, n); }));
            }
            if (o.baseline) {
                TCPX_RETURN_IF_ERROR(
                    throughput(what + ": raw TCP, throughput", bytes, &row.raw,
                               [&](uint64_t n) { return init->raw_stream(op, n); }));
            }
            if (o.latency) {
                TCPX_RETURN_IF_ERROR(
                    latency(what + ": " + ours_what + ", one at a time", &row.ours_lat,
                            [&](uint64_t n) { return init->single_transfers(op, o.mem, n); }));
                if (host) {
                    TCPX_RETURN_IF_ERROR(latency(
                        what + ": engine (host), one at a time", &row.host_lat,
                        [&](uint64_t n) { return init->single_transfers(op, MemType::kHost, n); }));
                }
                if (o.baseline) {
                    TCPX_RETURN_IF_ERROR(
                        latency(what + ": raw TCP, ping-pong", &row.raw_lat,
                                [&](uint64_t n) { return init->raw_pingpong(op, n); }));
                }
            }
            rows.push_back(row);
        }
    }
    progress.clear();
    return rows;
}

// --stats: both sides' counters. A served read is counted when its last send completes, a
// moment after the reader has its bytes (docs/engine.md): wait (briefly) until each side has
// served what the other completed.
StatusOr<std::pair<Stats, Stats>> settled_stats(EngineInitiator* init) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
    while (true) {
        TCPX_ASSIGN_OR_RETURN(Stats theirs, init->target_stats());
        const Stats ours = init->own_stats();
        const bool settled = theirs.requests_served >= ours.transfers_completed &&
                             ours.requests_served >= theirs.transfers_completed;
        if (settled || std::chrono::steady_clock::now() > deadline) return std::pair(ours, theirs);
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
}

}  // namespace

Status run_initiator(const EngineBenchOptions& o, Config config, Setup setup, Peer* peer) {
    setup.io_threads = io_threads_per_endpoint(config);
    std::vector<Row> rows;
    std::vector<KvRow> kv_rows;
    std::optional<std::pair<Stats, Stats>> counters;  // --stats: ours, the targets'
    {
        EngineInitiator init(o, config, peer);
        TCPX_RETURN_IF_ERROR(init.setup().with_context("setting up"));
        // The header says what ran: the channels both sides use, the raw streams matching them.
        config.channels = init.channels();
        setup.raw_streams = init.raw_streams();
        if (o.kv) {
            TCPX_ASSIGN_OR_RETURN(kv_rows, sweep_kv(o, &init));
        } else {
            TCPX_ASSIGN_OR_RETURN(rows, sweep_sizes(o, &init));
        }
        if (o.stats) {
            TCPX_ASSIGN_OR_RETURN(counters, settled_stats(&init));
        }
    }

    if (o.kv) {
        if (o.json) {
            print_kv_json(o, config, kv_rows);
        } else {
            print_kv_table(o, config, setup, kv_rows);
        }
    } else if (o.json) {
        print_json(o, config, setup, rows);
    } else {
        print_table(o, config, setup, rows);
    }
    if (counters) print_stats(o, counters->first, counters->second);
    return Status();
}

}  // namespace tcpx::bench::engine_bench
