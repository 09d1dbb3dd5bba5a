// The tcpx-p2p command-line tool, run as a user runs it: `bench engine` options that must be
// refused with a clear message and exit code (never a crash), and short runs that must still work.
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <initializer_list>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/machine.h"
#include "cuda/device.h"
#include "tests/cli/cli_run.h"
#include "tests/support/sanitizers.h"
#include "tests/support/sysfs_tree.h"

namespace tcpx {
namespace {

using testing::CliResult;
using testing::contains;
using testing::exited_with;
using testing::has_all;
using testing::json_of;
using testing::kUnderThreadSanitizer;
using testing::positive_under;

using testing::run_cli;

// Short measurements: these tests check behaviour, not speed.
std::vector<std::string> quick(std::vector<std::string> args) {
    for (const char* a : {"--time", "0.02", "--iters", "2", "--no-progress"}) args.push_back(a);
    return args;
}

TEST(BenchEngineCli, VramWithoutGpuIsAClearError) {
    if (cuda::device_count() > 0) GTEST_SKIP() << "a GPU is usable here (VramRunsOnGpu covers it)";
    for (const char* procs : {"1", "2"}) {
        SCOPED_TRACE(std::string("--procs ") + procs);
        const CliResult r =
            run_cli(quick({"bench", "engine", "--mem", "vram", "--sizes", "4K", "--procs", procs}));
        EXPECT_TRUE(exited_with(r, 1));
        EXPECT_TRUE(contains(r.output, "--mem vram: ")) << r.output;
        EXPECT_TRUE(contains(r.output, "no usable GPU") || contains(r.output, "no CUDA support"))
            << r.output;
    }
}

TEST(BenchEngineCli, VramRunsOnGpu) {
    if (cuda::device_count() == 0) GTEST_SKIP() << "no usable GPU";
    const CliResult r = run_cli(quick(
        {"bench", "engine", "--mem", "vram", "--sizes", "64K,2M", "--procs", "2", "--verify"}));
    ASSERT_TRUE(exited_with(r, 0));
    EXPECT_TRUE(has_all(r.output, {"memory: GPU", "vram/host", "verified"}));
}

TEST(BenchEngineCli, BadGpusAreRefused) {
    for (const char* gpus : {"0", "a,b", "-1,0", "0,1,2", "0,", "1024,0", ""}) {
        SCOPED_TRACE(std::string("--gpus '") + gpus + "'");
        const CliResult r =
            run_cli(quick({"bench", "engine", "--mem", "vram", "--gpus", gpus, "--sizes", "4K"}));
        EXPECT_TRUE(exited_with(r, 2));
        EXPECT_TRUE(contains(r.output, "is not two GPU indices")) << r.output;
    }
    // Well-formed, but for GPU memory only.
    const CliResult r = run_cli(quick({"bench", "engine", "--gpus", "0,1", "--sizes", "4K"}));
    EXPECT_TRUE(exited_with(r, 1));
    EXPECT_TRUE(contains(r.output, "--gpus applies to --mem vram only")) << r.output;
}

TEST(BenchEngineCli, BadMemIsRefused) {
    const CliResult r = run_cli(quick({"bench", "engine", "--mem", "gpu", "--sizes", "4K"}));
    ASSERT_NE(r.status, -1) << r.output;
    EXPECT_TRUE(WIFEXITED(r.status) && WEXITSTATUS(r.status) != 0) << r.output;
    EXPECT_TRUE(contains(r.output, "--mem")) << r.output;
}

// Without the raw baseline: in two processes its buffers pass to the engine through the other
// process, which ThreadSanitizer cannot see (its reports in the child then take minutes). The
// one-process tests below measure the baseline. For the same reason --verify is left out under
// ThreadSanitizer: the child prepares a destination, and the peer's writes into it are ordered
// after that only through the other process.
TEST(BenchEngineCli, HostMemoryInTwoProcesses) {
#if defined(__SANITIZE_THREAD__)
    constexpr bool kVerify = false;
#else
    constexpr bool kVerify = true;
#endif
    std::vector<std::string> args = {"bench",   "engine",  "--mem", "host",         "--sizes",
                                     "4K,256K", "--procs", "2",     "--no-baseline"};
    if (kVerify) args.push_back("--verify");
    const CliResult r = run_cli(quick(args));
    ASSERT_TRUE(exited_with(r, 0)) << r.output;
    EXPECT_TRUE(has_all(r.output, {"memory: host", "WRITE", "READ"}));
    if (kVerify) {
        EXPECT_TRUE(contains(r.output, "verified")) << r.output;
    }
    EXPECT_FALSE(contains(r.output, "vram/host")) << r.output;
}

// --progress-thread off: no endpoint has a progress thread, as NIXL agents without one. The
// initiator's calls make progress and the target side polls get_notifications(); the socket I/O
// in the calls (caller) and in I/O threads (what `auto` picks on more than 4 cores), the target in
// a child process and in a thread of this one. (No baseline and, under ThreadSanitizer, no
// --verify: see above.)
TEST(BenchEngineCli, WithoutProgressThreadsTheTargetSidePolls) {
    for (const char* io : {"caller", "threads"}) {
        for (const char* procs : {"1", "2"}) {
            SCOPED_TRACE(std::string("SOCKET_IO ") + io + ", --procs " + procs);
            std::vector<std::string> args = {"bench",   "engine",  "--progress-thread",
                                             "off",     "--sizes", "4K,256K,2M",
                                             "--procs", procs,     "--no-baseline"};
            if (!kUnderThreadSanitizer) args.push_back("--verify");
            const CliResult r = run_cli(quick(args), {{"TCPX_P2P_SOCKET_IO", io}});
            ASSERT_TRUE(exited_with(r, 0)) << r.output;
            EXPECT_TRUE(
                contains(r.output, "no progress thread: the calls make progress, the target polls"))
                << r.output;
            EXPECT_FALSE(contains(r.output, "progress quiet spin")) << r.output;  // no such thread
            EXPECT_TRUE(contains(r.output, std::string(io) == "caller"
                                               ? "socket I/O in the calls (caller)"
                                               : "I/O threads per endpoint"))
                << r.output;
            EXPECT_TRUE(positive_under(r.output, "op ", {"GB/s", "CPU s/GB"})) << r.output;
            if (!kUnderThreadSanitizer) {
                EXPECT_TRUE(contains(r.output, "verified")) << r.output;
            }
        }
    }
    const CliResult json_run =
        run_cli(quick({"bench", "engine", "--progress-thread", "off", "--sizes", "4K", "--procs",
                       "1", "--op", "write", "--no-latency", "--no-baseline", "--json"}));
    ASSERT_TRUE(exited_with(json_run, 0)) << json_run.output;
    const auto doc = json_of(json_run.output);
    ASSERT_FALSE(doc.is_discarded()) << json_run.output;
    EXPECT_EQ(doc["config"]["progress_thread"], "off");
    // The progress threads' quiet spin, as it ran: in the header where there is a progress
    // thread, and in the JSON (automatic: off on 4 cores or fewer, on past them).
    for (const char* spin : {"on", "off"}) {
        const CliResult header = run_cli(quick({"bench", "engine", "--sizes", "4K", "--procs", "1",
                                                "--op", "write", "--no-latency", "--no-baseline"}),
                                         {{"TCPX_P2P_PROGRESS_QUIET_SPIN", spin}});
        ASSERT_TRUE(exited_with(header, 0)) << header.output;
        EXPECT_TRUE(contains(header.output, std::string("; progress quiet spin ") + spin))
            << header.output;
    }
    const std::string automatic = usable_cores() > 4 ? "on" : "off";
    EXPECT_EQ(doc["config"]["progress_quiet_spin"], automatic);
    const CliResult bad =
        run_cli(quick({"bench", "engine", "--progress-thread", "sometimes", "--sizes", "4K"}));
    EXPECT_TRUE(exited_with(bad, 105));  // CLI11's validation failure, as for --op
    EXPECT_TRUE(contains(bad.output, "--progress-thread: sometimes not in {on,off}")) << bad.output;
}

TEST(BenchEngineCli, HostMemoryJson) {
    const CliResult r = run_cli(quick({"bench", "engine", "--sizes", "4K", "--procs", "1", "--op",
                                       "write", "--no-latency", "--json"}));
    ASSERT_TRUE(exited_with(r, 0));
    EXPECT_TRUE(has_all(r.output, {"\"mem\": \"host\"", "\"throughput_ratio\""}));
    EXPECT_FALSE(contains(r.output, "\"vram_host_ratio\"")) << r.output;
}

// The emulated TCPX plugin without a wire: the engine's own ceiling, both ends in one process,
// the raw TCP baseline still measured.
TEST(BenchEngineCli, PluginWithoutWireInOneProcess) {
    const std::map<std::string, std::string> env = {{"TCPX_P2P_NET_PLUGIN", TCPX_FAKE_TCPX_PATH},
                                                    {"FAKETCPX_NO_WIRE", "1"}};
    const CliResult r =
        run_cli(quick({"bench", "engine", "--sizes", "64K,2M", "--procs", "1", "--verify"}), env);
    ASSERT_TRUE(exited_with(r, 0));
    EXPECT_TRUE(has_all(r.output, {"net: ncclNet plugin", "ours/raw", "verified"}));
    // The data sockets are the plugin's, not NSOCKS: the header says so and claims no count.
    EXPECT_TRUE(contains(r.output, "data sockets and their threads the plugin's own")) << r.output;
    EXPECT_FALSE(contains(r.output, "data sockets =")) << r.output;
    std::map<std::string, std::string> google = env;
    google["NCCL_NSOCKS_PERTHREAD"] = "4";
    google["NCCL_SOCKET_NTHREADS"] = "1";
    const CliResult quoted = run_cli(
        quick({"bench", "engine", "--sizes", "64K", "--procs", "1", "--no-latency"}), google);
    ASSERT_TRUE(exited_with(quoted, 0));
    EXPECT_TRUE(contains(quoted.output, "NCCL_NSOCKS_PERTHREAD x NCCL_SOCKET_NTHREADS = 4 x 1"))
        << quoted.output;

    const CliResult two =
        run_cli(quick({"bench", "engine", "--sizes", "64K", "--procs", "2"}), env);
    EXPECT_TRUE(exited_with(two, 1));
    EXPECT_TRUE(contains(two.output, "use --procs 1")) << two.output;
}

// --kv: the KV workload at a small scale (a 64 MiB pool, 16 blocks per request = 1024 pieces),
// every request kind verified byte for byte; then as JSON, with the target in a child process.
// Not verified under ThreadSanitizer: --verify prepares pool pieces that the measured transfers
// used, ordered after their sends only through the loopback wire and the benchmark's channel,
// which ThreadSanitizer does not see.
TEST(BenchEngineCli, KvWorkloadIsVerifiedAndComparedWithOneContiguousTransfer) {
#if defined(__SANITIZE_THREAD__)
    constexpr bool kVerify = false;
#else
    constexpr bool kVerify = true;
#endif
    std::vector<std::string> args = {"bench",       "engine", "--kv",    "--kv-pool", "64M",
                                     "--kv-blocks", "16",     "--procs", "1"};
    if (kVerify) args.push_back("--verify");
    const CliResult r = run_cli(quick(args));
    ASSERT_TRUE(exited_with(r, 0));
    EXPECT_TRUE(has_all(r.output, {"--kv: a paged KV cache", "1024 pieces, 32 MiB", "KV GB/s",
                                   "contiguous GB/s", "WRITE  host", "READ   host"}))
        << r.output;
    if (kVerify) {
        EXPECT_TRUE(contains(r.output, "verified")) << r.output;
    }
    EXPECT_TRUE(positive_under(r.output, "op     mem",
                               {"KV GB/s", "contiguous GB/s", "KV CPU s/GB", "cont CPU s/GB"}));
    const CliResult j =
        run_cli(quick({"bench", "engine", "--kv", "--kv-pool", "64M", "--kv-blocks", "16",
                       "--kv-shape", "4,16,8,128,2", "--procs", "2", "--json", "--op", "read"}));
    ASSERT_TRUE(exited_with(j, 0));
    EXPECT_TRUE(has_all(
        j.output, {"\"engine-kv\"", "\"kv_contiguous_ratio\"", "\"pieces\": 128", "\"READ\""}))
        << j.output;
    EXPECT_FALSE(contains(j.output, "\"WRITE\"")) << j.output;
    // The target is the child process: its CPU time is part of the figure.
    const nlohmann::json doc = json_of(j.output);
    ASSERT_TRUE(doc.is_object()) << j.output;
    for (const char* kind : {"kv", "contiguous"}) {
        const nlohmann::json& t = doc["results"][0][kind];
        EXPECT_GT(t.value("cpu_s_per_gb", 0.0), 0) << kind << "\n" << j.output;
        EXPECT_GT(t.value("cpu_seconds_target_process", 0.0), 0) << kind << "\n" << j.output;
        EXPECT_LT(t.value("cpu_seconds_target_process", 0.0), t.value("cpu_seconds", 0.0))
            << kind << "\n"
            << j.output;
    }
}

// CPU s/GB: both sides' CPU seconds per GB, for the engine and for the raw TCP baseline, and
// the engine's over raw TCP's, in the table and in the JSON, with the targets in this process
// and in a child (whose CPU time must be reported back and counted).
TEST(BenchEngineCli, CpuSecondsPerGbOfBothSidesAgainstRawTcp) {
    for (const char* procs : {"1", "2"}) {
        SCOPED_TRACE(std::string("--procs ") + procs);
        const CliResult r = run_cli(
            quick({"bench", "engine", "--sizes", "256K", "--procs", procs, "--no-latency"}));
        ASSERT_TRUE(exited_with(r, 0));
        EXPECT_TRUE(has_all(r.output, {"CPU s/GB: CPU seconds", "CPU vs TCP"}));
        EXPECT_TRUE(positive_under(r.output, "op ", {"GB/s", "CPU s/GB", "raw CPU", "CPU vs TCP"}));

        const CliResult j = run_cli(quick({"bench", "engine", "--sizes", "256K", "--procs", procs,
                                           "--no-latency", "--op", "write", "--json"}));
        ASSERT_TRUE(exited_with(j, 0));
        const nlohmann::json doc = json_of(j.output);
        ASSERT_TRUE(doc.is_object()) << j.output;
        ASSERT_EQ(doc["results"].size(), 1u) << j.output;
        const nlohmann::json& row = doc["results"][0];
        for (const char* which : {"ours", "raw"}) {
            SCOPED_TRACE(which);
            const nlohmann::json& t = row[which];
            const double all = t.value("cpu_seconds", 0.0);
            const double target = t.value("cpu_seconds_target_process", -1.0);
            EXPECT_GT(t.value("cpu_s_per_gb", 0.0), 0) << j.output;
            EXPECT_GT(all, 0) << j.output;
            if (std::string(procs) == "2") {
                EXPECT_GT(target, 0) << j.output;
                EXPECT_LT(target, all) << j.output;
            } else {
                EXPECT_EQ(target, 0) << j.output;
            }
        }
        EXPECT_NEAR(row.value("cpu_vs_tcp", 0.0),
                    row["ours"].value("cpu_s_per_gb", 0.0) / row["raw"].value("cpu_s_per_gb", 1.0),
                    1e-9)
            << j.output;
    }
}

// --stats prints both sides' counters, and they agree with each other: what the initiator sent
// the targets received, every transfer it started completed and was served there.
TEST(BenchEngineCli, StatsPrintBothSidesCountersThatAgree) {
    for (const char* procs : {"1", "2"}) {
        SCOPED_TRACE(std::string("--procs ") + procs);
        const CliResult r = run_cli(quick({"bench", "engine", "--sizes", "64K,1M", "--procs", procs,
                                           "--no-latency", "--no-baseline", "--stats"}));
        ASSERT_TRUE(exited_with(r, 0)) << r.output;
        const size_t at = r.output.find("counters (Endpoint::stats");
        ASSERT_NE(at, std::string::npos) << r.output;
        std::map<std::string, std::pair<uint64_t, uint64_t>> c;
        std::istringstream in(r.output.substr(at));
        std::string line;
        std::getline(in, line);  // the title
        std::getline(in, line);  // the column names
        while (std::getline(in, line)) {
            std::istringstream f(line);
            std::string name;
            uint64_t a = 0, b = 0;
            if (f >> name >> a >> b) c[name] = {a, b};
        }
        ASSERT_EQ(c.size(), 11u) << r.output;
        EXPECT_GT(c["bytes_sent"].first, 0u);
        EXPECT_EQ(c["bytes_sent"].first, c["bytes_received"].second);
        EXPECT_EQ(c["bytes_received"].first, c["bytes_sent"].second);
        EXPECT_GT(c["transfers_started"].first, 0u);
        EXPECT_EQ(c["transfers_completed"].first, c["transfers_started"].first);
        EXPECT_EQ(c["requests_served"].second, c["transfers_completed"].first);
        EXPECT_EQ(c["transfers_failed"].first, 0u);
        EXPECT_EQ(c["errors"].first, 0u);
    }
    // With --json, one JSON line of them on stderr: stdout stays one document.
    const CliResult j = run_cli(quick({"bench", "engine", "--sizes", "64K", "--procs", "1",
                                       "--no-latency", "--no-baseline", "--stats", "--json"}));
    ASSERT_TRUE(exited_with(j, 0)) << j.output;
    EXPECT_TRUE(has_all(j.output, {"{\"stats\":", "\"initiator\":", "\"window_blocked_ns\""}))
        << j.output;
}

// Bad KV shapes are refused with the reason, never run.
TEST(BenchEngineCli, BadKvOptionsAreRefused) {
    struct Case {
        std::vector<std::string> args;
        int code;
        const char* says;
    };
    const Case cases[] = {
        {{"--kv-shape", "32,16"}, 2, "is not layers,tokens,heads,dim,dtype"},
        {{"--kv-shape", "32,16,8,128,2,1"}, 2, "is not layers,tokens,heads,dim,dtype"},
        {{"--kv-pool", "lots"}, 2, "--kv-pool 'lots' is not a size"},
        {{"--kv-pool", "16M", "--kv-blocks", "64"}, 1, "a request takes 64"},
        {{"--kv-shape", "0,16,8,128,2"}, 1, "positive numbers"},
        {{"--kv-shape", "32,16,8,128,16"}, 1, "larger than any model"},
        {{"--peers", "2"}, 1, "--kv: one peer"},
        {{"--batch", "4"}, 1, "--kv: a request is its own batch"},
        // check_kv_shape allows 64 GiB (tcpx-nixl-bench's pools); one side of this bench holds
        // 16 GiB per memory type, and the target refused more only after the setup.
        {{"--kv-pool", "32G"}, 1, "--kv-pool: at most 16 GiB"},
    };
    for (const Case& c : cases) {
        std::vector<std::string> args = {"bench", "engine", "--kv", "--procs", "1"};
        args.insert(args.end(), c.args.begin(), c.args.end());
        SCOPED_TRACE(c.says);
        const CliResult r = run_cli(quick(args));
        EXPECT_TRUE(exited_with(r, c.code));
        EXPECT_TRUE(contains(r.output, c.says)) << r.output;
    }
}

TEST(BenchEngineCli, KvWorkloadOnGpu) {
    if (cuda::device_count() == 0) GTEST_SKIP() << "no usable GPU";
    const CliResult r = run_cli(quick({"bench", "engine", "--kv", "--mem", "vram", "--kv-pool",
                                       "256M", "--kv-blocks", "32", "--procs", "2", "--verify"}));
    ASSERT_TRUE(exited_with(r, 0));
    EXPECT_TRUE(
        has_all(r.output, {"memory: GPU", "WRITE  vram", "READ   vram", "WRITE  host", "verified"}))
        << r.output;
}

// --- bench net, bench soak -------------------------------------------------------------------

// Sizes no run can hold are refused with the bound before anything is allocated (a huge one was
// an uncaught std::bad_alloc, or a region whose size wrapped to 0 and a failed registration's
// .value()); a message of 0 bytes is refused too.
TEST(BenchNetAndSoakCli, SizesPastTheirBoundsAreRefused) {
    for (const char* sizes : {"0", "4294967296G", "4K,2G"}) {
        SCOPED_TRACE(std::string("bench net --sizes ") + sizes);
        const CliResult r = run_cli(quick({"bench", "net", "--sizes", sizes}));
        EXPECT_TRUE(exited_with(r, 1));
        EXPECT_TRUE(contains(r.output, "is not in 1 B..1 GiB")) << r.output;
    }
    for (const std::vector<std::string>& args :
         {std::vector<std::string>{"--size", "4294967296G"},
          {"--size", "2G", "--peers", "1"},
          {"--size", "1G", "--peers", "4096", "--inflight", "1024"}}) {
        std::vector<std::string> all = {"bench", "soak", "--seconds", "1"};
        all.insert(all.end(), args.begin(), args.end());
        SCOPED_TRACE(args[1]);
        const CliResult r = run_cli(all);
        EXPECT_TRUE(exited_with(r, 2));
        EXPECT_TRUE(contains(r.output,
                             "--size in 1..1 GiB, and --peers x --inflight x --size at "
                             "most 16 GiB"))
            << r.output;
    }
}

// --- doctor ---------------------------------------------------------------------------------

// The environment's values are anyone's bytes: --json writes those that are not UTF-8 as U+FFFD
// (nlohmann::json's dump() threw on them, and the doctor died).
TEST(DoctorCli, JsonOfAnEnvironmentThatIsNotUtf8) {
    const CliResult r = run_cli({"doctor", "--json"}, {{"NCCL_TCPX_P2P_TEST_BYTES", "a\xff\xfe"}});
    EXPECT_TRUE(exited_with(r, 0) || exited_with(r, 1));
    const auto doc = json_of(r.output);
    ASSERT_FALSE(doc.is_discarded()) << r.output;
    bool found = false;
    for (const auto& c : doc["checks"]) {
        if (c["item"] == "NCCL_TCPX_P2P_TEST_BYTES") {
            found = true;
            EXPECT_EQ(c["value"], "a\xef\xbf\xbd\xef\xbf\xbd");
        }
    }
    EXPECT_TRUE(found) << r.output;
}

// The text table shows the same values with their control bytes escaped: an ESC sequence or a
// C1 CSI in a variable would otherwise reach the terminal as a command (it was printed raw).
TEST(DoctorCli, TheTableEscapesControlBytesOfTheEnvironment) {
    const CliResult r = run_cli({"doctor"}, {{"NCCL_TCPX_P2P_TEST_BYTES",
                                              "a\x1b[2Jb\xc2\x9b"
                                              "31mc\x07"}});
    EXPECT_TRUE(exited_with(r, 0) || exited_with(r, 1));
    EXPECT_TRUE(has_all(r.output, {"NCCL_TCPX_P2P_TEST_BYTES", "a\\x1b[2Jb\\xc2\\x9b31mc\\x07"}))
        << r.output;
    EXPECT_EQ(r.output.find('\x1b'), std::string::npos);
    EXPECT_EQ(r.output.find('\x07'), std::string::npos);
    EXPECT_EQ(r.output.find("\xc2\x9b"), std::string::npos);
}

// On this machine, with nothing set: every section, loopback among the interfaces, exit 0.
TEST(DoctorCli, ReportsTheMachineAndExitsZeroWhenNothingStopsARun) {
    const CliResult r = run_cli({"doctor"});
    ASSERT_TRUE(exited_with(r, 0));
    EXPECT_TRUE(has_all(
        r.output, {"system", "kernel", "limits", "open files (nofile)",
                   "sockets for tcpx-p2p (MAX_SOCKETS)", "interfaces", "lo ", "gpus", "usable GPUs",
                   "plugin", "the built-in socket transport", "doctor: nothing would stop a run"}))
        << r.output;
    EXPECT_FALSE(contains(r.output, "PROBLEM")) << r.output;
}

// The open-files limit against what 64 peers take: a control socket each and, per channel and
// direction, a comm's sockets; over an external plugin two GPU registrations more per comm
// (Google's hold a dma-buf descriptor each), of which MAX_SOCKETS counts those and the control
// sockets. One channel of two sockets: 448 descriptors, 704 over a plugin (320 of them the
// library's). Under a soft limit of 600 (the child inherits it) only the plugin's run warns.
TEST(DoctorCli, TheOpenFilesLimitCountsAPluginsGpuRegistrations) {
    rlimit saved{};
    ASSERT_EQ(::getrlimit(RLIMIT_NOFILE, &saved), 0);
    if (saved.rlim_max != RLIM_INFINITY && saved.rlim_max < 600) GTEST_SKIP() << "hard limit";
    rlimit low = saved;
    low.rlim_cur = 600;
    ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &low), 0);
    const std::map<std::string, std::string> shape = {{"TCPX_P2P_CHANNELS", "1"},
                                                      {"TCPX_P2P_NSOCKS", "2"}};
    const CliResult socket = run_cli({"doctor"}, shape);
    std::map<std::string, std::string> over_plugin = shape;
    over_plugin["TCPX_P2P_NET_PLUGIN"] = TCPX_FAKE_TCPX_PATH;
    over_plugin["TCPX_P2P_PLUGIN_PROBE_PATH"] = TCPX_PROBE_PATH;
    const CliResult plugin = run_cli({"doctor"}, over_plugin);
    ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &saved), 0);
    EXPECT_FALSE(contains(socket.output, "descriptors 64 peers take")) << socket.output;
    EXPECT_TRUE(contains(plugin.output, "fewer than the 704 descriptors 64 peers take"))
        << plugin.output;
    // The library's share (450 of 600) holds the 320 it counts.
    EXPECT_FALSE(contains(plugin.output, "fewer than the 320")) << plugin.output;
}

