// `tcpx-p2p bench unpack`: the unpack kernel against cudaMemcpy device-to-device of the same
// bytes, in the same run (built with the CUDA parts); then the inline path's small synchronous
// copies through a pinned buffer against the same copies of pageable memory.
#pragma once

namespace tcpx::bench {

struct UnpackBenchOptions {
    int iters = 200;
    bool json = false;
};

int run_unpack_bench(const UnpackBenchOptions& options);

}  // namespace tcpx::bench
