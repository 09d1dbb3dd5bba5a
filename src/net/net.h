// The transport contract: a C++ rendering of ncclNet v7 (shared/reference/ncclnet-v7.md).
//
// Every transport the engine uses implements Net: the built-in socket provider (host memory), an
// external ncclNet plugin loaded by path (Google's GPUDirect-TCPX) and test fakes. Keeping the
// contract exactly v7's means one engine runs over all of them unchanged, and that our own
// provider can be exported as a real ncclNet table (v7_table.h).
//
// Contract, as in v7:
// - Comms are unidirectional. listen() yields a handle (at most 128 bytes) that the other side
//   passes to connect(); accept() on the listening side yields the matching receive comm.
// - connect() and accept() never block: they return OK with a null comm until the connection is
//   ready, and the caller calls again (with the same handle buffer, which connect may modify).
// - isend()/irecv() never block: OK with a null request means "no room now, post again later".
//   On one comm, sends and receives match in posting order. A receive with n > 1 buffers takes the
//   next n sends of the comm, each landing in the buffer whose tag equals the send's tag.
//   A receive buffer may be larger than the send; a smaller one fails that receive.
// - test() polls a request. When it reports done (or returns an error) the request is gone and
//   must not be used again. An error from test() means that request failed.
// - Every receive that test() reported done must be followed by irecv_consumed(), in completion
//   order, once the caller has finished reading the data (Google's TCPX recycles the receive's
//   device pages then). The request pointer serves there as an identifier only.
// - close_*() may be called with requests pending: they are abandoned, their buffers are no longer
//   touched once close returns, and their request pointers become invalid.
// - A Net instance is thread-safe: different comms may be used from different threads at once, and
//   posting and testing on one comm may come from several threads.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "common/socket.h"
#include "common/wakeup.h"
#include "tcpx/status.h"

