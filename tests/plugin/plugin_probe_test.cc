// The plugin probe: a plugin whose init exits, crashes or hangs is tried in a child process first,
// so loading it is an error that says what happened, and this process lives on.
#include "net/plugin/plugin_probe.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <string>

#include "net/plugin/plugin_loader.h"
#include "tests/plugin/plugin_test_util.h"
#include "tests/support/net_test_util.h"

#ifndef TCPX_FAKE_TCPX_PATH
#error "TCPX_FAKE_TCPX_PATH must point at libnccl-net-faketcpx.so"
#endif

namespace tcpx::testing {
namespace {

Settings probe_settings() {
    auto settings = Settings::from_env();
    EXPECT_TRUE(settings.ok()) << settings.status().to_string();
    Settings s = settings.ok() ? *settings : Settings{};
    EXPECT_FALSE(s.plugin_probe_path.empty()) << "TCPX_P2P_PLUGIN_PROBE_PATH is set by CTest";
    s.plugin_probe = "on";
    return s;
}

// The error names the plugin and shows its last lines (the last ten of its twelve).
void expect_names_plugin_and_tail(const Status& st, const std::string& path) {
    const std::string msg = st.to_string();
    EXPECT_NE(msg.find(path), std::string::npos) << msg;
    EXPECT_NE(msg.find("crash-net: step 11 of init"), std::string::npos) << msg;
    EXPECT_NE(msg.find("crash-net: step 2 of init"), std::string::npos) << msg;
    EXPECT_EQ(msg.find("crash-net: step 1 of init"), std::string::npos) << msg;
}

TEST(PluginProbe, InitThatExitsIsAnError) {
    const std::string path = test_net_path("crashexit");
    auto net = net::load_net_plugin(path, probe_settings());
    ASSERT_FALSE(net.ok());
    EXPECT_EQ(net.status().code(), StatusCode::kUnavailable);
    EXPECT_NE(net.status().message().find("exited with code 1"), std::string::npos)
        << net.status().to_string();
    expect_names_plugin_and_tail(net.status(), path);
    // The verdict is kept: the plugin is not tried again, nor loaded here.
    auto again = net::load_net_plugin(path, probe_settings());
    ASSERT_FALSE(again.ok());
    EXPECT_EQ(again.status().to_string(), net.status().to_string());
}

// A plugin whose init calls exit(0), as if all were well: the probe never finished its checks
// (its last line is missing), so the plugin is not loaded here (it would end the application).
TEST(PluginProbe, InitThatExitsWithZeroIsAnError) {
    const std::string path = test_net_path("crashexitzero");
    auto net = net::load_net_plugin(path, probe_settings());
    ASSERT_FALSE(net.ok());
    EXPECT_EQ(net.status().code(), StatusCode::kUnavailable);
    EXPECT_NE(net.status().message().find("before the probe was done"), std::string::npos)
        << net.status().to_string();
    expect_names_plugin_and_tail(net.status(), path);
}

TEST(PluginProbe, InitThatCrashesIsAnError) {
    const std::string path = test_net_path("crashsegv");
    auto net = net::load_net_plugin(path, probe_settings());
    ASSERT_FALSE(net.ok());
    const std::string msg = net.status().to_string();
    // Under the sanitizers the probe reports the fault itself (UndefinedBehaviorSanitizer's
    // null store, or AddressSanitizer's SEGV) and exits non-zero.
    EXPECT_TRUE(msg.find("signal 11") != std::string::npos ||
                (msg.find("exited with code") != std::string::npos &&
                 (msg.find("Sanitizer") != std::string::npos ||
                  msg.find("runtime error") != std::string::npos)))
        << msg;
    EXPECT_NE(msg.find(path), std::string::npos) << msg;
    if (msg.find("signal 11") != std::string::npos)
        expect_names_plugin_and_tail(net.status(), path);
}

TEST(PluginProbe, InitThatHangsIsKilledAfterTheTimeout) {
    const std::string path = test_net_path("crashhang");
    Settings s = probe_settings();
    // Long enough for the probe to start and the plugin to print its lines before it hangs:
    // with 300 ms, a probe under AddressSanitizer on CI's loaded machine was killed before it
    // had printed anything.
    s.plugin_probe_timeout_ms = 2000;
    auto net = net::load_net_plugin(path, s);
    ASSERT_FALSE(net.ok());
    const std::string msg = net.status().to_string();
    EXPECT_NE(msg.find("did not finish within 2000 ms"), std::string::npos) << msg;
    EXPECT_NE(msg.find("killed"), std::string::npos) << msg;
    expect_names_plugin_and_tail(net.status(), path);
}

TEST(PluginProbe, EmulatedTcpxPassesAndLoads) {
    set_socket_env(loopback_settings());
    setenv("FAKETCPX_MEMORY", "host", 1);
    Settings s = probe_settings();
    auto out = net::run_plugin_probe(s.plugin_probe_path, TCPX_FAKE_TCPX_PATH, 60000);
    ASSERT_TRUE(out.ok()) << out.status().to_string();
    EXPECT_NE(out->find("table GPUDirectTCPX_v7_emulated, ncclNet v7, 1 devices"),
              std::string::npos)
        << *out;
    EXPECT_NE(out->find("maxRecvs 1, device type 1 v7"), std::string::npos) << *out;
    auto net = net::load_net_plugin(TCPX_FAKE_TCPX_PATH, s);
    ASSERT_TRUE(net.ok()) << net.status().to_string();
    EXPECT_EQ((*net)->name(), "GPUDirectTCPX_v7_emulated");
}

TEST(PluginProbe, CleanRefusalsAreReportedByTheLoaderAsBefore) {
    // No table: the probe refuses cleanly, and the in-process load says why, as without it.
    auto net = net::load_net_plugin(test_net_path("testnone"), probe_settings());
    ASSERT_FALSE(net.ok());
    EXPECT_EQ(net.status().code(), StatusCode::kUnimplemented) << net.status().to_string();
}

TEST(PluginProbe, AMissingProbeIsAnErrorSayingWhatToSet) {
    Settings s = probe_settings();
    s.plugin_probe_path = "/nonexistent/tcpx-p2p-probe";
    // The same plugin under a path no other test has probed: a process keeps each path's
    // verdict, and run whole, this binary's earlier tests probed it under its own.
    std::string path = test_net_path("crashexit");
    path.insert(path.rfind('/'), "/.");
    auto net = net::load_net_plugin(path, s);
    ASSERT_FALSE(net.ok());
    EXPECT_NE(net.status().message().find("TCPX_P2P_PLUGIN_PROBE_PATH"), std::string::npos)
        << net.status().to_string();
    auto found = net::find_plugin_probe(s);
    EXPECT_FALSE(found.ok());
    // Not set, nor on PATH: found in ../libexec from this program (<build>/tests), where the
    // build puts it as an installation does.
    s.plugin_probe_path.clear();
    unsetenv("PATH");
    found = net::find_plugin_probe(s);
    ASSERT_TRUE(found.ok()) << found.status().to_string();
    EXPECT_NE(found->find("/tests/../libexec/tcpx-p2p-probe"), std::string::npos) << *found;
}

}  // namespace
}  // namespace tcpx::testing
