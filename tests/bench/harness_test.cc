// The benchmark harness (bench/harness) without sockets: sizes, the command channel and the
// responder's loop on a thread, patterns, measurements, the in-flight window, the report.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "bench/harness/measure.h"
#include "bench/harness/memory.h"
#include "bench/harness/raw_tcp.h"
#include "bench/harness/report.h"
#include "bench/harness/roles.h"
#include "bench/nixl/greeting_params.h"
#include "common/status_util.h"
#include "common/strings.h"

namespace tcpx::bench {
namespace {

TEST(BenchSizes, ListsAndRanges) {
    std::vector<uint64_t> v;
    ASSERT_TRUE(parse_size_list("4K,64K,1M", &v));
    EXPECT_EQ(v, (std::vector<uint64_t>{4096, 65536, 1 << 20}));
    ASSERT_TRUE(parse_size_list("4K..64K", &v));
    EXPECT_EQ(v, (std::vector<uint64_t>{4096, 16384, 65536}));
    ASSERT_TRUE(parse_size_list("4K..8K, 1M", &v));
    EXPECT_EQ(v, (std::vector<uint64_t>{4096, 1 << 20}));
    for (const char* bad : {"", "foo", "0..4K", "64K..4K", "4K..x"}) {
        EXPECT_FALSE(parse_size_list(bad, &v)) << bad;
    }
}

// A range whose next size would pass 2^64 ends at its last size that fits (s *= 4 wrapped to 0
// once, and the loop never ended); a list is at most kMaxSizes long.
TEST(BenchSizes, RangesEndBeforeTheyWrapAndListsAreBounded) {
    std::vector<uint64_t> v;
    ASSERT_TRUE(parse_size_list("1..4294967296G", &v));  // 1 to 2^62
    ASSERT_EQ(v.size(), 32u);
    EXPECT_EQ(v.front(), 1u);
    EXPECT_EQ(v.back(), 1ULL << 62);
    ASSERT_TRUE(parse_size_list("3..17179869183G", &v));  // the largest size: 2^64 - 2^30
    EXPECT_EQ(v.back(), 3ULL << 62);
    for (uint64_t s : v) EXPECT_GT(s, 0u);
    std::string many = "1";
    for (size_t i = 1; i < kMaxSizes; ++i) many += "," + std::to_string(i + 1);
    ASSERT_TRUE(parse_size_list(many, &v));
    EXPECT_EQ(v.size(), kMaxSizes);
    EXPECT_FALSE(parse_size_list(many + ",4K", &v));
    EXPECT_FALSE(parse_size_list(many + ",1..4K", &v));
}

TEST(BenchSizes, GpuPairs) {
    std::vector<int> g;
    ASSERT_TRUE(parse_gpu_pair("0,1", &g));
    EXPECT_EQ(g, (std::vector<int>{0, 1}));
    ASSERT_TRUE(parse_gpu_pair(" 2 , 3 ", &g));
    EXPECT_EQ(g, (std::vector<int>{2, 3}));
    for (const char* bad : {"1", "a,b", "-1,0", "0,1024", "0,", ",1", "1,2,3"}) {
        EXPECT_FALSE(parse_gpu_pair(bad, &g)) << bad;
    }
}

TEST(BenchRoles, WordsAndHex) {
    EXPECT_EQ(words("  a bb\tccc  "), (std::vector<std::string>{"a", "bb", "ccc"}));
    EXPECT_TRUE(words("   ").empty());
    const std::string bytes("\0\x01\xff\n binary", 10);
    std::string back;
    ASSERT_TRUE(unhex_blob(hex_blob(bytes), &back));
    EXPECT_EQ(back, bytes);
    EXPECT_FALSE(unhex_blob("zz", &back));
    EXPECT_FALSE(unhex_blob("abc", &back));
}

// Numbers of commands and replies: whole words of digits within their bound. std::stoull took
// "-1" as 2^64 - 1 and "12abc" as 12, and threw past 2^64.
TEST(BenchRoles, NumbersAreWholeWordsWithinTheirBounds) {
    uint64_t u = 7;
    EXPECT_TRUE(parse_uint("0", 10, &u));
    EXPECT_EQ(u, 0u);
    EXPECT_TRUE(parse_uint("18446744073709551615", UINT64_MAX, &u));
    EXPECT_EQ(u, UINT64_MAX);
    for (const char* bad : {"", "-1", "+1", " 1", "1 ", "12abc", "0x10", "1.5", "11",
                            "18446744073709551616", "99999999999999999999"}) {
        u = 7;
        EXPECT_FALSE(parse_uint(bad, bad == std::string("11") ? 10 : UINT64_MAX, &u)) << bad;
        EXPECT_EQ(u, 7u) << bad;
    }
    int i = 0;
    EXPECT_TRUE(parse_int("-5", -10, 10, &i));
    EXPECT_EQ(i, -5);
    for (const char* bad : {"-5x", "-11", "11", "2147483648", "-", "--1"}) {
        EXPECT_FALSE(parse_int(bad, -10, 10, &i)) << bad;
    }
    EXPECT_FALSE(parse_int("-1", 0, 10, &i));
    double d = 0;
    EXPECT_TRUE(parse_seconds("0.25", &d));
    EXPECT_EQ(d, 0.25);
    EXPECT_TRUE(parse_seconds("1e-3", &d));
    EXPECT_EQ(d, 1e-3);
    for (const char* bad : {"", "x", "-1", "1.5s", "nan", "inf", "1e999", " 1"}) {
        EXPECT_FALSE(parse_seconds(bad, &d)) << bad;
    }
}

TEST(BenchRoles, FdChannelLinesAndLimits) {
    int fds[2];
    ASSERT_EQ(::pipe(fds), 0);
    {
        FdChannel ch(fds[0], fds[1], 100);
        ASSERT_TRUE(ch.write_line("one"));
        ASSERT_TRUE(ch.write_line("two words"));
        std::string line;
        ASSERT_TRUE(ch.read_line(&line));
        EXPECT_EQ(line, "one");
        ASSERT_TRUE(ch.read_line(&line));
        EXPECT_EQ(line, "two words");
        // Nothing more comes: the timeout ends the wait, and says so.
        EXPECT_FALSE(ch.read_line(&line));
        EXPECT_NE(ch.why().find("no answer"), std::string::npos) << ch.why();
    }
    ::close(fds[0]);
    ::close(fds[1]);
}

TEST(BenchRoles, FdChannelRefusesAnEndlessLine) {
    ::signal(SIGPIPE, SIG_IGN);  // the writer's last write meets a closed pipe
    int fds[2];
    ASSERT_EQ(::pipe(fds), 0);
    std::thread writer([fd = fds[1]] {
        const std::string chunk(64 * 1024, 'x');
        for (size_t sent = 0; sent <= kMaxLineBytes + chunk.size(); sent += chunk.size()) {
            if (::write(fd, chunk.data(), chunk.size()) <= 0) break;
        }
    });
    FdChannel ch(fds[0], fds[0], 2000);
    std::string line;
    EXPECT_FALSE(ch.read_line(&line));
    EXPECT_NE(ch.why().find("longer than"), std::string::npos) << ch.why();
    ::close(fds[0]);  // the writer's next write fails
    writer.join();
    ::close(fds[1]);
}

// The channel's bound is the whole line's: a peer that sends a byte now and then (never a
// newline) cannot keep a read waiting, nor one that reads a byte now and then a write, for
// longer than the timeout. (Each wait for a byte had the whole timeout once: a byte every 9 s
// held a 10 s greeting for ever.)
TEST(BenchRoles, FdChannelBoundsTheWholeLineNotEachByte) {
    ::signal(SIGPIPE, SIG_IGN);
    int fds[2];
    ASSERT_EQ(::pipe(fds), 0);
    std::atomic<bool> stop{false};
    // A byte every 20 ms for at most 5 s; then it closes its end.
    std::thread dribbler([&] {
        for (int i = 0; i < 250 && !stop; ++i) {
            if (::write(fds[1], "x", 1) != 1) break;
            std::this_thread::sleep_for(std::chrono::milliseconds(20));
        }
        ::close(fds[1]);
    });
    FdChannel ch(fds[0], fds[0], 300);
    std::string line;
    auto start = std::chrono::steady_clock::now();
    EXPECT_FALSE(ch.read_line(&line));
    EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(3));
    EXPECT_NE(ch.why().find("no whole line in 0.3 s"), std::string::npos) << ch.why();
    stop = true;
    dribbler.join();
    ::close(fds[0]);

