// `tcpx-p2p bench engine` in its two roles over loopback (--listen on 127.0.0.1, --connect from a
// second process, no root needed): the table of the loopback mode, --bidir and --pairs, the side
// channel's refusal of strays and of lines without end, and the combinations that must be
// refused with a clear message (and never a hang).
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "common/socket.h"
#include "common/strings.h"
#include "cuda/device.h"
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
using testing::ListeningTarget;
using testing::positive_under;
using testing::side_channel_exchange;
using testing::SideChannelProxy;

using testing::run_cli;

// Short measurements. Under ThreadSanitizer without the raw baseline and --verify (their buffers
// pass between the processes through the wire, which it cannot see; see cli_test.cc).
std::vector<std::string> role_quick(std::vector<std::string> args) {
    for (const char* a : {"--time", "0.05", "--iters", "2", "--no-progress"}) args.push_back(a);
#if defined(__SANITIZE_THREAD__)
    args.push_back("--no-baseline");
#else
    args.push_back("--verify");
#endif
    return args;
}

TEST(BenchEngineRoles, ListenAndConnectOverLoopback) {
    ListeningTarget target;
    ASSERT_TRUE(target.start(TCPX_P2P_CLI_PATH, "127.0.0.1:0"));
    EXPECT_TRUE(contains(target.output(), "plaintext, unauthenticated")) << target.output();
    const CliResult r = run_cli(role_quick(
        {"bench", "engine", "--connect", target.address(), "--sizes", "4K,1M", "--no-latency"}));
    ASSERT_TRUE(exited_with(r, 0));
    EXPECT_TRUE(has_all(r.output, {"targets on 127.0.0.1:", "=lo", "engine: ", "target: "}));
    EXPECT_TRUE(positive_under(r.output, "op ", {"GB/s"}));
#if !defined(__SANITIZE_THREAD__)
    EXPECT_TRUE(positive_under(r.output, "op ", {"raw"}));
    EXPECT_TRUE(contains(r.output, "verified")) << r.output;
#endif
    const int status = target.finish();
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << target.output();
    EXPECT_TRUE(contains(target.output(), "the initiator is done")) << target.output();
}

// --progress-thread off reaches the target through the side channel's hello: its endpoints run
// without one too, and it polls them between commands.
TEST(BenchEngineRoles, WithoutProgressThreadsOnBothSides) {
    ListeningTarget target;
    ASSERT_TRUE(target.start(TCPX_P2P_CLI_PATH, "127.0.0.1:0"));
    const CliResult r =
        run_cli(role_quick({"bench", "engine", "--connect", target.address(), "--sizes", "4K,1M",
                            "--progress-thread", "off", "--bidir"}));
    ASSERT_TRUE(exited_with(r, 0));
    EXPECT_TRUE(positive_under(r.output, "op ", {"GB/s", "i->t", "t->i"})) << r.output;
    const size_t target_line = r.output.find("target: ");
    ASSERT_NE(target_line, std::string::npos) << r.output;
    EXPECT_NE(r.output.find("no progress thread", target_line), std::string::npos) << r.output;
    EXPECT_EQ(target.finish(), 0) << target.output();
}

TEST(BenchEngineRoles, BidirAndPairsOverLoopback) {
    ListeningTarget target;
    ASSERT_TRUE(target.start(TCPX_P2P_CLI_PATH, "127.0.0.1:0"));
    const CliResult r =
        run_cli(role_quick({"bench", "engine", "--connect", target.address(), "--sizes", "64K",
                            "--bidir", "--pairs", "2", "--no-latency", "--no-single-peer"}));
    ASSERT_TRUE(exited_with(r, 0));
    EXPECT_TRUE(has_all(r.output, {"2 endpoint pairs", "both directions at once"}));
    EXPECT_TRUE(positive_under(r.output, "op ", {"GB/s", "i->t", "t->i", "#0", "#1"}));
    EXPECT_EQ(target.finish(), 0) << target.output();
}