// The emulated TCPX plugin is probed in a child process and its device listed; the secret in the
// environment is never printed, only that it is set.
TEST(DoctorCli, ProbesThePluginAndNeverPrintsASecret) {
    const std::string secret = "do-not-print-this-secret-0123";
    const CliResult r = run_cli({"doctor"}, {{"TCPX_P2P_NET_PLUGIN", TCPX_FAKE_TCPX_PATH},
                                             {"TCPX_P2P_PLUGIN_PROBE_PATH", TCPX_PROBE_PATH},
                                             {"TCPX_P2P_AUTH_SECRET", secret}});
    ASSERT_TRUE(exited_with(r, 0));
    EXPECT_TRUE(has_all(r.output, {"table GPUDirectTCPX_v7_emulated, ncclNet v7, 1 devices",
                                   "dev 0", "TCPX_P2P_AUTH_SECRET", "(set, 29 characters)"}))
        << r.output;
    EXPECT_FALSE(contains(r.output, secret)) << r.output;
}

// The CLI of a build tree finds the probe the build put in <build>/libexec, with no
// TCPX_P2P_PLUGIN_PROBE_PATH (an empty one is unset), as the installed CLI finds it in libexec/.
TEST(DoctorCli, FindsTheProbeOfItsOwnBuildTree) {
    const CliResult r = run_cli({"doctor"}, {{"TCPX_P2P_NET_PLUGIN", TCPX_FAKE_TCPX_PATH},
                                             {"TCPX_P2P_PLUGIN_PROBE_PATH", ""},
                                             {"PATH", "/usr/bin:/bin"}});
    ASSERT_TRUE(exited_with(r, 0)) << r.output;
    EXPECT_TRUE(has_all(r.output, {"table GPUDirectTCPX_v7_emulated, ncclNet v7, 1 devices"}))
        << r.output;
}

