#pragma once

#include <cstdint>

namespace tcpx {

// A uniformly random 64-bit value from the kernel's CSPRNG (getrandom). Used for keys and nonces
// that a stray or stale peer must not be able to guess or collide with.
uint64_t random_u64();

}  // namespace tcpx