TEST(BenchEngineRoles, JsonNamesTheTargets) {
    ListeningTarget target;
    ASSERT_TRUE(target.start(TCPX_P2P_CLI_PATH, "127.0.0.1:0"));
    const CliResult r =
        run_cli(role_quick({"bench", "engine", "--connect", target.address(), "--sizes", "4K",
                            "--op", "write", "--bidir", "--no-latency", "--json"}));
    ASSERT_TRUE(exited_with(r, 0));
    const auto doc = json_of(r.output);
    ASSERT_FALSE(doc.is_discarded()) << r.output;
    EXPECT_EQ(doc["config"]["connect"], target.address());
    EXPECT_EQ(doc["config"]["bidir"], true);
    EXPECT_TRUE(contains(doc["config"]["target"].get<std::string>(), "=lo"));
    ASSERT_EQ(doc["results"].size(), 1U);
    EXPECT_GT(doc["results"][0]["initiator_to_targets_gbps"].get<double>(), 0);
    EXPECT_GT(doc["results"][0]["targets_to_initiator_gbps"].get<double>(), 0);
    EXPECT_EQ(target.finish(), 0) << target.output();
}

// Pairs and both directions in one process and two (no side channel) too.
TEST(BenchEngineRoles, PairsAndBidirOnOneHost) {
    for (const char* procs : {"1", "2"}) {
        SCOPED_TRACE(std::string("--procs ") + procs);
        const CliResult r = run_cli(role_quick({"bench", "engine", "--procs", procs, "--sizes",
                                                "64K", "--pairs", "2", "--bidir", "--no-latency"}));
        ASSERT_TRUE(exited_with(r, 0));
        EXPECT_TRUE(positive_under(r.output, "op ", {"GB/s", "i->t", "t->i", "#0", "#1"}));
    }
}

// A stray client (a wrong greeting, or a line that never ends) is refused and the target goes on
// listening for the real initiator.
TEST(BenchEngineRoles, StraysAreRefusedAndTheTargetStillServes) {
    ListeningTarget target;
    ASSERT_TRUE(target.start(TCPX_P2P_CLI_PATH, "127.0.0.1:0"));
    {
        auto fd = target.connect();
        ASSERT_TRUE(fd.ok());
        const std::string hello = "GET / HTTP/1.0\n";
        ASSERT_TRUE(send_all(fd->get(), hello.data(), hello.size()).ok());
        char buf[256] = {};
        const ssize_t n = ::recv(fd->get(), buf, sizeof(buf) - 1, 0);
        ASSERT_GT(n, 0);
        EXPECT_TRUE(contains(buf, "error ")) << buf;
        EXPECT_TRUE(contains(buf, "not a tcpx-p2p bench engine initiator")) << buf;
    }
    {
        // 2 MiB without a newline: the target gives up on it at its line bound.
        auto fd = target.connect();
        ASSERT_TRUE(fd.ok());
        const std::string junk(64 << 10, 'x');
        for (int i = 0; i < 32; ++i) {
            if (!send_all(fd->get(), junk.data(), junk.size()).ok()) break;  // it closed on us
        }
    }
    const CliResult r = run_cli(role_quick({"bench", "engine", "--connect", target.address(),
                                            "--sizes", "4K", "--op", "write", "--no-latency"}));
    ASSERT_TRUE(exited_with(r, 0));
    EXPECT_EQ(target.finish(), 0) << target.output();
    EXPECT_TRUE(has_all(target.output(), {"refused", "a line longer than"}));
}

