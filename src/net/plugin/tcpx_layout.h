// The layout of Google's GPUDirect-TCPX plugin's request (its work_queue.h, plugin v3.1.x),
// shared/reference/ncclnet-v7.md. A caller outside NCCL learns from it which unpack slot
// describes a completed CUDA receive: NCCL itself takes the slot from its own head counter, which
// only matches the plugin's while every receive of the comm is a CUDA one. Only the prefix up to
// the unpack slot is needed; the emulated plugin (tests/fakes) lays its requests out the same way.
//
// Also the plugin's listen handle (its common.h), which a peer sends us and the plugin's connect()
// then trusts: V7Net::check_peer_handle reads it before connect() ever sees it.
#pragma once

#include <netinet/in.h>
#include <sys/socket.h>

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

// The plugin's union socketAddress: whichever of the three the family says.
union SocketAddress {
    sockaddr sa;
    sockaddr_in sin;
    sockaddr_in6 sin6;
};

inline constexpr int kMaxSockets = 8;   // data sockets per comm (its MAX_SOCKETS)
inline constexpr int kMaxThreads = 16;  // helper threads per comm (its MAX_THREADS)

// Filled in by listen(), sent to the peer, given to the peer's connect(). The data sockets go to
// connect_addr (its port is the listener's); the control socket to ctrl_addr (a copy of
// connect_addr, or the control interface's address when redirect_ctrl). connect_args is
// connect()'s own state: null on the first call, then a pointer to what the plugin allocated,
// which later calls dereference and the plugin frees. port_start / port_count are unused (-1).
struct Handle {
    SocketAddress connect_addr;
    int port_start;
    int port_count;
    int num_socks;
    int num_threads;
    bool redirect_ctrl;
    SocketAddress ctrl_addr;
    void* connect_args;
};

static_assert(sizeof(SocketAddress) == 28);
static_assert(offsetof(Handle, port_start) == 28);
static_assert(offsetof(Handle, num_socks) == 36);
static_assert(offsetof(Handle, num_threads) == 40);
static_assert(offsetof(Handle, redirect_ctrl) == 44);
static_assert(offsetof(Handle, ctrl_addr) == 48);
static_assert(offsetof(Handle, connect_args) == 80);
static_assert(sizeof(Handle) == 88);

}  // namespace tcpx::net::google_tcpx