    // A 1 MiB line into a pipe (64 KiB) that nobody reads for 5 s.
    ASSERT_EQ(::pipe(fds), 0);
    stop = false;
    std::thread reader([&] {
        for (int i = 0; i < 250 && !stop; ++i) {
            std::this_thread::sleep_for(std::chrono::milliseconds(20));
        }
        char buf[65536];
        while (::read(fds[0], buf, sizeof(buf)) > 0) {
        }
    });
    FdChannel out(-1, fds[1], 300);
    start = std::chrono::steady_clock::now();
    EXPECT_FALSE(out.write_line(std::string(1 << 20, 'y')));
    EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(3));
    stop = true;
    ::close(fds[1]);
    reader.join();
    ::close(fds[0]);
}

// A responder that knows "add A B" and "fail", on a thread, through serve_commands.
class ThreadResponder : public ::testing::Test {
 protected:
    std::atomic<int> closed_{0};
    std::unique_ptr<ThreadPeer> peer_ = std::make_unique<ThreadPeer>([this](Channel* ch) {
        (void)serve_commands(
            ch,
            [](const std::vector<std::string>& w, const std::string& line, std::string* reply) {
                if (w[0] == "add" && w.size() == 3) {
                    *reply = std::to_string(std::stoll(w[1]) + std::stoll(w[2]));
                    return Status();
                }
                if (w[0] == "ok") return Status();
                return invalid_argument("unknown command: " + line);
            },
            [this] { ++closed_; });
    });
};