// A plugin named by its file name alone is searched for as dlopen searches (LD_LIBRARY_PATH
// first): the doctor says so, and which file the probe loaded.
TEST(DoctorCli, SaysWhereABareFileNameWasFound) {
    const std::string path = TCPX_FAKE_TCPX_PATH;
    const std::string dir = path.substr(0, path.rfind('/'));
    const std::string file = path.substr(path.rfind('/') + 1);
    const CliResult r = run_cli({"doctor"}, {{"TCPX_P2P_NET_PLUGIN", file},
                                             {"LD_LIBRARY_PATH", dir},
                                             {"TCPX_P2P_PLUGIN_PROBE_PATH", TCPX_PROBE_PATH}});
    ASSERT_TRUE(exited_with(r, 0)) << r.output;
    EXPECT_TRUE(has_all(r.output,
                        {"a file name: searched in LD_LIBRARY_PATH", "loaded from", path.c_str()}))
        << r.output;
    const CliResult p = run_cli({"doctor"}, {{"TCPX_P2P_NET_PLUGIN", path},
                                             {"TCPX_P2P_PLUGIN_PROBE_PATH", TCPX_PROBE_PATH}});
    EXPECT_TRUE(has_all(p.output, {"a path: loaded as given", "loaded from"})) << p.output;
}

