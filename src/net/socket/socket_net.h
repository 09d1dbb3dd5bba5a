// The built-in TCP transport ("socket"): host memory, one control socket plus N data sockets per
// comm, served by a fixed pool of I/O threads. See docs/socket-transport.md for the design and
// wire.h for the protocol.
#pragma once

#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "common/params.h"
#include "common/socket.h"
#include "net/net.h"

namespace tcpx::net {

class IoPool;

// The check of a socket-transport handle that arrived from a peer (Net::check_peer_handle): ours
// (magic, version), 1 to 64 data sockets (connect() opens at most NSOCKS of them), a nonzero
// port, an address on the host of `peer_address` (empty: not checked); connect()'s progress key
// and the unused tail are zeroed. Shared by SocketNet and by V7Net over the socket transport's
// exported table (socket_v7.h).
Status check_socket_handle(Handle* handle, const SocketAddress& peer_address);

class SocketNet final : public Net {
 public:
    // How the sockets' I/O is done: by a pool of IO_THREADS threads, or in the caller's thread,
    // inside progress() (for an endpoint without a progress thread: io_pool.h).
    enum class Io { kThreads, kInCaller };
    // One device per interface selected by settings.socket_ifname / socket_family.
    static StatusOr<std::unique_ptr<SocketNet>> create(const Settings& settings,
                                                       Io io = Io::kThreads);
    ~SocketNet() override;

    std::string_view name() const override { return "socket"; }
    int device_count() const override { return static_cast<int>(devices_.size()); }
    Status get_properties(int dev, Properties* props) const override;

    Status listen(int dev, Handle* handle, ListenComm** listen_comm) override;
    Status check_peer_handle(Handle* handle, const SocketAddress& peer_address) const override;
    Status connect(int dev, Handle* handle, SendComm** send_comm,
                   DeviceHandle* dev_handle) override;
    void abandon_connect(Handle* handle) override;
    Status accept(ListenComm* listen_comm, RecvComm** recv_comm, DeviceHandle* dev_handle) override;

    Status reg_mr(void* comm, void* data, size_t size, MemType type, MemHandle** mhandle) override;
    Status dereg_mr(void* comm, MemHandle* mhandle) override;
    // Receives into the registration are written back out of the CPU's caches as they land
    // (where the CPU can: common/cache_lines.h).
    Status hint_device_reads(void* comm, MemHandle* mhandle) override;
    // dereg_mr for a caller that frees the memory next with requests maybe still pending on it
    // (NCCL's teardown, an abort's: deregMr, free the buffers, then close): a comm with a
    // request pending on memory that shares a byte with the registration fails first, and this
    // returns once no I/O thread can touch it (socket_internal::Comm::drop_memory). The engine
    // deregisters only memory none of its requests uses, and keeps dereg_mr: a request on
    // another registration of the same bytes must not fail its comm.
    Status dereg_mr_failing_pending(void* comm, MemHandle* mhandle);

    Status isend(SendComm* comm, const void* data, size_t size, int tag, MemHandle* mhandle,
                 Request** request) override;
    Status irecv(RecvComm* comm, int n, void* const* data, const size_t* sizes, const int* tags,
                 MemHandle* const* mhandles, Request** request) override;
    Status isendv(SendComm* comm, std::span<const IoSeg> segs, int tag, Request** request) override;
    Status irecvv(RecvComm* comm, std::span<const IoSeg> segs, int tag, Request** request) override;
    Status test(Request* request, bool* done, size_t* sizes) override;
    Status irecv_consumed(RecvComm* comm, int n, Request* request) override;

    Wakeup* completion_wakeup() override;
    bool progress() override;
    int progress_fd() override;

    Status close_send(SendComm* comm) override;
    Status close_recv(RecvComm* comm) override;
    Status close_listen(ListenComm* comm) override;

    const Settings& settings() const { return settings_; }
    const std::vector<NetInterface>& interfaces() const { return devices_; }
    int io_threads() const;

 private:
    struct ConnectState;

    SocketNet(Settings settings, std::vector<NetInterface> devices, std::unique_ptr<IoPool> pool);

    Settings settings_;
    std::vector<NetInterface> devices_;
    std::unique_ptr<IoPool> pool_;

    // Each comm's registrations: close frees those still there (a caller that gives up on a comm
    // with requests in flight closes it before deregistering, as their buffers may still be in
    // use until close returns).
    void forget_mrs(void* comm);
    std::mutex mr_mu_;
    std::unordered_map<void*, std::vector<void*>> mrs_;
    // Whether `mhandle` is a registration of `comm` not yet deregistered (or forgotten at its
    // close). With mr_mu_ held.
    bool live_mr_locked(void* comm, MemHandle* mhandle) const;

    std::mutex connect_mu_;
    // Connects in progress, keyed by the random key stored in the caller's handle.
    std::unordered_map<uint64_t, std::unique_ptr<ConnectState>> connecting_;
};

}  // namespace tcpx::net