namespace tcpx::net {

inline constexpr size_t kHandleSize = 128;

// The connection handle produced by listen() and consumed by connect(). Opaque bytes that the
// application carries from one side to the other (out of band).
struct Handle {
    alignas(8) std::array<uint8_t, kHandleSize> bytes{};
};

// Memory kinds (the values of NCCL_PTR_*; `ptr_support` is a mask of them).
enum class MemType : int { kHost = 0x1, kCuda = 0x2, kDmaBuf = 0x4 };

// How received device data is handed over (ncclNetDeviceType).
enum class DeviceType : int { kHost = 0, kUnpack = 1 };

struct Properties {
    std::string name;      // interface name, e.g. "eth1"
    std::string pci_path;  // sysfs path of the NIC's PCI device; empty if unknown
    uint64_t guid = 0;
    int ptr_support = static_cast<int>(MemType::kHost);
    int speed_mbps = 0;
    int port = 0;
    float latency_us = 0;
    int max_comms = 0;
    int max_recvs = 1;  // largest n accepted by irecv
    DeviceType device_type = DeviceType::kHost;
    int device_version = 0;
    // Not in v7's properties: requests in flight per comm before isend/irecv return no request
    // (NCCL assumes 8–32; Google's TCPX allows 16).
    int max_requests = 8;
    // Not in v7: whether test() reports received sizes. Google's TCPX plugin never does, so the
    // engine must know sizes from its own protocol when this is false.
    bool reports_sizes = true;
    // Not in v7: the largest registration reg_mr() takes in one piece; 0 for no limit. v7's
    // regMr takes an int size (and NCCL refuses 2 GiB and more through it), newer tables say
    // their own maxRegSize. The engine registers larger regions as windows of this size.
    uint64_t max_reg_size = 0;
    // Not in v7: whether isendv()/irecvv() take a message as a list of segments (the socket
    // transport writes and reads them with scatter-gather I/O, without a copy).
    bool segments = false;
    // Not in v7: whether close_*() also releases the registrations made with the comm (v7 asks
    // for deregMr first; the socket transport frees them with the comm). Where it does, a comm
    // with requests in flight can be closed at once; elsewhere the engine gives the requests a
    // short grace to finish, so that it can deregister before closing.
    bool close_releases_registrations = false;
    // Not in v7: whether a registration left to its comm's close (requests were still in
    // flight, so it was not deregistered first) can be deregistered after the close, with
    // dereg_mr(nullptr, mhandle). Google's TCPX plugin: its close releases none (each CUDA
    // registration keeps a dma-buf fd and its export) and its deregMr reads only the handle.
    bool dereg_after_close = false;
    // Not in v7: whether a devmem receive's unpack list may leave out bytes the plugin placed in
    // the receive's buffer itself (Google's TCPX plugin does with data the NIC left in host
    // memory, SCM_DEVMEM_HEADER). The engine then gives every receive it unpacks into several
    // pieces room of its own for them from the start, instead of learning it from a receive
    // that had to fail (PLUGIN_PLACES_BYTES).
    bool places_bytes = false;
    // Not in v7: whether GPU registrations count against the process's descriptor budget
    // (common/socket.h: an external plugin's each hold a descriptor, Google's a dma-buf fd),
    // reg_mr() refusing one past it with RESOURCE_EXHAUSTED. The engine then gives up
    // registrations no request uses to make room (least recently used first).
    bool gpu_regs_counted = false;
};

// One segment of a message sent or received with isendv()/irecvv().
struct IoSeg {
    void* data = nullptr;
    size_t size = 0;
};

// What accept()/connect() return for device-side consumption of received data
// (ncclNetDeviceHandle_v7_t).
struct DeviceHandle {
    DeviceType type = DeviceType::kHost;
    int version = 0;
    void* handle = nullptr;  // a device pointer; for UNPACK the unpack handle
    size_t size = 0;
    bool needs_proxy_progress = false;
};

// Where a devmem-TCP receive's pieces are described (cuda/unpack_defs.h): the slot `index` of
// the comm's unpack queue, and the host addresses of its `count` and its list of LoadMeta
// entries. The host reads them once the receive completed: crossing PCIe from the GPU for each
// entry would cost more than the copy itself.
struct UnpackSlot {
    int index = -1;
    const void* entries = nullptr;  // cuda::LoadMeta[count]
    const uint64_t* count = nullptr;
};

// Opaque handles. Each provider casts them to its own types; they are never defined.
struct ListenComm;
struct SendComm;
struct RecvComm;
struct Request;
struct MemHandle;

class Net {
 public:
    virtual ~Net() = default;

    // The provider's name ("socket", or the plugin's name).
    virtual std::string_view name() const = 0;

    virtual int device_count() const = 0;
    virtual Status get_properties(int dev, Properties* props) const = 0;

    virtual Status listen(int dev, Handle* handle, ListenComm** listen_comm) = 0;
    // A handle that arrived from a peer (over the network, so hostile until checked) is checked
    // here before it reaches connect(): its size, address family, address (it must name
    // `peer_address`, the host the peer's control connection came from), socket counts within
    // our own settings; and any part of it that the transport keeps as its own connect() state
    // is reset, so no pointer or key from the wire is ever followed. An empty `peer_address`
    // (an authenticated peer, which may name any address of its host, e.g. a data NIC apart
    // from its control one) skips the address check only. Not OK: the handle must not be used.
    // UNIMPLEMENTED: the transport cannot read its handles (an unknown plugin).
    virtual Status check_peer_handle(Handle* handle, const SocketAddress& peer_address) const {
        (void)handle;
        (void)peer_address;
        return Status(StatusCode::kUnimplemented,
                      "this transport cannot check the connection handles peers send");
    }
    // Non-blocking: *send_comm stays null until connected; call again with the same handle.
    // `dev_handle` may be null when the caller takes no device handle.
    virtual Status connect(int dev, Handle* handle, SendComm** send_comm,
                           DeviceHandle* dev_handle) = 0;
    // The caller gives up on a connect() in progress with `handle` (its peer failed, say): the
    // transport lets go of what it holds for it (sockets, state). The handle is not passed to
    // connect() again. Harmless for a handle with no connect in progress.
    virtual void abandon_connect(Handle* handle) { (void)handle; }
    // Non-blocking: *recv_comm stays null until a connection has arrived and is ready.
    virtual Status accept(ListenComm* listen_comm, RecvComm** recv_comm,
                          DeviceHandle* dev_handle) = 0;