TEST_F(ThreadResponder, RepliesErrorsAndMalformedNumbers) {
    auto r = peer_->call("add 2 40");
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    EXPECT_EQ(*r, "42");
    r = peer_->call("ok");
    ASSERT_TRUE(r.ok());
    EXPECT_EQ(*r, "ok");
    r = peer_->call("nonsense here");
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.status().message().find("unknown command: nonsense here"), std::string::npos);
    // std::stoll throws: an error reply, and the responder goes on.
    r = peer_->call("add x 1");
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.status().message().find("malformed command"), std::string::npos);
    EXPECT_TRUE(peer_->call("add 1 1").ok());
    EXPECT_EQ(closed_, 0);
    peer_.reset();  // "quit"
    EXPECT_EQ(closed_, 1);
}

TEST(BenchRoles, RefusedCommandsSayWhy) {
    ThreadPeer peer([](Channel* ch) { refuse_commands(ch, unavailable("no engine here")); });
    for (const char* cmd : {"endpoints 1", "cpu"}) {
        auto r = peer.call(cmd);
        ASSERT_FALSE(r.ok());
        EXPECT_NE(r.status().message().find("no engine here"), std::string::npos);
    }
}

// Work between commands (IdleWork): it runs while no command comes, not while one is served,
// and not at all while every_ms says -1.
TEST(BenchRoles, IdleWorkRunsBetweenCommands) {
    std::atomic<int> runs{0};
    std::atomic<bool> working{true};
    IdleWork idle;
    idle.every_ms = [&] { return working ? 1 : -1; };
    idle.run = [&] { ++runs; };
    ThreadPeer peer([&](Channel* ch) {
        (void)serve_commands(
            ch,
            [&](const std::vector<std::string>& w, const std::string&, std::string* reply) {
                if (w[0] == "runs") *reply = std::to_string(runs.load());
                if (w[0] == "stop") working = false;
                return Status();
            },
            [] {}, &idle);
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    auto r = peer.call("runs");
    ASSERT_TRUE(r.ok());
    EXPECT_GT(std::stoi(*r), 5);  // about one a millisecond while it waited
    ASSERT_TRUE(peer.call("stop").ok());
    const int stopped = runs.load();
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
    EXPECT_LE(runs.load(), stopped + 1);  // at most the one before the wait that saw -1
    EXPECT_TRUE(peer.call("runs").ok());
}

TEST(BenchRoles, FdChannelWaitInputAndItsTimeout) {
    int fds[2];
    ASSERT_EQ(::pipe(fds), 0);
    {
        FdChannel ch(fds[0], fds[1], 200);
        EXPECT_FALSE(ch.wait_input(0));
        EXPECT_FALSE(ch.wait_input(10));
        ASSERT_TRUE(ch.write_line("a line"));
        EXPECT_TRUE(ch.wait_input(0));
        std::string line;
        ASSERT_TRUE(ch.read_line(&line));
        EXPECT_EQ(line, "a line");
        // No line for longer than the timeout: wait_input says so, and read_line fails at once.
        std::this_thread::sleep_for(std::chrono::milliseconds(250));
        EXPECT_TRUE(ch.wait_input(0));
        EXPECT_FALSE(ch.read_line(&line));
        EXPECT_NE(ch.why().find("no answer for 0.2 s"), std::string::npos) << ch.why();
    }
    ::close(fds[0]);
    ::close(fds[1]);
}

TEST(BenchRoles, GreetingsRoundTripAndRefuseStrangers) {
    const std::string hello = "hello test-bench 1";
    const std::string line = greeting_line(hello, {{"a", "1"}, {"empty", ""}, {"b", "x,y"}});
    EXPECT_EQ(line, hello + " a=1 b=x,y");
    auto settings = greeting_settings(line, hello, "test bench");
    ASSERT_TRUE(settings.ok()) << settings.status().to_string();
    EXPECT_EQ(*settings,
              (std::vector<std::pair<std::string, std::string>>{{"a", "1"}, {"b", "x,y"}}));
    settings = greeting_settings(hello, hello, "test bench");
    ASSERT_TRUE(settings.ok());
    EXPECT_TRUE(settings->empty());
    for (const std::string& bad :
         {std::string("GET / HTTP/1.0"), hello + "0 a=1", std::string("hello test-bench 2 a=1")}) {
        settings = greeting_settings(bad, hello, "test bench");
        ASSERT_FALSE(settings.ok()) << bad;
        EXPECT_NE(settings.status().message().find("not a test bench initiator of this version"),
                  std::string::npos)
            << settings.status().to_string();
    }
    settings = greeting_settings(hello + " a=1 junk", hello, "test bench");
    ASSERT_FALSE(settings.ok());
    EXPECT_NE(settings.status().message().find("'junk' is not key=value"), std::string::npos);
}

TEST(BenchRoles, ListenRefusesTheInitiatorsOptions) {
    const std::vector<std::string> initiator_only = {"--sizes", "--json"};
    auto given = [](std::vector<std::string> on_line) {
        return [on_line](const std::string& name) {
            return std::find(on_line.begin(), on_line.end(), name) != on_line.end();
        };
    };
    EXPECT_TRUE(check_initiator_only(initiator_only, given({"--interface"})).ok());
    const Status st = check_initiator_only(initiator_only, given({"--json", "--sizes"}));
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
    // The first of the list that is given, whatever the command line's order.
    EXPECT_EQ(st.message(),
              "--listen: --sizes is the initiator's to choose (give it to --connect)");
}

// tcpx-nixl-bench's greeting comes from the network: a target takes from it only settings that
// shape the transfers. One naming a library or program for the backend to load (NET_PLUGIN,
// PLUGIN_PROBE_PATH: a greeting ran a program of its choosing on the target), a secret, an
// interface, a port, a bound or a fault is the target's own.
TEST(BenchNixlGreeting, OnlyTransferSettingsTravel) {
    using nixl_bench::greeting_param_allowed;
    for (const char* key : {"channels", "nsocks", "chunk_size", "CHUNK_SIZE", "window",
                            "TCPX_P2P_WINDOW", "io_threads", "xfer_inline_busy", "socket_io"}) {
        EXPECT_TRUE(greeting_param_allowed("TCPX", key)) << key;
    }
    for (const char* key :
         {"net_plugin", "NET_PLUGIN", "TCPX_P2P_NET_PLUGIN", "plugin_probe", "plugin_probe_path",
          "auth_secret", "auth_secret_previous", "interface", "socket_ifname", "port", "gpu_index",
          "sysfs_root", "fault", "max_peers", "max_drain_bytes", "log_level", "progress_thread", "",
          "net_plugin\n"}) {
        EXPECT_FALSE(greeting_param_allowed("TCPX", key)) << key;
    }
    EXPECT_TRUE(greeting_param_allowed("UCX", "num_workers"));
    EXPECT_TRUE(greeting_param_allowed("UCX", "num_threads"));
    EXPECT_FALSE(greeting_param_allowed("UCX", "engine_config"));
    EXPECT_FALSE(greeting_param_allowed("UCX", "ucx_devices"));
    EXPECT_FALSE(greeting_param_allowed("POSIX", "channels"));
    EXPECT_FALSE(greeting_param_allowed("tcpx", "channels"));
}

TEST(BenchMemory, PatternsAndPoison) {
    std::vector<uint8_t> buf(1000);
    fill_pattern(buf.data(), buf.size(), pattern_seed(7, 1));
    EXPECT_TRUE(check_pattern(buf.data(), buf.size(), pattern_seed(7, 1), "x").ok());
    // Another run or peer is another pattern.
    EXPECT_FALSE(check_pattern(buf.data(), buf.size(), pattern_seed(7, 2), "x").ok());
    EXPECT_FALSE(check_pattern(buf.data(), buf.size(), pattern_seed(8, 1), "x").ok());
    buf[997] ^= 1;
    Status st = check_pattern(buf.data(), buf.size(), pattern_seed(7, 1), "dst");
    ASSERT_FALSE(st.ok());
    EXPECT_EQ(st.code(), StatusCode::kInternal);
    EXPECT_NE(st.message().find("dst: byte 997 of 1000"), std::string::npos) << st.to_string();
    buf[3] = kPoison;
    st = check_pattern(buf.data(), buf.size(), pattern_seed(7, 1), "dst");
    EXPECT_NE(st.message().find("byte 3 of 1000"), std::string::npos) << st.to_string();
}

TEST(BenchMemory, PrepareAndCheckBytesOfABuffer) {
    auto b = Buffer::allocate(MemType::kHost, 0, 3 * 4096 + 10, 0x5a);
    ASSERT_TRUE(b.ok()) << b.status().to_string();
    EXPECT_EQ(reinterpret_cast<uintptr_t>(b->data()) % 4096, 0u);
    ASSERT_TRUE(prepare_bytes(*b, 100, 5000, /*source=*/true, 99).ok());
    EXPECT_TRUE(check_bytes(*b, 100, 5000, 99, "src").ok());
    ASSERT_TRUE(prepare_bytes(*b, 100, 5000, /*source=*/false, 99).ok());
    Status st = check_bytes(*b, 100, 5000, 99, "dst");
    ASSERT_FALSE(st.ok());
    EXPECT_NE(st.message().find("(never written)"), std::string::npos) << st.to_string();
    EXPECT_EQ(b->data()[99], 0x5a);  // outside the range: untouched
    EXPECT_FALSE(prepare_bytes(*b, b->size() - 1, 2, true, 1).ok());  // past the end
}

// A buffer never allocated has no memory; a view of none of its bytes (as a peer's "prep ... 0"
// command names) runs nothing instead of handing out a null pointer, and one byte is outside it.
TEST(BenchMemory, AnEmptyViewRunsNothing) {
    const Buffer empty;
    bool ran = false;
    const auto mark = [&](uint8_t*) {
        ran = true;
        return Status();
    };
    EXPECT_TRUE(empty.host_view(0, 0, true, true, mark).ok());
    EXPECT_FALSE(ran);
    EXPECT_TRUE(prepare_bytes(empty, 0, 0, /*source=*/false, 1).ok());
    EXPECT_TRUE(check_bytes(empty, 0, 0, 1, "empty").ok());
    EXPECT_FALSE(empty.host_view(0, 1, true, true, mark).ok());
    EXPECT_FALSE(ran);
    auto b = Buffer::allocate(MemType::kHost, -1, 8192, 0);
    ASSERT_TRUE(b.ok()) << b.status().to_string();
    EXPECT_TRUE(b->host_view(8192, 0, true, true, mark).ok());  // at the end, empty
    EXPECT_FALSE(ran);
}

TEST(BenchMeasure, Summarize) {
    std::vector<double> v;
    for (int i = 100; i >= 1; --i) v.push_back(i);
    const Latency l = summarize(v);
    EXPECT_EQ(l.iters, 100u);
    EXPECT_DOUBLE_EQ(l.p50_us, 51);
    EXPECT_DOUBLE_EQ(l.p99_us, 100);
    EXPECT_DOUBLE_EQ(l.mean_us, 50.5);
    EXPECT_EQ(summarize({}).iters, 0u);
}

TEST(BenchMeasure, ThroughputCalibratesAndCountsCpu) {
    Calibration cal;
    cal.min_seconds = 0.01;
    cal.min_iters = 7;
    std::vector<uint64_t> runs;
    double clock = 0;
    auto run = [&](uint64_t count) -> StatusOr<double> {
        runs.push_back(count);
        return static_cast<double>(count) * 1e-6;  // 1 us an iteration
    };
    auto cpu = [&]() -> StatusOr<CpuTimes> {
        clock += 1;
        return CpuTimes{clock, clock / 2};
    };
    auto t = measure_throughput(cal, 1000, run, cpu);
    ASSERT_TRUE(t.ok()) << t.status().to_string();
    ASSERT_GE(runs.size(), 2u);
    EXPECT_EQ(t->iters, runs.back());
    EXPECT_GE(t->iters, 7u);
    EXPECT_NEAR(t->seconds, cal.min_seconds, cal.min_seconds * 0.01);
    EXPECT_NEAR(t->gbps, 1.0, 1e-6);        // 1000 B per us
    EXPECT_DOUBLE_EQ(t->cpu_seconds, 1.5);  // one tick here, half a tick there, per run
    EXPECT_DOUBLE_EQ(t->peer_cpu_seconds, 0.5);
    EXPECT_GT(cpu_per_gb(*t), 0);
    // An error of the run is the measurement's.
    auto failing = [](uint64_t) -> StatusOr<double> { return unavailable("gone"); };
    EXPECT_EQ(measure_throughput(cal, 1000, failing).status().code(), StatusCode::kUnavailable);
}

TEST(BenchMeasure, LatencyWarmsUpThenMeasures) {
    Calibration cal;
    cal.min_seconds = 0.001;
    cal.min_iters = 50;
    std::vector<uint64_t> runs;
    auto run = [&](uint64_t count) -> StatusOr<std::vector<double>> {
        runs.push_back(count);
        return std::vector<double>(count, 10.0);
    };
    auto l = measure_latency(cal, run);
    ASSERT_TRUE(l.ok());
    EXPECT_EQ(runs.front(), 20u);  // the warm-up, not counted
    EXPECT_EQ(l->iters, runs.back());
    EXPECT_GE(l->iters, 100u);  // 1 ms of 10 us
    EXPECT_DOUBLE_EQ(l->p50_us, 10);
}

TEST(BenchMeasure, SweepOverridesMinIters) {
    Calibration cal;
    cal.min_seconds = 0.0001;
    cal.min_iters = 1;
    Progress progress(false, 2);
    Sweep sweep(cal, &progress);
    auto t = sweep.throughput(
        "x", 1, [](uint64_t n) -> StatusOr<double> { return n * 1e-9; }, 5000);
    ASSERT_TRUE(t.ok());
    EXPECT_GE(t->iters, 5000u);
    EXPECT_EQ(sweep.calibration().min_iters, 1u);
}

// A fake transport for run_window: an operation completes on its `polls`th poll.
struct FakeOps {
    int polls = 3;
    std::map<std::pair<size_t, int>, int> pending;  // (lane, slot) -> polls left
    std::vector<std::vector<int>> slots;            // per lane, every slot posted in
    size_t most_in_flight = 0;

    Window window(size_t lanes, uint64_t count, int width, int last_slot) {
        slots.assign(lanes, {});
        Window w;
        w.lanes = lanes;
        w.count = count;
        w.window = width;
        w.last_slot = last_slot;
        w.stall_seconds = 5;
        w.what = "fake";
        w.post = [this](size_t lane, int slot) -> Status {
            if (pending.count({lane, slot})) return internal_error("slot posted twice");
            pending[{lane, slot}] = polls;
            slots[lane].push_back(slot);
            size_t here = 0;
            for (const auto& [k, v] : pending) here += k.first == lane ? 1 : 0;
            most_in_flight = std::max(most_in_flight, here);
            return Status();
        };
        w.done = [this](size_t lane, int slot) -> StatusOr<bool> {
            auto it = pending.find({lane, slot});
            if (it == pending.end()) return internal_error("polled a free slot");
            if (--it->second > 0) return false;
            pending.erase(it);
            return true;
        };
        return w;
    }
};

TEST(BenchMeasure, WindowKeepsSlotsAndTheLastSlot) {
    FakeOps ops;
    auto secs = run_window(ops.window(2, 10, 3, /*last_slot=*/3));
    ASSERT_TRUE(secs.ok()) << secs.status().to_string();
    ASSERT_EQ(secs->size(), 2u);
    EXPECT_EQ(ops.most_in_flight, 3u);
    EXPECT_TRUE(ops.pending.empty());
    for (const auto& lane : ops.slots) {
        ASSERT_EQ(lane.size(), 10u);
        EXPECT_EQ(lane.back(), 3);  // the last one in the extra slot
        for (size_t i = 0; i + 1 < lane.size(); ++i) EXPECT_LT(lane[i], 3);
        EXPECT_EQ((std::vector<int>(lane.begin(), lane.begin() + 3)), (std::vector<int>{0, 1, 2}));
    }
}

TEST(BenchMeasure, WindowRepostsACompletedSlot) {
    FakeOps ops;
    ops.polls = 1;
    auto secs = run_window(ops.window(1, 5, 1, /*last_slot=*/-1));
    ASSERT_TRUE(secs.ok());
    EXPECT_EQ(ops.slots[0], (std::vector<int>{0, 0, 0, 0, 0}));
}

TEST(BenchMeasure, WindowFailsOnAnErrorOrAStall) {
    FakeOps ops;
    Window w = ops.window(1, 4, 2, -1);
    w.done = [](size_t, int) -> StatusOr<bool> { return unavailable("peer gone"); };
    EXPECT_EQ(run_window(w).status().code(), StatusCode::kUnavailable);

    FakeOps stuck;
    w = stuck.window(1, 4, 2, -1);
    w.done = [](size_t, int) -> StatusOr<bool> { return false; };
    w.stall_seconds = 0.05;
    auto st = run_window(w).status();
    EXPECT_EQ(st.code(), StatusCode::kTimeout);
    EXPECT_NE(st.message().find("fake: no transfer completed"), std::string::npos)
        << st.to_string();
}

TEST(BenchRawTcp, StreamSplit) {
    for (uint64_t size : {0ULL, 1ULL, 7ULL, 1000ULL, 65537ULL}) {
        for (int n : {1, 3, 8}) {
            uint64_t next = 0;
            for (int i = 0; i < n; ++i) {
                EXPECT_EQ(stream_offset(size, n, i), next);
                next += stream_share(size, n, i);
                EXPECT_LE(stream_share(size, n, i), size / n + 1);
            }
            EXPECT_EQ(next, size);
        }
    }
}

TEST(BenchRawTcp, RunThreadsReportsAnError) {
    std::atomic<int> ran{0};
    Status st = run_threads(4, [&](int i) -> Status {
        ++ran;
        return i == 2 ? cancelled("thread 2") : Status();
    });
    EXPECT_EQ(ran, 4);
    EXPECT_EQ(st.code(), StatusCode::kCancelled);
}

TEST(BenchReport, Cells) {
    EXPECT_EQ(ratio(3, 2), "1.50x");
    EXPECT_EQ(ratio(0, 2), "-");
    EXPECT_EQ(ratio(1, 0), "-");
    Throughput t;
    EXPECT_EQ(gbps_cell(t), "-");
    EXPECT_EQ(cpu_cell(t), "-");
    t.iters = 3;
    t.gbps = 2;
    t.seconds = 1;
    t.cpu_seconds = 0.5;
    EXPECT_EQ(gbps_cell(t), "2.00");
    t.gbps = 0.0034;  // a slow run shows what it moved, not 0.00
    EXPECT_EQ(gbps_cell(t), "0.0034");
    t.gbps = 0.1;
    EXPECT_EQ(gbps_cell(t), "0.10");
    // One direction's figure of a --bidir run, the same way (a loaded TSan run once printed
    // 0.00 there, and the role test read that as nothing moved).
    EXPECT_EQ(gbps_text(0.0043), "0.0043");
    EXPECT_EQ(gbps_text(12.5), "12.50");
    t.gbps = 2;
    EXPECT_EQ(cpu_cell(t), "0.250");
    EXPECT_EQ(usecs_cell(12.34, 1), "12.3 us");
    EXPECT_EQ(usecs_cell(12.34, 0), "-");
    EXPECT_STREQ(plural(1), "");
    EXPECT_STREQ(plural(2), "s");
}

TEST(BenchReport, TableAlignsAndTrims) {
    struct R {
        std::string name;
        double v;
    };
    const std::vector<Column<R>> cols = {
        {0, -6, "name", [](const R& r) { return r.name; }},
        {1, 7, "value", [](const R& r) { return strformat("%.1f", r.v); }},
        {2, -5, "note", [](const R& r) { return r.v > 1 ? std::string("big") : std::string(); }},
    };
    EXPECT_EQ(table_head(cols), "name     value  note");
    EXPECT_EQ(table_row(cols, R{"a", 2.5}), "a          2.5  big");
    EXPECT_EQ(table_row(cols, R{"bb", 0.5}), "bb         0.5");  // no trailing blanks
}

// Text from a peer or the environment: control characters are shown, not sent to the terminal,
// and JSON of bytes that are not UTF-8 is written (nlohmann::json's dump() throws on them).
TEST(BenchReport, PeerTextIsPrintableAndJsonNeverThrows) {
    EXPECT_EQ(printable("=lo, 1 channel"), "=lo, 1 channel");
    EXPECT_EQ(printable(std::string("a\x1b[2Jb\r\n\x7f\0", 10)), "a\\x1b[2Jb\\x0d\\x0a\\x7f\\x00");
    EXPECT_EQ(printable("caf\xc3\xa9"), "caf\xc3\xa9");  // UTF-8 stays
    // ... but not C1 controls written as UTF-8 (C2 9B is CSI), nor a lone C2 at the end.
    EXPECT_EQ(printable("a\xc2\x9b"
                        "2Jb\xc2\xa0"
                        "c\xc2"),
              "a\\xc2\\x9b2Jb\xc2\xa0"
              "c\xc2");
    const nlohmann::json j = {{"target", "=lo \xff\xfe"}};
    std::string text;
    ASSERT_NO_THROW(text = json_text(j));
    EXPECT_EQ(text, "{\"target\":\"=lo \xef\xbf\xbd\xef\xbf\xbd\"}");
    ASSERT_NO_THROW(text = json_text(j, 2));
    EXPECT_NE(text.find("\n  \"target\""), std::string::npos) << text;
}

TEST(BenchReport, Json) {
    Throughput t;
    t.gbps = 2;
    t.seconds = 1;
    t.iters = 4;
    t.cpu_seconds = 1;
    auto j = throughput_json(t, "transfers", 8);
    EXPECT_EQ(j["transfers"], 8);
    EXPECT_EQ(j["gbps"], 2.0);
    EXPECT_TRUE(j.contains("cpu_s_per_gb"));
    EXPECT_TRUE(j.contains("cpu_seconds_target_process"));
    auto plain = throughput_json(t, "iters", 4, /*cpu=*/false);
    EXPECT_EQ(plain.size(), 3u);
    Latency l{1, 2, 3, 4};
    EXPECT_EQ(latency_json(l),
              (nlohmann::json{{"p50_us", 1.0}, {"p99_us", 2.0}, {"mean_us", 3.0}, {"iters", 4}}));
}

TEST(BenchReport, ProgressIsSilentWhenOffOrNotATerminal) {
    // Captured, stderr is a file: a progress display asked for stays silent there too, so that
    // logs and --json runs carry no escape sequences.
    for (const bool enabled : {false, true}) {
        testing::internal::CaptureStderr();
        Progress p(enabled, 3);
        p.next("a");
        p.skip(2);
        p.next("b");
        p.clear();
        EXPECT_EQ(testing::internal::GetCapturedStderr(), "") << "enabled: " << enabled;
    }
}

}  // namespace
}  // namespace tcpx::bench