// Commands from the side channel are the network's: numbers that do not parse, sizes, counts
// and bounds a real initiator never sends get error replies, and the target serves on.
TEST(BenchEngineRoles, HostileCommandsGetErrorReplies) {
    ListeningTarget target;
    ASSERT_TRUE(target.start(TCPX_P2P_CLI_PATH, "127.0.0.1:0"));
    const std::string got =
        side_channel_exchange(target,
                              "hello tcpx-p2p-bench-engine 2 mem=host bidir=1 time=0.1\n"
                              "endpoints lots\n"
                              "endpoints 100000\n"
                              "mem host 4096\n"
                              "endpoints 1junk\n"
                              "endpoints 1\n"
                              "mem host 99999999999999\n"
                              "mem host -1\n"
                              "xfer write host 5000001 4096 1 1 1\n"
                              "xfer write host 1 4096 1 2147483647 1\n"
                              "xfer write host 1 18446744073709551615 1 1 1\n"
                              "xfer write host 1 4096 70000 1 1\n"
                              "xfer write host 1 0 1 1 1\n"
                              "xfer write host 1 4096 1 1 1\n"
                              "accept 86400001\n"
                              "kvshape 1 1 1 1 1 68719476736 1\n"
                              "raw-listen\n"
                              "raw-accept 2147483647\n"
                              "nonsense\n"
                              "quit\n");
    EXPECT_TRUE(has_all(
        got, {"hello tcpx-p2p-bench-engine 2", "endpoints: n not in 1..256", "mem before endpoints",
              "endpoints: '1junk' is not a number", "more than 16 GiB per side",
              "mem: '-1' is not a number", "xfer: a count past 5000000",
              "xfer: a size, batch or concurrency past its bound",
              "xfer: a size, batch, concurrency or count of 0", "xfer before accept",
              "accept: ms not in 0..86400000", "more than 16 Mi blocks",
              "raw-accept: streams not in 1..1024", "unknown command", "bye"}))
        << got;
    EXPECT_FALSE(contains(got, "endpoints exist already")) << got;  // "1junk" made none
    EXPECT_EQ(target.finish(), 0) << target.output();
}

// A greeting whose settings the target's engine refuses (a PROGRESS_THREAD that is neither on nor
// off, 99 channels) gets an error naming the setting, and the target goes on listening and serves
// the next initiator. (It ended there, after accepting the greeting.)
TEST(BenchEngineRoles, AGreetingWithBadSettingsIsRefusedAndTheNextServed) {
    ListeningTarget target;
    ASSERT_TRUE(target.start(TCPX_P2P_CLI_PATH, "127.0.0.1:0"));
    std::string got = side_channel_exchange(
        target, "hello tcpx-p2p-bench-engine 2 mem=host progress=sometimes time=0.1\n");
    EXPECT_TRUE(contains(got, "error INVALID_ARGUMENT")) << got;
    EXPECT_TRUE(contains(got, "TCPX_P2P_PROGRESS_THREAD: 'sometimes' is not one of on|off")) << got;
    got = side_channel_exchange(target, "hello tcpx-p2p-bench-engine 2 mem=host channels=99\n");
    EXPECT_TRUE(contains(got, "error OUT_OF_RANGE: hello: TCPX_P2P_CHANNELS: 99")) << got;
    // GPU memory on a GPU this host lacks (without a GPU here: any GPU memory at all) is refused
    // at the greeting too, not when the endpoints are made.
    got = side_channel_exchange(target, "hello tcpx-p2p-bench-engine 2 mem=vram gpus=0,1000\n");
    EXPECT_TRUE(contains(got, "error ")) << got;
    EXPECT_TRUE(contains(got, "this host has") || contains(got, "no usable GPU") ||
                contains(got, "no CUDA support"))
        << got;
    const CliResult r = run_cli(role_quick({"bench", "engine", "--connect", target.address(),
                                            "--sizes", "4K", "--op", "write", "--no-latency"}));
    EXPECT_TRUE(exited_with(r, 0));
    const int status = target.finish();
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status << target.output();
    EXPECT_TRUE(has_all(target.output(), {"'sometimes' is not one of on|off", "still listening",
                                          "the initiator is done"}));
}

// The initiator checks its own engine settings before it reaches for a target (it sent them in
// its greeting first, and said only that nothing answered).
TEST(BenchEngineRoles, TheInitiatorChecksItsSettingsBeforeConnecting) {
    const ClosedPort closed;
    const CliResult r =
        run_cli({"bench", "engine", "--connect", "127.0.0.1:" + closed.port(), "--channels", "99",
                 "--connect-timeout", "1", "--sizes", "4K", "--no-progress"});
    EXPECT_TRUE(exited_with(r, 1));
    EXPECT_TRUE(contains(r.output, "CHANNELS")) << r.output;
    EXPECT_FALSE(contains(r.output, "no benchmark target answers")) << r.output;
}

