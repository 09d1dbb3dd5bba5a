// tcpx-nixl-bench, run as a user runs it, with the TCPX backend only (the NIXL of a test machine
// may have no other): the KV workload (--kv) verified byte for byte, its options refused with a
// clear message and exit code, and the CPU time per GB of both processes in every row.
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "tests/cli/cli_run.h"

namespace tcpx {
namespace {

using testing::CliResult;
using testing::contains;
using testing::exited_with;
using testing::has_all;
using testing::json_of;
using testing::lines_of;
using testing::positive_under;

CliResult run_bench(std::vector<std::string> args) {
    // Short measurements: these tests check behaviour, not speed.
    for (const char* a :
         {"--backends", "TCPX", "--time", "0.02", "--iters", "2", "--no-progress"}) {
        args.push_back(a);
    }
    return testing::run_program(TCPX_NIXL_BENCH_PATH, std::move(args),
                                {{"LD_LIBRARY_PATH", TCPX_NIXL_LIB_DIR}});
}

// --kv at a small scale (a 64 MiB pool, 16 blocks per request = 1024 pieces, one NIXL request of
// 1024 descriptors each), WRITE and READ verified; then as JSON with a smaller shape.
TEST(NixlBenchCli, KvWorkloadIsVerifiedAndComparedWithOneContiguousRequest) {
    const CliResult r = run_bench({"--kv", "--kv-pool", "64M", "--kv-blocks", "16", "--verify"});
    ASSERT_TRUE(exited_with(r, 0));
    EXPECT_TRUE(has_all(r.output, {"a paged KV cache (--kv)", "1024 pieces, 32 MiB",
                                   "one NIXL request per KV request", "KV GB/s", "contiguous GB/s",
                                   "TCPX    WRITE  DRAM", "TCPX    READ   DRAM", "verified: "}))
        << r.output;
    EXPECT_TRUE(positive_under(r.output, "backend op",
                               {"KV GB/s", "KV ms/req", "contiguous GB/s", "contiguous ms",
                                "KV/contiguous", "KV CPU s/GB", "cont CPU s/GB"}));
    int verified_rows = 0;
    for (const std::string& line : lines_of(r.output)) {
        if (line.rfind("TCPX    ", 0) == 0 && line.size() > 5 &&
            line.compare(line.size() - 5, 5, "  yes") == 0) {
            ++verified_rows;
        }
    }
    EXPECT_EQ(verified_rows, 2) << r.output;

    const CliResult j = run_bench({"--kv", "--kv-pool", "64M", "--kv-blocks", "16", "--kv-shape",
                                   "4,16,8,128,2", "--ops", "read", "--verify", "--json"});
    ASSERT_TRUE(exited_with(j, 0));
    const nlohmann::json doc = json_of(j.output);
    ASSERT_TRUE(doc.is_object()) << j.output;
    EXPECT_EQ(doc.value("benchmark", ""), "nixl-kv") << j.output;
    EXPECT_EQ(doc["kv"].value("pieces", 0), 128) << j.output;
    ASSERT_EQ(doc["results"].size(), 1u) << j.output;
    const nlohmann::json& row = doc["results"][0];
    EXPECT_EQ(row.value("backend", ""), "TCPX");
    EXPECT_EQ(row.value("op", ""), "READ");
    EXPECT_TRUE(row.value("verified", false)) << j.output;
    EXPECT_GT(row.value("kv_contiguous_ratio", 0.0), 0) << j.output;
    for (const char* kind : {"kv", "contiguous"}) {
        SCOPED_TRACE(kind);
        const nlohmann::json& t = row[kind];
        EXPECT_GT(t.value("gbps", 0.0), 0) << j.output;
        EXPECT_GT(t.value("cpu_s_per_gb", 0.0), 0) << j.output;
        // The target is the other process: its CPU time is reported back and counted.
        EXPECT_GT(t.value("cpu_seconds_target_process", 0.0), 0) << j.output;
        EXPECT_LT(t.value("cpu_seconds_target_process", 0.0), t.value("cpu_seconds", 0.0))
            << j.output;
    }
}

// Bad KV options are refused with the reason, never run: the same messages and exit codes as
// `tcpx-p2p bench engine --kv` (2: not well formed; 1: no KV workload).
TEST(NixlBenchCli, BadKvOptionsAreRefused) {
    struct Case {
        std::vector<std::string> args;
        int code;
        const char* says;
    };
    const Case cases[] = {
        {{"--kv-shape", "32,16"}, 2, "is not layers,tokens,heads,dim,dtype"},
        {{"--kv-shape", "32,16,8,128,2,1"}, 2, "is not layers,tokens,heads,dim,dtype"},
        {{"--kv-shape", "a,b,c,d,e"}, 2, "is not layers,tokens,heads,dim,dtype"},
        {{"--kv-pool", "lots"}, 2, "--kv-pool 'lots' is not a size"},
        {{"--kv-pool", "16M", "--kv-blocks", "64"}, 1, "a request takes 64"},
        {{"--kv-shape", "0,16,8,128,2"}, 1, "positive numbers"},
        {{"--kv-shape", "32,16,8,128,16"}, 1, "larger than any model"},
        {{"--batch", "4"}, 1, "--kv: a request is its own batch"},
    };
    for (const Case& c : cases) {
        std::vector<std::string> args = {"--kv"};
        args.insert(args.end(), c.args.begin(), c.args.end());
        SCOPED_TRACE(c.says);
        const CliResult r = run_bench(args);
        EXPECT_TRUE(exited_with(r, c.code));
        EXPECT_TRUE(has_all(r.output, {"tcpx-nixl-bench: ", c.says}));
        EXPECT_FALSE(contains(r.output, "KV GB/s")) << r.output;
    }
}

// The size sweep: every row's CPU seconds per GB, of both processes.
TEST(NixlBenchCli, SweepReportsCpuSecondsPerGb) {
    const CliResult r = run_bench({"--sizes", "256K", "--no-latency"});
    ASSERT_TRUE(exited_with(r, 0));
    EXPECT_TRUE(contains(r.output, "CPU s/GB: CPU seconds")) << r.output;
    EXPECT_TRUE(positive_under(r.output, "backend op", {"GB/s", "CPU s/GB"}));
    const CliResult j = run_bench({"--sizes", "256K", "--no-latency", "--ops", "write", "--json"});
    ASSERT_TRUE(exited_with(j, 0));
    const nlohmann::json doc = json_of(j.output);
    ASSERT_TRUE(doc.is_object()) << j.output;
    ASSERT_EQ(doc["results"].size(), 1u) << j.output;
    EXPECT_GT(doc["results"][0].value("cpu_s_per_gb", 0.0), 0) << j.output;
    EXPECT_GT(doc["results"][0].value("cpu_seconds_target_process", 0.0), 0) << j.output;
}

// Agents without NIXL's progress thread (the engine's socket I/O then runs inside the agents'
// calls): every case verified byte for byte, the header and JSON say which mode ran.
TEST(NixlBenchCli, WithoutProgressThreadsEveryCaseIsVerified) {
    const CliResult r =
        run_bench({"--progress-thread", "off", "--sizes", "4K,1M", "--batch", "3", "--verify"});
    ASSERT_TRUE(exited_with(r, 0)) << r.output;
    EXPECT_TRUE(has_all(r.output, {"NIXL progress threads: off", "verified"})) << r.output;
    EXPECT_TRUE(positive_under(r.output, "backend op", {"GB/s"}));
    const CliResult j = run_bench(
        {"--progress-thread", "off", "--sizes", "64K", "--no-latency", "--ops", "read", "--json"});
    ASSERT_TRUE(exited_with(j, 0)) << j.output;
    const nlohmann::json doc = json_of(j.output);
    ASSERT_TRUE(doc.is_object()) << j.output;
    EXPECT_EQ(doc["config"].value("progress_thread", true), false) << j.output;
    const CliResult bad = run_bench({"--progress-thread", "sometimes"});
    EXPECT_FALSE(exited_with(bad, 0)) << bad.output;
    EXPECT_TRUE(contains(bad.output, "--progress-thread: sometimes not in {on,off}")) << bad.output;
}

}  // namespace
}  // namespace tcpx
