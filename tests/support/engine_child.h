// The other process of multi-process engine tests (tcpx_engine_peer), seen from the test.
#pragma once

#include <chrono>
#include <map>
#include <string>

#include "tcpx/endpoint.h"
#include "tests/support/subprocess.h"

namespace tcpx::testing {

// TCPX_P2P_* settings for a child matching engine_test_config(); `slow` gives it small socket
// buffers, so that a transfer surely is in flight when it is killed.
std::map<std::string, std::string> engine_child_env(bool slow);

std::string unhex(const std::string& hex);

// Reads "<word> <rest>" from the child and returns <rest> (gtest failure otherwise).
std::string expect_line(Subprocess* p, const std::string& word);

// A target endpoint in a child process: one registered region of `bytes`, holding pattern seed 7,
// in host memory or (gpu >= 0) in that GPU's memory.
struct ChildTarget {
    Subprocess proc;
    std::string metadata;
    RemoteMem mem;
    bool start(size_t bytes, bool slow, int gpu = -1,
               const std::map<std::string, std::string>& extra_env = {});
    // Asks the child to check [off, off + len) against pattern `seed`: "ok" or "bad <index>".
    std::string check(uint64_t off, uint64_t len, uint64_t seed);
};

}  // namespace tcpx::testing
