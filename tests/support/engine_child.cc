#include "tests/support/engine_child.h"

#include <gtest/gtest.h>

#include <vector>

#include "common/strings.h"
#include "tests/support/engine_test_util.h"

namespace tcpx::testing {

using namespace std::chrono_literals;

std::map<std::string, std::string> engine_child_env(bool slow) {
    Config c = engine_test_config();
    std::map<std::string, std::string> env = {
        {"TCPX_P2P_SOCKET_IFNAME", c.socket_ifname},
        {"TCPX_P2P_SOCKET_FAMILY", c.socket_family},
        {"TCPX_P2P_NSOCKS", std::to_string(c.nsocks)},
        {"TCPX_P2P_IO_THREADS", "2"},
        {"TCPX_P2P_CHANNELS", std::to_string(c.channels)},
        {"TCPX_P2P_XFER_CHUNK_SIZE", std::to_string(c.xfer_chunk_size)},
        {"TCPX_P2P_PEER_TIMEOUT_MS", "5000"},
        {"TCPX_P2P_LOG_LEVEL", "error"}};
    if (slow) {
        env["TCPX_P2P_SOCKET_SNDBUF"] = "16K";
        env["TCPX_P2P_SOCKET_RCVBUF"] = "16K";
    }
    return env;
}

std::string unhex(const std::string& hex) {
    std::vector<uint8_t> raw;
    EXPECT_TRUE(from_hex(hex, &raw)) << hex;
    return std::string(raw.begin(), raw.end());
}

std::string expect_line(Subprocess* p, const std::string& word) {
    std::string line;
    EXPECT_TRUE(p->read_line(&line, 30s)) << "waiting for '" << word << "'";
    EXPECT_EQ(line.rfind(word, 0), 0u) << line;
    return line.size() > word.size() + 1 ? line.substr(word.size() + 1) : "";
}

bool ChildTarget::start(size_t bytes, bool slow, int gpu,
                        const std::map<std::string, std::string>& extra_env) {
    std::vector<std::string> argv = {TCPX_ENGINE_PEER_PATH, "target", std::to_string(bytes)};
    if (gpu >= 0) argv.push_back(std::to_string(gpu));
    auto env = engine_child_env(slow);
    for (const auto& [k, v] : extra_env) env[k] = v;
    if (!proc.start(argv, env)) return false;
    metadata = unhex(expect_line(&proc, "metadata"));
    auto m = RemoteMem::parse(unhex(expect_line(&proc, "mem")));
    if (!m.ok()) return false;
    mem = *m;
    return true;
}

std::string ChildTarget::check(uint64_t off, uint64_t len, uint64_t seed) {
    proc.write_line(strformat("check %llu %llu %llu", static_cast<unsigned long long>(off),
                              static_cast<unsigned long long>(len),
                              static_cast<unsigned long long>(seed)));
    std::string reply;
    EXPECT_TRUE(proc.read_line(&reply, 30s));
    return reply;
}

}  // namespace tcpx::testing