// Replies from the side channel are the network's: a counter past 2^64, seconds that are not a
// number, a raw baseline's port that is not one, end the run with a protocol error, not an
// uncaught exception (std::stoull, std::stod, std::stoi threw).
TEST(BenchEngineRoles, MalformedRepliesEndTheRunWithAProtocolError) {
    struct Case {
        const char* command;  // whose reply is replaced
        const char* reply;
        std::vector<std::string> args;
        const char* says;
    };
    const Case cases[] = {
        {"stats",
         "stats 99999999999999999999 0 0 0 0 0 0 0 0 0 0",
         {"--stats", "--no-baseline"},
         "a counter that is not a number: 99999999999999999999"},
        {"xfer", "secs x", {"--bidir", "--no-baseline"}, "peer: secs x"},
        {"raw-listen", "port x 1.2.3.4 00", {}, "expected \"port <1..65535> <host> <token>\""},
    };
    for (const Case& c : cases) {
        SCOPED_TRACE(c.command);
        ListeningTarget target;
        ASSERT_TRUE(target.start(TCPX_P2P_CLI_PATH, "127.0.0.1:0"));
        SideChannelProxy proxy;
        ASSERT_TRUE(
            proxy.start(target.port(), [&c](const std::string& command, const std::string& reply) {
                return command.rfind(c.command, 0) == 0 ? std::string(c.reply) : reply;
            }));
        std::vector<std::string> args = {
            "bench",        "engine", "--connect", proxy.address(), "--sizes", "4K",
            "--no-latency", "--time", "0.05",      "--iters",       "2",       "--no-progress"};
        args.insert(args.end(), c.args.begin(), c.args.end());
        const CliResult r = run_cli(args);
        EXPECT_TRUE(exited_with(r, 1));
        EXPECT_TRUE(contains(r.output, c.says)) << r.output;
        EXPECT_NE(target.finish(), -1) << target.output();
    }
}

// What the target says of itself is shown as text (control characters written \xNN, not sent to
// the terminal) and in the JSON (bytes that are not UTF-8 as U+FFFD; dump() threw on them).
TEST(BenchEngineRoles, TheTargetsWordsAreShownSafely) {
    for (const bool json : {false, true}) {
        SCOPED_TRACE(json ? "--json" : "table");
        ListeningTarget target;
        ASSERT_TRUE(target.start(TCPX_P2P_CLI_PATH, "127.0.0.1:0"));
        SideChannelProxy proxy;
        const std::string hello = "hello tcpx-p2p-bench-engine 2 ";
        ASSERT_TRUE(
            // (`hello` by value: the proxy's thread may outlive this scope's locals until its
            // destructor joins it, and `hello` is destroyed first)
            proxy.start(target.port(),
                        [hello](const std::string& command, const std::string& reply) {
                            if (command.rfind("hello", 0) != 0) return reply;
                            return hello + "\x1b[2J\xff\xfe" + reply.substr(hello.size());
                        }));
        std::vector<std::string> args = {
            "bench",   "engine", "--connect",    proxy.address(), "--sizes", "4K",
            "--op",    "write",  "--no-latency", "--no-baseline", "--time",  "0.05",
            "--iters", "2",      "--no-progress"};
        if (json) args.push_back("--json");
        const CliResult r = run_cli(args);
        ASSERT_TRUE(exited_with(r, 0));
        EXPECT_FALSE(contains(r.output, "\x1b")) << r.output;
        if (json) {
            const auto doc = json_of(r.output);
            ASSERT_FALSE(doc.is_discarded()) << r.output;
            EXPECT_TRUE(contains(doc["config"]["target"].get<std::string>(),
                                 "\x1b[2J\xef\xbf\xbd\xef\xbf\xbd=lo"))
                << r.output;
        } else {
            EXPECT_TRUE(contains(r.output, "\\x1b[2J\xff\xfe=lo")) << r.output;
        }
        EXPECT_EQ(target.finish(), 0) << target.output();
    }
}