    // `comm` is a SendComm* or RecvComm*. `type` is one MemType.
    virtual Status reg_mr(void* comm, void* data, size_t size, MemType type,
                          MemHandle** mhandle) = 0;
    // `comm` null: a registration whose comm was closed first, where dereg_after_close says so.
    virtual Status dereg_mr(void* comm, MemHandle* mhandle) = 0;
    // A hint on a registration of host memory (made with this comm) that a device reads by DMA
    // as soon as a receive into it completes: the engine's staging of GPU transfers. A transport
    // whose receives are CPU copies may write the received bytes back out of the CPU's caches
    // where it receives them (common/cache_lines.h), so that the device's copy reads memory, not
    // lines it must snoop out of the caches. Transports without such a use ignore it.
    virtual Status hint_device_reads(void* comm, MemHandle* mhandle) { return Status(); }

    // OK with *request == nullptr: too many requests in flight, post again later.
    virtual Status isend(SendComm* comm, const void* data, size_t size, int tag, MemHandle* mhandle,
                         Request** request) = 0;
    virtual Status irecv(RecvComm* comm, int n, void* const* data, const size_t* sizes,
                         const int* tags, MemHandle* const* mhandles, Request** request) = 0;
    // One message made of `segs`, back to back (Properties::segments): a send, or a receive of
    // up to their total into them, in order. The list is copied; the memory must stay until the
    // request completes. Host memory; no registration needed.
    virtual Status isendv(SendComm* comm, std::span<const IoSeg> segs, int tag, Request** request) {
        return Status(StatusCode::kUnimplemented, "this transport takes no segment lists");
    }
    virtual Status irecvv(RecvComm* comm, std::span<const IoSeg> segs, int tag, Request** request) {
        return Status(StatusCode::kUnimplemented, "this transport takes no segment lists");
    }
    // *done set; when done and `sizes` is not null and the provider reports sizes, sizes[i] is the
    // size received into buffer i (the size sent, for a send). An error means the request failed;
    // either way a finished request is released.
    virtual Status test(Request* request, bool* done, size_t* sizes) = 0;
    // The caller is done with the data of completed receive `request` (of `n` buffers); must be
    // called for every completed receive, oldest first.
    virtual Status irecv_consumed(RecvComm* comm, int n, Request* request) = 0;
    // For a receive comm whose device handle is UNPACK, a completed receive into CUDA memory:
    // the slot of the comm's unpack queue that describes where its bytes are, valid from test()
    // reporting it done until irecv_consumed().
    virtual StatusOr<UnpackSlot> unpack_slot(RecvComm* comm, Request* request) {
        return Status(StatusCode::kUnimplemented,
                      "this transport does not hand receives over through unpack queues");
    }

    // Not in v7: a wakeup (common/wakeup.h) that every request of this Net notifies when it
    // finishes, done or failed, so that a caller with requests in flight can sleep on its fd
    // instead of polling test(): arm it, test once more, then sleep until the fd is readable.
    // Null: the transport signals nothing and its requests must be polled (plugins).
    virtual Wakeup* completion_wakeup() { return nullptr; }

    // Not in v7: runs the transport's I/O in the calling thread, for a transport made to have no
    // threads of its own (SocketNet::Io::kInCaller), whose requests then move only while someone
    // calls this; true when it did something. Transports with threads: nothing, false.
    virtual bool progress() { return false; }
    // With progress(): an fd (for epoll) that turns readable when progress() has something to do,
    // for a caller that sleeps between calls; -1 when there is none (a transport with threads).
    virtual int progress_fd() { return -1; }

    virtual Status close_send(SendComm* comm) = 0;
    virtual Status close_recv(RecvComm* comm) = 0;
    virtual Status close_listen(ListenComm* comm) = 0;
};

}  // namespace tcpx::net