// What would stop a run is a PROBLEM with its fix, and exit code 1: a plugin that does not load,
// an invalid setting, an interface that does not exist. The same as JSON.
TEST(DoctorCli, WhatWouldStopARunIsAProblemWithAFix) {
    struct Case {
        std::map<std::string, std::string> env;
        const char* says;
    };
    const Case cases[] = {
        {{{"TCPX_P2P_NET_PLUGIN", "/nonexistent/libnccl-net-nothing.so"},
          {"TCPX_P2P_PLUGIN_PROBE_PATH", TCPX_PROBE_PATH}},
         "cannot load"},
        {{{"TCPX_P2P_NET_PLUGIN", TCPX_FAKE_TCPX_PATH},
          {"TCPX_P2P_PLUGIN_PROBE_PATH", "/nonexistent/tcpx-p2p-probe"}},
         "plugin probe"},
        {{{"TCPX_P2P_NSOCKS", "65"}}, "TCPX_P2P_NSOCKS"},
        {{{"TCPX_P2P_SOCKET_IFNAME", "=no-such-interface0"}}, "none usable"},
    };
    for (const Case& c : cases) {
        SCOPED_TRACE(c.says);
        const CliResult r = run_cli({"doctor"}, c.env);
        EXPECT_TRUE(exited_with(r, 1));
        EXPECT_TRUE(has_all(
            r.output, {"PROBLEM", "fix: ", c.says, "doctor: something above would stop a run"}))
            << r.output;
        const CliResult j = run_cli({"doctor", "--json"}, c.env);
        EXPECT_TRUE(exited_with(j, 1));
        EXPECT_TRUE(
            has_all(j.output, {"\"blocked\": true", "\"blocking\": true", "\"fix\"", c.says}))
            << j.output;
    }
}

