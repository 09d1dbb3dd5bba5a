// The report of tcpx-nixl-bench: its rows, the header lines that say what ran (the machine, the
// environment, every backend's parameters), the table with the TCPX/UCX ratios, the KV
// workload's table, and the JSON of either.
#pragma once

#include <nixl.h>

#include <cstdint>
#include <string>
#include <vector>

#include "bench/harness/measure.h"
#include "bench/kv_workload.h"
#include "bench/nixl/common.h"
#include "bench/nixl/environment.h"

namespace tcpx::bench::nixl_bench {

// One backend, op and size of the sweep.
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

// "64 KiB", or "3x64 KiB" with --batch 3.
std::string size_label(const Options& o, uint64_t size);

// The sweep on stdout: the header lines, then the rows grouped by case.
void print_table(const Options& o, const Machine& m, const std::vector<BackendInfo>& backends,
                 const std::vector<Row>& rows);

// --kv: the rows' layout is bench/kv_workload's, as in `tcpx-p2p bench engine --kv`.
void print_kv_table(const Options& o, const Machine& m, const std::vector<BackendInfo>& backends,
                    const std::vector<KvRow>& rows);

// Either as one JSON document on stdout.
void print_json(const Options& o, const Machine& m, const std::vector<BackendInfo>& backends,
                const std::vector<Row>& rows, const std::vector<KvRow>& kv_rows);

}  // namespace tcpx::bench::nixl_bench
