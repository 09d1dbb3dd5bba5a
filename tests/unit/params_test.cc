#include "common/params.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <atomic>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>

#include "common/env.h"
#include "common/machine.h"
#include "tests/support/log_capture.h"

#ifndef TCPX_SOURCE_DIR
#error "TCPX_SOURCE_DIR must be defined"
#endif

namespace tcpx {
namespace {

using testing::LogCapture;

// Sets an environment variable for one test.
class ScopedEnv {
 public:
    ScopedEnv(const char* name, const char* value) : name_(name) {
        if (const char* old = getenv(name)) {
            had_ = true;
            old_ = old;
        }
        setenv(name, value, 1);
    }
    ~ScopedEnv() {
        if (had_) {
            setenv(name_.c_str(), old_.c_str(), 1);
        } else {
            unsetenv(name_.c_str());
        }
    }

 private:
    std::string name_;
    bool had_ = false;
    std::string old_;
};

TEST(Params, DefaultsAreValid) {
    Settings s;
    EXPECT_TRUE(s.validate().ok()) << s.validate().to_string();
    EXPECT_EQ(s.nsocks, 0);  // automatic: effective() chooses
    EXPECT_EQ(s.channels, 0);
    EXPECT_EQ(s.io_threads, 0);
    EXPECT_EQ(s.chunk_size, 512u * 1024);
    EXPECT_EQ(s.log_level, "warn");
}

// The automatic values follow the machine's cores, stay in their ranges, and never replace an
// explicit value.
TEST(Params, AutomaticValuesFollowTheCores) {
    struct Want {
        int64_t cores, io_threads, nsocks, channels;
    };
    for (const Want& w : {Want{1, 1, 2, 1}, Want{2, 2, 2, 1}, Want{4, 4, 2, 1}, Want{8, 8, 4, 1},
                          Want{16, 16, 8, 2}, Want{208, 16, 8, 2}, Want{0, 1, 2, 1}}) {
        const Settings s = with_machine_defaults(Settings{}, w.cores);
        EXPECT_EQ(s.io_threads, w.io_threads) << w.cores << " cores";
        EXPECT_EQ(s.nsocks, w.nsocks) << w.cores << " cores";
        EXPECT_EQ(s.channels, w.channels) << w.cores << " cores";
        EXPECT_TRUE(s.validate().ok()) << s.validate().to_string();
    }
    Settings mine;
    mine.io_threads = 3;
    mine.nsocks = 5;
    mine.channels = 7;
    for (int64_t cores : {1, 2, 64}) {
        const Settings s = with_machine_defaults(mine, cores);
        EXPECT_EQ(s.io_threads, 3);
        EXPECT_EQ(s.nsocks, 5);
        EXPECT_EQ(s.channels, 7);
    }
    // A lone WRITE inline: further where the thread making progress does the socket I/O (few
    // cores, whether or not there is a progress thread); a lone READ: 64 KiB. Explicit values
    // stay.
    for (int64_t cores : {2, 4, 16, 208}) {
        for (const char* progress : {"on", "off"}) {
            Settings in;
            in.progress_thread = progress;
            const Settings s = with_machine_defaults(in, cores);
            const bool caller = cores <= 4;  // with or without a progress thread
            EXPECT_EQ(s.socket_io, caller ? "caller" : "threads") << cores << " " << progress;
            EXPECT_EQ(s.xfer_inline_alone, caller ? 256u * 1024 : 64u * 1024)
                << cores << " cores, progress thread " << progress;
            EXPECT_EQ(s.xfer_inline_alone_read, 64u * 1024);
            // Under load too: 64 KiB where one thread does the I/O, 32 KiB with I/O threads.
            EXPECT_EQ(s.xfer_inline_busy, caller ? 64u * 1024 : 32u * 1024)
                << cores << " cores, progress thread " << progress;
            in.xfer_inline_busy = 5000;
            EXPECT_EQ(with_machine_defaults(in, cores).xfer_inline_busy, 5000u);
            in.xfer_inline_alone = 1;
            in.xfer_inline_alone_read = 100000;
            EXPECT_EQ(with_machine_defaults(in, cores).xfer_inline_alone, 1u);
            EXPECT_EQ(with_machine_defaults(in, cores).xfer_inline_alone_read, 100000u);
        }
    }
    Settings threads;
    threads.socket_io = "threads";
    EXPECT_EQ(with_machine_defaults(threads, 2).xfer_inline_alone, 64u * 1024);
    // The progress thread's quiet spin: on past 4 cores, unless set.
    for (int64_t cores : {1, 4, 5, 16, 208}) {
        EXPECT_EQ(with_machine_defaults(Settings{}, cores).progress_quiet_spin,
                  cores > 4 ? "on" : "off")
            << cores << " cores";
        for (const char* set : {"on", "off"}) {
            Settings in;
            in.progress_quiet_spin = set;
            EXPECT_EQ(with_machine_defaults(in, cores).progress_quiet_spin, set);
        }
    }
    // effective() is the rule applied to this process's usable cores.
    const Settings here = Settings{}.effective();
    const Settings rule = with_machine_defaults(Settings{}, usable_cores());
    EXPECT_EQ(here.nsocks, rule.nsocks);
    EXPECT_EQ(here.io_threads, rule.io_threads);
    EXPECT_EQ(here.channels, rule.channels);
    EXPECT_GE(usable_cores(), 1);
}

// The smallest socket chunk: 128 KiB, or the largest chunk where that is smaller (a CHUNK_SIZE
// set alone never contradicts a default the user did not choose); an explicit value stays, and
// one below 4 KiB or above CHUNK_SIZE is an error.
TEST(Params, SmallestChunkIsAutomaticUnlessSet) {
    Settings s;
    EXPECT_EQ(s.min_chunk_size, 0u);
    EXPECT_EQ(with_machine_defaults(s, 32).min_chunk_size, 128u * 1024);
    ASSERT_TRUE(s.set("CHUNK_SIZE", "64K").ok());
    EXPECT_TRUE(s.validate().ok()) << s.validate().to_string();
    EXPECT_EQ(with_machine_defaults(s, 32).min_chunk_size, 64u * 1024);
    ASSERT_TRUE(s.set("MIN_CHUNK_SIZE", "16K").ok());
    EXPECT_TRUE(s.validate().ok());
    EXPECT_EQ(with_machine_defaults(s, 2).min_chunk_size, 16u * 1024);
    ASSERT_TRUE(s.set("MIN_CHUNK_SIZE", "1K").ok());  // in the parameter's range, but not 0
    const Status below = s.validate();
    EXPECT_FALSE(below.ok());
    EXPECT_NE(below.message().find("below 4 KiB"), std::string::npos) << below.to_string();
    ASSERT_TRUE(s.set("MIN_CHUNK_SIZE", "128K").ok());
    EXPECT_FALSE(s.validate().ok());  // above the 64 KiB CHUNK_SIZE
}

TEST(Params, SizesAcceptUnits) {
    uint64_t v = 0;
    ASSERT_TRUE(parse_size("4096", &v));
    EXPECT_EQ(v, 4096u);
    ASSERT_TRUE(parse_size("512K", &v));
    EXPECT_EQ(v, 512u * 1024);
    ASSERT_TRUE(parse_size(" 64MiB ", &v));
    EXPECT_EQ(v, 64u << 20);
    ASSERT_TRUE(parse_size("2g", &v));
    EXPECT_EQ(v, 2ULL << 30);
    EXPECT_FALSE(parse_size("", &v));
    EXPECT_FALSE(parse_size("12 apples", &v));
    EXPECT_FALSE(parse_size("-5", &v));
    EXPECT_FALSE(parse_size("99999999999999999999G", &v));
}

TEST(Params, SetByNameParsesAndChecksRanges) {
    Settings s;
    EXPECT_TRUE(s.set("NSOCKS", "4").ok());
    EXPECT_EQ(s.nsocks, 4);
    EXPECT_TRUE(s.set("TCPX_P2P_NSOCKS", "5").ok());
    EXPECT_EQ(s.nsocks, 5);
    EXPECT_TRUE(s.set("nsocks", "6").ok());
    EXPECT_EQ(s.nsocks, 6);
    Status st = s.set("NSOCKS", "65");
    EXPECT_EQ(st.code(), StatusCode::kOutOfRange);
    EXPECT_NE(st.message().find("TCPX_P2P_NSOCKS"), std::string::npos) << st.to_string();
    EXPECT_EQ(s.nsocks, 6) << "a rejected value must not be stored";
    EXPECT_EQ(s.set("NSOCKS", "four").code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(s.set("NSOCKS", "4x").code(), StatusCode::kInvalidArgument);
    EXPECT_TRUE(s.set("CHUNK_SIZE", "1M").ok());
    EXPECT_EQ(s.chunk_size, 1u << 20);
    EXPECT_FALSE(s.set("CHUNK_SIZE", "1K").ok());
    EXPECT_TRUE(s.set("LOG_LEVEL", "DEBUG").ok());
    EXPECT_EQ(s.log_level, "debug");
    EXPECT_FALSE(s.set("LOG_LEVEL", "loud").ok());
    EXPECT_FALSE(s.set("NO_SUCH_THING", "1").ok());
}

TEST(Params, CrossFieldChecksInValidate) {
    Settings s;
    ASSERT_TRUE(s.set("CHUNK_SIZE", "32K").ok());  // order does not matter...
    ASSERT_TRUE(s.set("MIN_CHUNK_SIZE", "16K").ok());
    EXPECT_TRUE(s.validate().ok());
    ASSERT_TRUE(s.set("MIN_CHUNK_SIZE", "64K").ok());
    EXPECT_FALSE(s.validate().ok());  // ...but the result must be consistent
    Settings t;
    t.nsocks = 1000;  // assigned directly, checked by validate
    EXPECT_FALSE(t.validate().ok());
}

TEST(Params, EnvironmentOverridesAndRejects) {
    {
        ScopedEnv a("TCPX_P2P_NSOCKS", "3");
        ScopedEnv b("TCPX_P2P_SOCKET_IFNAME", "=lo");
        auto s = Settings::from_env();
        ASSERT_TRUE(s.ok()) << s.status().to_string();
        EXPECT_EQ(s->nsocks, 3);
        EXPECT_EQ(s->socket_ifname, "=lo");
    }
    {
        ScopedEnv a("TCPX_P2P_NSOCKS", "lots");
        auto s = Settings::from_env();
        ASSERT_FALSE(s.ok());
        EXPECT_NE(s.status().message().find("TCPX_P2P_NSOCKS"), std::string::npos);
    }
    {
        ScopedEnv a("TCPX_P2P_TYPO_NSOCKS", "3");  // unknown: logged, not an error
        EXPECT_TRUE(Settings::from_env().ok());
    }
}

// A secret variable set to nothing is most likely a secret that failed to load
// (TCPX_P2P_AUTH_SECRET=$(cat a-missing-file)): an error, not "no secret" (authentication off
// without a word). Unset, there is no secret, as before.
TEST(Params, ASecretSetButEmptyIsAnError) {
    for (const char* name : {"TCPX_P2P_AUTH_SECRET", "TCPX_P2P_AUTH_SECRET_PREVIOUS"}) {
        for (const char* value : {"", "   "}) {
            ScopedEnv a(name, value);
            auto s = Settings::from_env();
            ASSERT_FALSE(s.ok()) << name << "='" << value << "'";
            EXPECT_EQ(s.status().code(), StatusCode::kInvalidArgument);
            EXPECT_NE(s.status().message().find("set but empty"), std::string::npos)
                << s.status().to_string();
        }
    }
    auto unset = Settings::from_env();
    ASSERT_TRUE(unset.ok()) << unset.status().to_string();
    EXPECT_TRUE(unset->auth_secret.empty());
    ScopedEnv set("TCPX_P2P_AUTH_SECRET", "0123456789abcdef0123");
    auto s = Settings::from_env();
    ASSERT_TRUE(s.ok()) << s.status().to_string();
    EXPECT_EQ(s->auth_secret, "0123456789abcdef0123");
}

// The same through set() (the C API's tcpx_config_set, a NIXL backend parameter): a blank
// secret is refused, not taken for "no secret" in place of the environment's.
TEST(Params, ASecretSetButBlankThroughSetIsAnError) {
    for (const char* name : {"AUTH_SECRET", "auth_secret", "TCPX_P2P_AUTH_SECRET_PREVIOUS"}) {
        for (const char* value : {"", " ", "\n", " \t "}) {
            Settings s;
            s.auth_secret = "0123456789abcdef0123";
            const Status st = s.set(name, value);
            EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << name << "='" << value << "'";
            EXPECT_NE(st.message().find("set but empty"), std::string::npos) << st.to_string();
            EXPECT_EQ(s.auth_secret, "0123456789abcdef0123");  // left as it was
        }
    }
    Settings s;
    ASSERT_TRUE(s.set("AUTH_SECRET", " 0123456789abcdef0123\n").ok());
    EXPECT_EQ(s.auth_secret, "0123456789abcdef0123");
}

// An unknown variable of ours is most likely a typo: each is named once, not only the first.
TEST(Params, EveryUnknownVariableIsNamedOnce) {
    LogCapture log(LogLevel::kWarn);
    ScopedEnv a("TCPX_P2P_TYPO_ONE_FOR_THIS_TEST", "1");
    ScopedEnv b("TCPX_P2P_TYPO_TWO_FOR_THIS_TEST", "2");
    for (int i = 0; i < 3; ++i) ASSERT_TRUE(Settings::from_env().ok());
    EXPECT_EQ(log.count("TCPX_P2P_TYPO_ONE_FOR_THIS_TEST"), 1) << log.all();
    EXPECT_EQ(log.count("TCPX_P2P_TYPO_TWO_FOR_THIS_TEST"), 1) << log.all();
}

// The library sets variables at run time (Google's plugin's defaults at each load, NCCL_*
// defaults at each NCCL plugin init) while other threads may read the environment: setenv can
// move the environ array and free the old one under a reader walking it. Ours read and write
// under one lock; a sanitizer build catches the reads of freed memory without it.
TEST(Params, TheEnvironmentIsReadWhileAnotherThreadSetsIt) {
    std::atomic<bool> stop{false};
    std::thread writer([&] {
        for (int i = 0; !stop.load(); ++i) {
            const std::string name = "TCPXTEST_CHURN_" + std::to_string(i % 64);
            EXPECT_EQ(env_set(name.c_str(), "x", true), 0);
            if (i % 2 == 0) {
                EXPECT_EQ(env_unset(name.c_str()), 0);
            }
        }
    });
    for (int i = 0; i < 2000; ++i) {
        ASSERT_TRUE(Settings::from_env().ok());
        EXPECT_FALSE(env_get("PATH").value_or("").empty());
    }
    stop = true;
    writer.join();
    for (int i = 0; i < 64; ++i) {
        env_unset(("TCPXTEST_CHURN_" + std::to_string(i)).c_str());
    }
}

// Limits that contradict each other are refused when read, not met as a disconnected peer: a
// notification this endpoint promises to accept must fit in one control message and in the
// room held for notifications.
TEST(Params, ANotificationLimitTheOtherLimitsCannotHoldIsRefused) {
    {
        Settings s;
        ASSERT_TRUE(s.set("MAX_CTRL_MESSAGE", "64K").ok());
        const Status st = s.validate();  // with the 1 MiB notification default
        EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
        EXPECT_NE(st.message().find("MAX_NOTIFICATION_SIZE"), std::string::npos) << st.to_string();
        ASSERT_TRUE(s.set("MAX_NOTIFICATION_SIZE", std::to_string(64 * 1024 - 4)).ok());
        EXPECT_TRUE(s.validate().ok()) << s.validate().to_string();
        ASSERT_TRUE(s.set("MAX_NOTIFICATION_SIZE", std::to_string(64 * 1024 - 3)).ok());
        EXPECT_FALSE(s.validate().ok());
    }
    for (const char* bound :
         {"MAX_QUEUED_NOTIFICATION_BYTES", "MAX_QUEUED_NOTIFICATION_BYTES_TOTAL"}) {
        SCOPED_TRACE(bound);
        Settings s;
        for (const char* value : {"0", "512K"}) {
            ASSERT_TRUE(s.set(bound, value).ok());
            const Status st = s.validate();
            EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << value;
            EXPECT_NE(st.message().find(bound), std::string::npos) << st.to_string();
        }
        ASSERT_TRUE(s.set("MAX_NOTIFICATION_SIZE", "512K").ok());
        EXPECT_TRUE(s.validate().ok()) << s.validate().to_string();
        ASSERT_TRUE(s.set(bound, "0").ok());
        ASSERT_TRUE(s.set("MAX_NOTIFICATION_SIZE", "0").ok());  // no notifications at all
        EXPECT_TRUE(s.validate().ok()) << s.validate().to_string();
    }
    // The same read from the environment.
    ScopedEnv small("TCPX_P2P_MAX_CTRL_MESSAGE", "64K");
    EXPECT_EQ(Settings::from_env().status().code(), StatusCode::kInvalidArgument);
}

// The room all peers' large control messages share must hold one maximal message (and its inline
// allowance past a connection's own buffer), or a peer sending one would wait and then fail.
TEST(Params, ACtrlBufferTotalThatCannotHoldOneMaximalMessageIsRefused) {
    Settings s;
    ASSERT_TRUE(s.set("MAX_CTRL_BUFFER_TOTAL", "64M").ok());  // MAX_CTRL_MESSAGE: 64 MiB
    const Status st = s.validate();
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(st.message().find("MAX_CTRL_BUFFER_TOTAL"), std::string::npos) << st.to_string();
    ASSERT_TRUE(s.set("MAX_CTRL_BUFFER_TOTAL", "65M").ok());
    EXPECT_TRUE(s.validate().ok()) << s.validate().to_string();
    ASSERT_TRUE(s.set("MAX_CTRL_MESSAGE", "16M").ok());
    ASSERT_TRUE(s.set("MAX_CTRL_BUFFER_TOTAL", "17M").ok());
    EXPECT_TRUE(s.validate().ok()) << s.validate().to_string();
    EXPECT_FALSE(s.set("MAX_CTRL_BUFFER_TOTAL", "1M").ok());  // below the table's range
}

// The staging total must hold what one channel may take at once (a gather ring and its GPU twin)
// twice, for a send and a receive, or a chunk could wait for good.
TEST(Params, AStagingTotalBelowOneChannelsNeedIsRefused) {
    Settings s;
    // Defaults: 4 slots of 4 MiB: 2 x ((2 x 4 + 1) x 4 MiB + 16 KiB).
    ASSERT_TRUE(s.set("MAX_STAGING_BYTES_TOTAL", "72M").ok());
    const Status st = s.validate();
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(st.message().find("MAX_STAGING_BYTES_TOTAL"), std::string::npos) << st.to_string();
    ASSERT_TRUE(s.set("MAX_STAGING_BYTES_TOTAL", std::to_string(72 * 1024 * 1024 + 32768)).ok());
    EXPECT_TRUE(s.validate().ok()) << s.validate().to_string();
    // More slots or larger chunks need more.
    ASSERT_TRUE(s.set("STAGING_SLOTS", "8").ok());
    EXPECT_EQ(s.validate().code(), StatusCode::kInvalidArgument);
    ASSERT_TRUE(s.set("STAGING_SLOTS", "2").ok());
    ASSERT_TRUE(s.set("XFER_CHUNK_SIZE", "64K").ok());
    ASSERT_TRUE(s.set("MAX_STAGING_BYTES_TOTAL", std::to_string(2 * (5 * 65536 + 16384))).ok());
    EXPECT_TRUE(s.validate().ok()) << s.validate().to_string();
    ASSERT_TRUE(s.set("MAX_STAGING_BYTES_TOTAL", std::to_string(2 * (5 * 65536 + 16384) - 1)).ok());
    EXPECT_EQ(s.validate().code(), StatusCode::kInvalidArgument);
    EXPECT_FALSE(s.set("MAX_STAGING_BYTES_TOTAL", "32K").ok());  // below the table's range
}

// All peers together may hold at least what one peer may on its own.
TEST(Params, AServedTotalBelowOnePeersShareIsRefused) {
    Settings s;
    ASSERT_TRUE(s.set("MAX_SERVED_PIECES_TOTAL", "4194303").ok());  // MAX_SERVED_PIECES: 4M
    const Status st = s.validate();
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(st.message().find("MAX_SERVED_PIECES_TOTAL"), std::string::npos) << st.to_string();
    ASSERT_TRUE(s.set("MAX_SERVED_PIECES", "4194303").ok());
    EXPECT_TRUE(s.validate().ok()) << s.validate().to_string();
}

TEST(Params, TableIsCompleteAndDocumented) {
    ASSERT_FALSE(param_table().empty());
    for (const ParamInfo& p : param_table()) {
        EXPECT_FALSE(p.doc.empty()) << p.name;
        Settings s;
        // Every default, as documented, parses back through set().
        if (p.type != ParamType::kString || !p.default_text.empty()) {
            std::string def(p.default_text);
            EXPECT_TRUE(s.set(p.name, def).ok()) << p.name << " default '" << def << "'";
        }
    }
}

TEST(Params, DocsTableMatchesTheCode) {
    const std::string path = std::string(TCPX_SOURCE_DIR) + "/docs/configuration.md";
    std::ifstream in(path);
    ASSERT_TRUE(in.good()) << path;
    std::stringstream ss;
    ss << in.rdbuf();
    const std::string doc = ss.str();
    const std::string begin = "<!-- BEGIN PARAMS (generated by `tcpx-p2p params`) -->\n";
    const std::string end = "<!-- END PARAMS -->";
    const size_t b = doc.find(begin);
    const size_t e = doc.find(end);
    ASSERT_NE(b, std::string::npos);
    ASSERT_NE(e, std::string::npos);
    EXPECT_EQ(doc.substr(b + begin.size(), e - b - begin.size()), param_table_markdown())
        << "docs/configuration.md is stale: regenerate its table with `tcpx-p2p params`";
}

}  // namespace
}  // namespace tcpx
