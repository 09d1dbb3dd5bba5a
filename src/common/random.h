#pragma once

#include <cstdint>

#include "tcpx/status.h"

namespace tcpx {

// A uniformly random 64-bit value from the kernel's CSPRNG (getrandom). Used for keys and nonces
// that a stray or stale peer must not be able to guess or collide with, so it fails closed: where
// getrandom does not work (a seccomp filter, a kernel older than 3.17) it is an error, never a
// guessable value.
StatusOr<uint64_t> random_u64();

}  // namespace tcpx
