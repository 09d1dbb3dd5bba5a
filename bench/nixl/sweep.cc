// The sweep of tcpx-nixl-bench: every backend in turn, every case of it (or the KV workload's),
// each measured through the harness's Sweep, and the report when all are done.
#include "bench/nixl/sweep.h"

#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "bench/harness/report.h"
#include "bench/nixl/agent.h"
#include "bench/nixl/initiator.h"
#include "bench/nixl/report.h"
#include "common/status_util.h"
#include "common/strings.h"

namespace tcpx::bench::nixl_bench {
namespace {

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

}  // namespace

int run_initiator(const Options& o, std::unique_ptr<Peer> peer, const Machine& machine) {
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
            return 1;  // ~Peer: "quit"
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

}  // namespace tcpx::bench::nixl_bench
