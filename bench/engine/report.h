// The report of `tcpx-p2p bench engine`: its rows, the header lines that say what ran, the table,
// the JSON, the KV workload's rows and the endpoints' counters.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "bench/engine/common.h"
#include "bench/harness/measure.h"
#include "bench/kv_workload.h"

namespace tcpx::bench::engine_bench {

// One size and operation of the sweep: its figures, and what they are compared with.
struct Row {
    Op op = Op::kWrite;
    uint64_t size = 0;
    int concurrency = 0;  // per peer, after the memory cap
    Throughput ours;      // between memory of --mem
    Throughput host;      // --mem vram: the same between host memory
    Throughput single;    // one peer, when peers > 1
    Throughput raw;
    Latency ours_lat;
    Latency host_lat;
    Latency raw_lat;
    // Of `ours`: the initiator's direction and, with --bidir, the targets' (GB/s; ours is their
    // sum); per peer (or pair), in each direction.
    double fwd = 0;
    double rev = 0;
    std::vector<double> per_peer;
    std::vector<double> per_peer_rev;
};

// What ran, for the header lines.
struct Setup {
    int raw_streams = 0;
    int io_threads = 0;  // per endpoint; 0: none, the progress thread does the I/O (caller)
    std::string target;  // with --connect: what the target said of its engine
};

// The GB/s of each direction and peer in a measurement of `iters` transfers of `bytes` per peer,
// from each peer's seconds.
void split_directions(const std::vector<double>& secs, uint64_t bytes, uint64_t iters, double* all,
                      std::vector<double>* per_peer);

// How the header names the endpoints' socket I/O: "N I/O threads per endpoint", or for 0 (caller
// mode) that each endpoint's progress thread does it; and who makes progress without one.
std::string io_threads_phrase(int io_threads, bool progress_thread);

// Whether the rows carry the host figures of --mem vram.
bool host_figures(const EngineBenchOptions& o);

// --stats: both sides' counters, after the table; with --json as one JSON line on stderr, so
// that stdout stays one document.
void print_stats(const EngineBenchOptions& o, const Stats& ours, const Stats& theirs);

// The sweep on stdout: the header lines (what ran, what each column means), then one line per row.
void print_table(const EngineBenchOptions& o, const Config& c, const Setup& s,
                 const std::vector<Row>& rows);

// The sweep as one JSON document on stdout.
void print_json(const EngineBenchOptions& o, const Config& c, const Setup& s,
                const std::vector<Row>& rows);

// The KV workload's rows (--kv), as a table or as one JSON document.
void print_kv_table(const EngineBenchOptions& o, const Config& c, const Setup& s,
                    const std::vector<KvRow>& rows);

void print_kv_json(const EngineBenchOptions& o, const Config& c, const std::vector<KvRow>& rows);

}  // namespace tcpx::bench::engine_bench