// The raw baseline's buffer is host memory like the registered regions, and counts with them
// against the 16 GiB a side may hold (it came on top, up to 16 GiB more).
TEST(BenchEngineRoles, TheRawBaselinesBufferCountsWithHostMemory) {
    ListeningTarget target;
    ASSERT_TRUE(target.start(TCPX_P2P_CLI_PATH, "127.0.0.1:0"));
    auto fd = target.connect();
    ASSERT_TRUE(fd.ok());
    timeval tv{10, 0};
    ::setsockopt(fd->get(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    std::string pending;
    auto call = [&](const std::string& line) {
        const std::string out = line + "\n";
        if (!send_all(fd->get(), out.data(), out.size()).ok()) return std::string("(send failed)");
        char buf[4096];
        for (size_t nl; (nl = pending.find('\n')) == std::string::npos;) {
            const ssize_t n = ::recv(fd->get(), buf, sizeof(buf), 0);
            if (n <= 0) return std::string("(closed)");
            pending.append(buf, static_cast<size_t>(n));
        }
        const size_t nl = pending.find('\n');
        std::string reply = pending.substr(0, nl);
        pending.erase(0, nl + 1);
        return reply;
    };
    ASSERT_TRUE(contains(call("hello tcpx-p2p-bench-engine 2 mem=host time=0.1"), "hello "));
    ASSERT_TRUE(contains(call("endpoints 1"), "md "));
    ASSERT_TRUE(contains(call("mem host 1048576"), "mem "));
    const std::string listening = call("raw-listen");
    std::istringstream words(listening);
    std::string port_word, port, host, token_hex;
    words >> port_word >> port >> host >> token_hex;
    ASSERT_EQ(port_word, "port") << listening;
    ASSERT_EQ(token_hex.size(), 32u) << listening;
    std::vector<uint8_t> token;
    ASSERT_TRUE(from_hex(token_hex, &token)) << listening;
    const std::string preamble(token.begin(), token.end());
    std::vector<Fd> raw;
    for (uint32_t i = 0; i < 2; ++i) {
        auto c = connect_blocking(
            *SocketAddress::parse(host, static_cast<uint16_t>(std::stoi(port))), 5000);
        ASSERT_TRUE(c.ok());
        std::string mine = preamble;
        mine.append(reinterpret_cast<const char*>(&i), sizeof(i));
        ASSERT_TRUE(send_all(c->get(), mine.data(), mine.size()).ok());
        raw.push_back(std::move(*c));
    }
    ASSERT_EQ(call("raw-accept 1"), "ok");
    // 16 GiB beside the 1 MiB registered: refused before anything is allocated.
    const std::string got = call("raw-stream 17179869184 1 1");
    EXPECT_TRUE(has_all(got, {"error ",
                              "raw TCP baseline: 16 GiB beside 1 MiB of registered host "
                              "memory is more than 16 GiB per side"}))
        << got;
    EXPECT_EQ(call("quit"), "bye");
    EXPECT_EQ(target.finish(), 0) << target.output();
}

TEST(BenchEngineRoles, NothingListeningIsAClearErrorInBoundedTime) {
    const auto start = std::chrono::steady_clock::now();
    const ClosedPort closed;
    const CliResult r = run_cli({"bench", "engine", "--connect", "127.0.0.1:" + closed.port(),
                                 "--connect-timeout", "1", "--sizes", "4K", "--no-progress"});
    EXPECT_TRUE(exited_with(r, 1));
    EXPECT_TRUE(has_all(r.output, {"no benchmark target answers at 127.0.0.1:", "refused"}));
    EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(20));
}

TEST(BenchEngineRoles, BadAddressesAreRefused) {
    for (const char* where : {"127.0.0.1", "127.0.0.1:", ":7000", "127.0.0.1:99999", "127.0.0.1:0",
                              "::1:7000", "[::1]7000", "127.0.0.1:7x"}) {
        SCOPED_TRACE(std::string("--connect '") + where + "'");
        const CliResult r = run_cli({"bench", "engine", "--connect", where, "--sizes", "4K"});
        EXPECT_TRUE(exited_with(r, 1));
        EXPECT_TRUE(contains(r.output, "--connect: ")) << r.output;
        EXPECT_TRUE(contains(r.output, "HOST:PORT") || contains(r.output, "[IPV6]:PORT"))
            << r.output;
    }
    const CliResult r = run_cli({"bench", "engine", "--listen", "127.0.0.1:port"});
    EXPECT_TRUE(exited_with(r, 1));
    EXPECT_TRUE(has_all(r.output, {"--listen: ", "HOST:PORT"}));
}

TEST(BenchEngineRoles, BadCombinationsAreRefused) {
    struct Case {
        std::vector<std::string> args;
        int code;
        const char* says;
    };
    const ClosedPort closed;
    const std::string p = "127.0.0.1:" + closed.port();
    const std::vector<Case> cases = {
        {{"--listen", p, "--procs", "1"}, 2, "no --procs"},
        {{"--connect", p, "--procs", "1"}, 2, "no --procs"},
        {{"--connect", p, "--serve"}, 2, "--serve is the child"},
        {{"--listen", p, "--serve"}, 2, "--serve is the child"},
        {{"--listen", p, "--connect", p}, 2, "one host has one role"},
        {{"--listen", p, "--sizes", "4K"}, 2, "--sizes is the initiator's to choose"},
        {{"--listen", p, "--bidir"}, 2, "--bidir is the initiator's to choose"},
        {{"--listen", p, "--batch", "2"}, 2, "--batch is the initiator's to choose"},
        {{"--listen", p, "--concurrency", "2"}, 2, "--concurrency is the initiator's to choose"},
        {{"--listen", p, "--kv"}, 2, "--kv is the initiator's to choose"},
        {{"--listen", p, "--kv-pool", "1G"}, 2, "--kv-pool is the initiator's to choose"},
        {{"--listen", p, "--time", "1"}, 2, "--time is the initiator's to choose"},
        {{"--listen", p, "--iters", "3"}, 2, "--iters is the initiator's to choose"},
        {{"--listen", p, "--stats"}, 2, "--stats is the initiator's to choose"},
        {{"--listen", p, "--no-baseline"}, 2, "--no-baseline is the initiator's to choose"},
        {{"--listen", p, "--connect-timeout", "5"},
         2,
         "--connect-timeout is the initiator's to choose"},
        {{"--sizes", "4294967296G", "--batch", "4"}, 1, "more than 16 GiB of memory per side"},
        {{"--sizes", "1..4294967296G", "--procs", "1"}, 1, "more than 16 GiB of memory per side"},
        {{"--pairs", "2", "--peers", "2", "--sizes", "4K"}, 2, "--pairs and --peers"},
        {{"--gpus", "all", "--sizes", "4K"}, 1, "--gpus all: one endpoint pair per GPU"},
        {{"--pairs", "2", "--mem", "vram", "--sizes", "4K"}, 1, "--pairs: host memory"},
        {{"--bidir", "--kv", "--sizes", "4K"}, 1, "--kv: one direction"},
    };
    for (const Case& c : cases) {
        std::vector<std::string> args = {"bench", "engine"};
        args.insert(args.end(), c.args.begin(), c.args.end());
        std::string what;
        for (const auto& a : c.args) what += a + " ";
        SCOPED_TRACE(what);
        const CliResult r = run_cli(args);
        EXPECT_TRUE(exited_with(r, c.code));
        EXPECT_TRUE(contains(r.output, c.says)) << r.output;
    }
}

TEST(BenchEngineRoles, PerGpuWithoutGpuIsAClearError) {
    if (cuda::device_count() > 0) GTEST_SKIP() << "a GPU is usable here";
    const CliResult r = run_cli(
        {"bench", "engine", "--mem", "vram", "--gpus", "all", "--sizes", "4K", "--no-progress"});
    EXPECT_TRUE(exited_with(r, 1));
    EXPECT_TRUE(contains(r.output, "--gpus all: ")) << r.output;
    EXPECT_TRUE(contains(r.output, "no usable GPU") || contains(r.output, "no CUDA support"))
        << r.output;
}

}  // namespace
}  // namespace tcpx
