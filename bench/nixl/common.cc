#include "bench/nixl/common.h"

#include <algorithm>

#include "bench/harness/roles.h"
#include "common/status_util.h"

namespace tcpx::bench::nixl_bench {

const char* op_name(Op op) { return op == Op::kWrite ? "WRITE" : "READ"; }

nixl_xfer_op_t nixl_op(Op op) { return op == Op::kWrite ? NIXL_WRITE : NIXL_READ; }

const char* mem_name(const Options& o) { return o.vram ? "VRAM" : "DRAM"; }

Status from_nixl(nixl_status_t st, const std::string& what) {
    if (st == NIXL_SUCCESS) return Status();
    return internal_error(what + ": " + nixlEnumStrings::statusStr(st));
}

int depth_for(const Options& o, uint64_t size) {
    const uint64_t request = size * static_cast<uint64_t>(o.batch);
    const uint64_t fit = std::max<uint64_t>(1, o.max_memory / std::max<uint64_t>(request, 1));
    return static_cast<int>(std::min<uint64_t>(static_cast<uint64_t>(o.depth), fit));
}

uint64_t region_bytes(const Options& o) {
    uint64_t bytes = 0;
    for (uint64_t size : o.sizes) {
        bytes = std::max(bytes, size * static_cast<uint64_t>(o.batch) *
                                    static_cast<uint64_t>(depth_for(o, size)));
    }
    return bytes;
}

int side_timeout_ms(const Options& o) {
    return std::max(reply_timeout_ms(o.min_seconds),
                    static_cast<int>((o.stall_seconds + 60) * 1000));
}

}  // namespace tcpx::bench::nixl_bench
