// The layout of Google's GPUDirect-TCPX plugin's request (its work_queue.h, plugin v3.1.x),
// shared/reference/ncclnet-v7.md. A caller outside NCCL learns from it which unpack slot
// describes a completed CUDA receive: NCCL itself takes the slot from its own head counter, which
// only matches the plugin's while every receive of the comm is a CUDA one. Only the prefix up to
// the unpack slot is needed; the emulated plugin (tests/fakes) lays its requests out the same way.
#pragma once

#include <cstddef>
#include <cstdint>

namespace tcpx::net::google_tcpx {

inline constexpr int kQueueDepth = 16;  // unpack slots per receive comm

struct UnpackSlot {
    bool active;    // the request holds a slot of the comm's unpack queue
    uint64_t idx;   // that slot: UnpackMeta::mem[idx], cnt[idx]
    void* mem;      // host address of mem[idx]
    uint64_t* cnt;  // host address of cnt[idx]
    uint64_t cnt_cache;
    size_t* fds_cnt;
    size_t* pgtok_cnts;
    int* fds;
    void* pgtoks;
};

struct Request {
    void* comm;
    void* data;
    int op;
    int mem_type;
    int next_sock_id;
    int next_size;
    int offset;
    int size;
    int size_pending;
    int gpu_mem_fd;
    int gpu_mem_off;
    UnpackSlot unpack_slot;
};

// As the reference gives them (x86-64).
static_assert(offsetof(Request, size) == 36);
static_assert(offsetof(Request, unpack_slot) == 56);
static_assert(offsetof(UnpackSlot, idx) == 8);
static_assert(offsetof(UnpackSlot, cnt) == 24);
static_assert(sizeof(Request) == 56 + 72);

}  // namespace tcpx::net::google_tcpx
