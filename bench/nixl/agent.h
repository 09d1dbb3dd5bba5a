// What each side of tcpx-nixl-bench holds: its registered region (host or GPU memory, with the
// --verify helpers for its request slots), and a NIXL agent holding one backend.
#pragma once

#include <nixl.h>

#include <cstdint>
#include <memory>
#include <string>

#include "bench/harness/memory.h"
#include "bench/nixl/common.h"
#include "tcpx/status.h"

namespace tcpx::bench::nixl_bench {

// One region in DRAM or VRAM (bench::Buffer), with the --verify helpers: slot s of `slot_bytes`
// carries the pattern pattern_seed(run, s).
class Memory {
 public:
    static StatusOr<std::unique_ptr<Memory>> allocate(bool vram, int gpu, uint64_t len);

    uint8_t* data() const { return buf_.data(); }
    uint64_t size() const { return buf_.size(); }
    const Buffer& buffer() const { return buf_; }
    nixl_mem_t segment() const { return gpu_ >= 0 ? VRAM_SEG : DRAM_SEG; }
    uint64_t dev_id() const { return gpu_ >= 0 ? static_cast<uint64_t>(gpu_) : 0; }

    // Fills (pattern) or poisons the first `slots` slots of `slot_bytes`.
    Status prepare(uint64_t run, uint64_t slot_bytes, int slots, bool pattern);

    // OK when every slot holds its pattern; else where the first difference is.
    Status check(uint64_t run, uint64_t slot_bytes, int slots, const std::string& what) const;

 private:
    // OK when `slots` slots of `slot_bytes` lie inside the region (the numbers may come from
    // the other side).
    Status check_range(uint64_t slot_bytes, int slots) const;

    Buffer buf_;
    int gpu_ = -1;
};

// One nixlAgent holding one backend, with NIXL's progress thread as --progress-thread says.
struct Agent {
    std::unique_ptr<nixlAgent> agent;
    nixlBackendH* backend = nullptr;
    nixl_b_params_t params;  // the backend's, after creation
};

// An agent named `name` with `backend` alone, its parameters the plugin's defaults with the
// options' over them (--interface for TCPX, --param); NOT_FOUND when the plugin is missing or
// does not load, UNIMPLEMENTED when it does not take the options' memory.
StatusOr<Agent> create_agent(const std::string& name, const std::string& backend, const Options& o);

// The region as one registration descriptor.
nixl_reg_dlist_t region_dlist(const Memory& m);

}  // namespace tcpx::bench::nixl_bench