// Doctor reads sysfs under TCPX_P2P_SYSFS_ROOT: on the A3-high fixture it lists the NICs with
// their speed, MTU, NUMA node and PCI path, the GPUs, and the GPU-to-NIC map (two GPUs per NIC,
// each on its switch). Without a GPU CUDA sees, the GPUs are sysfs's, in PCI order.
TEST(DoctorCli, ShowsTheGpuNicMapOfTheA3HighFixture) {
    auto tree = testing::SysfsTree::a3_high();
    const std::map<std::string, std::string> env = {{"TCPX_P2P_SYSFS_ROOT", tree->root()}};
    const CliResult r = run_cli({"doctor"}, env);
    ASSERT_TRUE(exited_with(r, 0));
    const std::string eth3 = "up, 200000 Mb/s, mtu 8244, numa 1, pci 0000:95:00.0 (" +
                             tree->root() +
                             "/devices/pci0000:90/0000:90:01.0/0000:91:00.0/0000:92:02.0/"
                             "0000:95:00.0)";
    EXPECT_TRUE(has_all(r.output, {"devmem TCP", "gpu-nic map", "TCPX_P2P_SYSFS_ROOT",
                                   "RxDM socket", "NCCL_GPUDIRECTTCPX_UNIX_CLIENT_PREFIX",
                                   "NCCL_DYNAMIC_CHUNK_SIZE", eth3.c_str()}))
        << r.output;
    const bool cuda = cuda::device_count() > 0;  // then the GPUs are CUDA's, not the fixture's
    if (!cuda) {
        EXPECT_TRUE(
            has_all(r.output, {"GPU 0 (sysfs)", "pci 0000:13:00.0, numa 0", "GPU 7 (0000:a4:00.0)",
                               "eth4 (0000:a5:00.0), same PCIe switch"}))
            << r.output;
    }
    const CliResult j = run_cli({"doctor", "--json"}, env);
    ASSERT_TRUE(exited_with(j, 0));
    const nlohmann::json doc = json_of(j.output);
    ASSERT_FALSE(doc.is_discarded()) << j.output;
    EXPECT_FALSE(doc["kernel"]["release"].get<std::string>().empty());
    EXPECT_TRUE(doc["kernel"]["devmem_tcp"].is_string());
    EXPECT_TRUE(doc["kernel"]["upstream_devmem_version"].is_boolean());
    EXPECT_TRUE(doc["rxdm_socket"]["present"].is_boolean());
    const nlohmann::json& nics = doc["topology"]["nics"];
    ASSERT_EQ(nics.size(), 6u) << nics.dump();
    EXPECT_EQ(nics[2]["name"], "eth2");
    EXPECT_EQ(nics[2]["speed_mbps"], 200000);
    EXPECT_EQ(nics[2]["mtu"], 8244);
    EXPECT_EQ(nics[2]["numa_node"], 0);
    EXPECT_EQ(nics[2]["pci_address"], "0000:25:00.0");
    EXPECT_NE(nics[2]["pci_path"].get<std::string>().find("/0000:22:02.0/0000:25:00.0"),
              std::string::npos);
    if (cuda) return;
    const nlohmann::json& gpus = doc["topology"]["gpus"];
    ASSERT_EQ(gpus.size(), 8u);
    EXPECT_EQ(gpus[4]["pci_address"], "0000:93:00.0");
    EXPECT_EQ(gpus[4]["numa_node"], 1);
    EXPECT_EQ(gpus[4]["source"], "sysfs");
    const nlohmann::json& map = doc["topology"]["gpu_nic_map"];
    ASSERT_EQ(map.size(), 8u);
    for (int g = 0; g < 8; ++g) {
        SCOPED_TRACE(g);
        EXPECT_EQ(map[g]["gpu"], g);
        EXPECT_EQ(map[g]["nics"], nlohmann::json::array({"eth" + std::to_string(g / 2 + 1)}));
        EXPECT_EQ(map[g]["source"], "sysfs");
        EXPECT_EQ(map[g]["distance"], "same PCIe switch");
    }
}

