// tcpx-nixl-bench, run as a user runs it, with the TCPX backend only (the NIXL of a test machine
// may have no other): the KV workload (--kv) verified byte for byte, its options refused with a
// clear message and exit code, the CPU time per GB of both processes in every row, and the two
// roles over loopback (--listen on 127.0.0.1, --connect from a second process): the same rows as
// the forked run, strays and hostile commands refused, bad addresses and roles refused.
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/wait.h>

#include <chrono>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "common/socket.h"
#include "tests/cli/cli_run.h"
#include "tests/cli/roles_run.h"

namespace tcpx {
namespace {

using testing::CliResult;
using testing::ClosedPort;
using testing::contains;
using testing::exited_with;
using testing::has_all;
using testing::json_of;
using testing::lines_of;
using testing::ListeningTarget;
using testing::positive_under;
using testing::side_channel_exchange;

const std::map<std::string, std::string> kEnv = {{"LD_LIBRARY_PATH", TCPX_NIXL_LIB_DIR}};

// Without the short-measurement options: a --listen target refuses them.
CliResult run_plain(std::vector<std::string> args) {
    return testing::run_program(TCPX_NIXL_BENCH_PATH, std::move(args), kEnv);
}

CliResult run_bench(std::vector<std::string> args) {
    // Short measurements: these tests check behaviour, not speed.
    for (const char* a :
         {"--backends", "TCPX", "--time", "0.02", "--iters", "2", "--no-progress"}) {
        args.push_back(a);
    }
    return run_plain(std::move(args));
}

// A target listening on 127.0.0.1, an ephemeral port.
bool start_target(ListeningTarget* target) {
    return target->start_program({TCPX_NIXL_BENCH_PATH, "--listen", "127.0.0.1:0"}, kEnv);
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

// The two roles in two processes over loopback: the same rows as the forked run of the same
// options, every figure measured, every case verified; the header and JSON name the target.
TEST(NixlBenchRoles, ListenAndConnectGiveTheRowsOfTheForkedRun) {
    const std::vector<std::string> args = {"--sizes", "64K", "--verify", "--json"};
    const CliResult forked = run_bench(args);
    ASSERT_TRUE(exited_with(forked, 0));
    const nlohmann::json want = json_of(forked.output);
    ASSERT_TRUE(want.is_object()) << forked.output;

    ListeningTarget target;
    ASSERT_TRUE(start_target(&target));
    EXPECT_TRUE(contains(target.output(), "plaintext, unauthenticated")) << target.output();
    std::vector<std::string> connect = {"--connect", target.address()};
    connect.insert(connect.end(), args.begin(), args.end());
    const CliResult r = run_bench(connect);
    ASSERT_TRUE(exited_with(r, 0));
    const nlohmann::json doc = json_of(r.output);
    ASSERT_TRUE(doc.is_object()) << r.output;
    EXPECT_EQ(doc.value("benchmark", ""), "nixl");
    EXPECT_EQ(doc["config"].value("connect", ""), target.address());
    EXPECT_TRUE(contains(doc["config"].value("target", ""), "=lo")) << r.output;
    EXPECT_FALSE(want["config"].contains("connect")) << forked.output;
    // The TCPX backend's interface: the side channel's (loopback), as in the forked run.
    EXPECT_EQ(doc["backends"][0]["params"].value("interface", ""), "=lo") << r.output;

    auto cases = [](const nlohmann::json& d) {
        std::vector<std::tuple<std::string, std::string, std::string, uint64_t, int, int>> out;
        for (const auto& row : d["results"]) {
            out.emplace_back(row.value("backend", ""), row.value("op", ""), row.value("mem", ""),
                             row.value("size", uint64_t{0}), row.value("batch", 0),
                             row.value("depth", 0));
        }
        return out;
    };
    EXPECT_EQ(cases(doc), cases(want)) << r.output;
    ASSERT_EQ(doc["results"].size(), 2u) << r.output;  // WRITE and READ
    for (const auto& row : doc["results"]) {
        SCOPED_TRACE(row.dump());
        EXPECT_FALSE(row.contains("error"));
        EXPECT_TRUE(row.value("verified", false));
        EXPECT_GT(row.value("gbps", 0.0), 0);
        EXPECT_GT(row.value("requests", 0), 0);
        EXPECT_GT(row.value("cpu_s_per_gb", 0.0), 0);
        // The target is the other process: its CPU time is reported back and counted.
        EXPECT_GT(row.value("cpu_seconds_target_process", 0.0), 0);
        EXPECT_GT(row["latency"].value("p50_us", 0.0), 0);
        EXPECT_GT(row["latency"].value("p99_us", 0.0), 0);
    }
    const int status = target.finish();
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << target.output();
    EXPECT_TRUE(has_all(target.output(), {"serving 127.0.0.1:", "the initiator is done"}));
}

// The table over the side channel: the forked run's header and columns, the target named.
TEST(NixlBenchRoles, TheTableNamesTheTarget) {
    ListeningTarget target;
    ASSERT_TRUE(start_target(&target));
    const CliResult r = run_bench({"--connect", target.address(), "--sizes", "4K,1M", "--batch",
                                   "2", "--progress-thread", "off", "--verify"});
    ASSERT_TRUE(exited_with(r, 0));
    EXPECT_TRUE(contains(r.output, "target on " + target.address() + " (side channel)"))
        << r.output;
    EXPECT_TRUE(contains(r.output, "target: " + target.address() + ": =lo")) << r.output;
    EXPECT_TRUE(has_all(r.output, {"NIXL progress threads: off", "TCPX    WRITE DRAM",
                                   "TCPX    READ  DRAM", "verified: "}));
    EXPECT_TRUE(positive_under(r.output, "backend op", {"GB/s", "CPU s/GB"}));
    EXPECT_EQ(target.finish(), 0) << target.output();
}

// A stray client (a wrong greeting, or the right one with a setting it does not know) is refused
// and the target goes on listening for the real initiator.
TEST(NixlBenchRoles, StraysAreRefusedAndTheTargetStillServes) {
    ListeningTarget target;
    ASSERT_TRUE(start_target(&target));
    std::string got = side_channel_exchange(target, "GET / HTTP/1.0\n");
    EXPECT_TRUE(has_all(got, {"error ", "not a tcpx-nixl-bench initiator of this version"}));
    got = side_channel_exchange(target, "hello tcpx-nixl-bench 1 mem=disk\n");
    EXPECT_TRUE(has_all(got, {"error ", "hello: unknown 'mem=disk'"}));
    got = side_channel_exchange(target, "hello tcpx-nixl-bench 1 param=zz\n");
    EXPECT_TRUE(has_all(got, {"error ", "hello: bad param"}));
    // A setting that names a library or program for the target's backend to load is the
    // target's own: the greeting that carries one is refused (it ran a program of its choosing
    // there, as the plugin probe).
    const auto hex = [](const std::string& text) {
        std::string out;
        for (unsigned char c : text) {
            out += "0123456789abcdef"[c >> 4];
            out += "0123456789abcdef"[c & 15];
        }
        return out;
    };
    for (const std::string setting :
         {"TCPX:net_plugin=/tmp/x.so", "TCPX:plugin_probe_path=/bin/true", "TCPX:auth_secret=x"}) {
        got = side_channel_exchange(target, "hello tcpx-nixl-bench 1 param=" + hex(setting) + "\n");
        EXPECT_TRUE(has_all(got, {"error ", "is the target's own"})) << setting << ": " << got;
    }
    const CliResult r =
        run_bench({"--connect", target.address(), "--sizes", "4K", "--ops", "write"});
    ASSERT_TRUE(exited_with(r, 0));
    EXPECT_EQ(target.finish(), 0) << target.output();
    EXPECT_TRUE(contains(target.output(), "refused")) << target.output();
}

// A client that greets correctly and then sends what no initiator would: every command gets an
// error reply (malformed numbers, a region past the side channel's bound, commands out of
// order), never a crash, and the target ends cleanly on quit.
TEST(NixlBenchRoles, HostileCommandsGetErrorReplies) {
    ListeningTarget target;
    ASSERT_TRUE(start_target(&target));
    const std::string got = side_channel_exchange(target,
                                                  "hello tcpx-nixl-bench 1 mem=dram time=0.1\n"
                                                  "alloc lots\n"
                                                  "alloc 4096junk\n"
                                                  "alloc -1\n"
                                                  "alloc 999999999999999\n"
                                                  "alloc 0\n"
                                                  "begin TCPX\n"
                                                  "prepare 1 4096 2 fill\n"
                                                  "alloc 4096\n"
                                                  "prepare 1 18446744073709551615 2 fill\n"
                                                  "check 1 4096 1 1 data\n"
                                                  "kvcheck 1 0 1\n"
                                                  "nonsense\n"
                                                  "quit\n");
    EXPECT_TRUE(
        has_all(got, {"hello tcpx-nixl-bench 1 =lo, UCX_TLS=", "malformed command",
                      "alloc: more than 64 GiB per side", "alloc: 0 bytes", "begin before alloc",
                      "prepare before alloc", "slots beyond the registered region",
                      "check outside begin/end", "no KV pool", "unknown command", "bye"}))
        << got;
    // Numbers are whole words: "4096junk" is not 4096, "-1" not 2^64 - 1 (std::stoull took both).
    size_t malformed = 0;
    for (size_t at = 0; (at = got.find("malformed command", at)) != std::string::npos; ++at) {
        ++malformed;
    }
    EXPECT_EQ(malformed, 3u) << got;
    EXPECT_EQ(target.finish(), 0) << target.output();
}

TEST(NixlBenchRoles, NothingListeningIsAClearErrorInBoundedTime) {
    const auto start = std::chrono::steady_clock::now();
    const ClosedPort closed;
    const CliResult r = run_bench(
        {"--connect", "127.0.0.1:" + closed.port(), "--connect-timeout", "1", "--sizes", "4K"});
    EXPECT_TRUE(exited_with(r, 1));
    EXPECT_TRUE(has_all(r.output, {"no benchmark target answers at 127.0.0.1:", "refused"}));
    EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(20));
}

TEST(NixlBenchRoles, BadAddressesAndRolesAreRefused) {
    for (const char* where : {"127.0.0.1", "127.0.0.1:", ":7000", "127.0.0.1:99999", "127.0.0.1:0",
                              "::1:7000", "[::1]7000", "127.0.0.1:7x"}) {
        SCOPED_TRACE(std::string("--connect '") + where + "'");
        const CliResult r = run_bench({"--connect", where, "--sizes", "4K"});
        EXPECT_TRUE(exited_with(r, 1));
        EXPECT_TRUE(contains(r.output, "--connect: ")) << r.output;
        EXPECT_TRUE(contains(r.output, "HOST:PORT") || contains(r.output, "[IPV6]:PORT"))
            << r.output;
    }
    for (const char* where : {"127.0.0.1:port", "127.0.0.1", "127.0.0.1:70000"}) {
        SCOPED_TRACE(std::string("--listen '") + where + "'");
        const CliResult r = run_plain({"--listen", where});
        EXPECT_TRUE(exited_with(r, 1));
        EXPECT_TRUE(has_all(r.output, {"--listen: ", "HOST:PORT"}));
        EXPECT_FALSE(contains(r.output, "listening on")) << r.output;
    }
    struct Case {
        std::vector<std::string> args;
        const char* says;
    };
    const ClosedPort closed;
    const std::string p = "127.0.0.1:" + closed.port();
    const std::vector<Case> cases = {
        {{"--listen", p, "--connect", p}, "one host has one role"},
        {{"--listen", p, "--sizes", "4K"}, "--listen: --sizes is the initiator's to choose"},
        {{"--listen", p, "--backends", "TCPX"}, "--listen: --backends is the initiator's"},
        {{"--listen", p, "--kv"}, "--listen: --kv is the initiator's to choose"},
        {{"--listen", p, "--json"}, "--listen: --json is the initiator's to choose"},
    };
    for (const Case& c : cases) {
        SCOPED_TRACE(c.says);
        const CliResult r = run_plain(c.args);
        EXPECT_TRUE(exited_with(r, 2));
        EXPECT_TRUE(contains(r.output, c.says)) << r.output;
    }
}

}  // namespace
}  // namespace tcpx
