// splitmix64 (Steele, Lea and Flood): a fast, well-mixed 64-bit value per 64-bit input, for
// patterns that tests and benchmarks write and check, and for the emulated plugin's random page
// choices. Not for anything a peer must not guess: common/random.h is for that.
#pragma once

#include <cstdint>

namespace tcpx {

// What the generator's state advances by per step.
inline constexpr uint64_t kSplitmixGamma = 0x9e3779b97f4a7c15ull;

// The generator's output for state `x` (the next state is x + kSplitmixGamma); as a hash, the
// mixed value of `x`.
constexpr uint64_t splitmix64(uint64_t x) {
    uint64_t z = x + kSplitmixGamma;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

}  // namespace tcpx