// The static map overrides sysfs; one naming an interface the host lacks would stop that GPU's
// endpoints, and one that does not parse is an invalid setting: both PROBLEMs, exit 1.
TEST(DoctorCli, TheStaticMapAndItsProblems) {
    if (cuda::device_count() > 0) GTEST_SKIP() << "the GPUs are CUDA's, not the fixture's";
    auto tree = testing::SysfsTree::a3_high();
    const CliResult r = run_cli({"doctor", "--json"}, {{"TCPX_P2P_SYSFS_ROOT", tree->root()},
                                                       {"TCPX_P2P_GPU_NIC_MAP", "0:eth4,1:eth9"}});
    EXPECT_TRUE(exited_with(r, 1));
    const nlohmann::json doc = json_of(r.output);
    ASSERT_FALSE(doc.is_discarded()) << r.output;
    const nlohmann::json& map = doc["topology"]["gpu_nic_map"];
    ASSERT_EQ(map.size(), 8u);
    EXPECT_EQ(map[0]["nics"], nlohmann::json::array({"eth4"}));
    EXPECT_EQ(map[0]["source"], "map");
    EXPECT_EQ(map[2]["source"], "sysfs");
    EXPECT_TRUE(has_all(r.output, {"TCPX_P2P_GPU_NIC_MAP names eth9, which this host does not "
                                   "have",
                                   "\"blocking\": true"}))
        << r.output;
    const CliResult bad = run_cli(
        {"doctor"}, {{"TCPX_P2P_SYSFS_ROOT", tree->root()}, {"TCPX_P2P_GPU_NIC_MAP", "0:eth1,0:"}});
    EXPECT_TRUE(exited_with(bad, 1));
    EXPECT_TRUE(has_all(bad.output, {"PROBLEM", "TCPX_P2P_GPU_NIC_MAP: entry 2 '0:'", "fix: "}))
        << bad.output;
}

