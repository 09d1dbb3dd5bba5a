// What the versioned test plugins (versioned_net.cc) report, for the tests that check the
// loader's conversion of their properties.
#pragma once

#include <cstddef>
#include <cstdint>

namespace tcpx::testing::test_net {

// Plugin of version N: guid kGuidBase + N, speed kSpeedBase + N, maxComms kMaxCommsBase + N,
// port N, latency N / 2; from v9 maxP2pBytes kMaxP2pBytes.
inline constexpr uint64_t kGuidBase = 0x7e57000000ULL;
inline constexpr int kSpeedBase = 10000;
inline constexpr int kMaxCommsBase = 1000;
inline constexpr size_t kMaxP2pBytes = size_t{96} << 20;

}  // namespace tcpx::testing::test_net