// RxDM's socket under NCCL_GPUDIRECTTCPX_UNIX_CLIENT_PREFIX, and the plugin's interfaces placed
// on the PCI tree.
TEST(DoctorCli, RxdmSocketAndTheTcpxVariables) {
    auto tree = testing::SysfsTree::a3_high();
    char dir[] = "/tmp/tcpx-doctor-XXXXXX";
    ASSERT_NE(::mkdtemp(dir), nullptr);
    const std::string path = std::string(dir) + "/rx_rule_manager";
    const std::map<std::string, std::string> env = {
        {"TCPX_P2P_SYSFS_ROOT", tree->root()},
        {"NCCL_GPUDIRECTTCPX_UNIX_CLIENT_PREFIX", dir},
        {"NCCL_GPUDIRECTTCPX_SOCKET_IFNAME", "eth1,eth9"}};
    const CliResult absent = run_cli({"doctor"}, env);
    EXPECT_TRUE(exited_with(absent, 0));
    const std::string says_absent = "absent (" + path + ")";
    EXPECT_TRUE(has_all(
        absent.output,
        {says_absent.c_str(), "eth1,eth9 (eth1: 0000:15:00.0, numa 0; eth9: no such interface)"}))
        << absent.output;
    const int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
    ASSERT_GE(fd, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::snprintf(addr.sun_path, sizeof(addr.sun_path), "%s", path.c_str());
    ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    const CliResult there = run_cli({"doctor", "--json"}, env);
    ::close(fd);
    ::unlink(path.c_str());
    ::rmdir(dir);
    EXPECT_TRUE(exited_with(there, 0));
    const nlohmann::json doc = json_of(there.output);
    ASSERT_FALSE(doc.is_discarded()) << there.output;
    EXPECT_EQ(doc["rxdm_socket"]["path"], path);
    EXPECT_EQ(doc["rxdm_socket"]["present"], true);
}

}  // namespace
}  // namespace tcpx
