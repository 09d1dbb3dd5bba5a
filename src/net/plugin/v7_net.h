// A Net over an ncclNet function table of v7's shape: an external plugin loaded by path (Google's
// GPUDirect-TCPX, through plugin_loader.h), or our own socket transport's exported table. Tables
// of later versions (v8 to v12) come through the same code, adapted by NcclNetTable.
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "common/params.h"
#include "net/ncclnet_v7.h"
#include "net/net.h"
#include "net/plugin/nccl_net_table.h"
#include "net/plugin/tcpx_layout.h"

namespace tcpx::net {

// The check of one of Google's TCPX handles from a peer (its layout in tcpx_layout.h): both
// addresses IPv4 or IPv6 with a port, naming the peer's host (names_peer_host; an empty
// `peer_address` skips that), num_socks and num_threads within the plugin's limits; connect_args
// (a pointer the plugin follows) reset to null and every byte after the struct zeroed.
// num_threads is lowered to at most `max_threads` (to the largest divisor of num_socks within
// it): Google's connect starts that many helper threads for the comm, on our side only (its
// thread t serves sockets t, t + threads, ...; the listener's own threads are its own), so a
// peer's handle asking for 16 no longer has us start 16 threads per comm where ours take 1.
Status check_tcpx_handle(Handle* handle, const SocketAddress& peer_address,
                         int max_threads = google_tcpx::kMaxThreads);
// The helper threads per comm our own side runs with Google's plugin: NCCL_SOCKET_NTHREADS, as
// the plugin reads it (the loader sets 1 where it is unset), within [1, kMaxThreads].
int own_tcpx_threads();

struct V7Options {
    // Requests in flight per comm the table is known to accept (v7 does not say). 0: derived from
    // the device type — 16 for UNPACK devices (Google's TCPX allows 16), else 8 (what NCCL itself
    // keeps in flight).
    int max_requests = 0;
    // Whether test() fills in received sizes. Unset: not for UNPACK devices (Google's TCPX plugin
    // never does), yes otherwise.
    std::optional<bool> reports_sizes;
    // What the wrapper takes from the settings: NSOCKS (the most data sockets a peer's handle may
    // ask of our socket transport's table), PLUGIN_LOG_BURST / PLUGIN_LOG_INTERVAL_MS (the rate
    // limit on the plugin's log lines).
    Settings settings;
};

class V7Net final : public Net {
 public:
    // Calls the table's init() (once per table and process) with a logger that feeds this
    // library's log. `table` must outlive the V7Net.
    static StatusOr<std::unique_ptr<V7Net>> create(const tcpx_ncclNet_v7_t* table,
                                                   V7Options options);
    // The same over any table version the adapters understand (nccl_net_table(), never freed).
    static StatusOr<std::unique_ptr<V7Net>> create(NcclNetTable* table, V7Options options);
    ~V7Net() override;

    std::string_view name() const override { return name_; }
    int device_count() const override { return ndev_; }
    Status get_properties(int dev, Properties* props) const override;

    Status listen(int dev, Handle* handle, ListenComm** listen_comm) override;
    // Whose handles a table makes: from PLUGIN_HANDLE_LAYOUT, or (auto) the table's name.
    enum class HandleKind { kUnknown, kGoogleTcpx, kSocket };

    // Handles of two tables are understood: Google's TCPX plugin (name GPUDirectTCPX*, its
    // layout in tcpx_layout.h; connect_args, a pointer the plugin follows, is reset) and our own
    // socket transport's (tcpx-p2p-socket, check_socket_handle); PLUGIN_HANDLE_LAYOUT names
    // either for a renamed build. Any other: UNIMPLEMENTED.
    Status check_peer_handle(Handle* handle, const SocketAddress& peer_address) const override;
    Status connect(int dev, Handle* handle, SendComm** send_comm,
                   DeviceHandle* dev_handle) override;
    // Forgets the connect in progress with `handle`. Its device-handle storage is freed when the
    // table's layout is known (neither Google's plugin nor ours writes it outside a call), and
    // kept until the V7Net goes otherwise.
    void abandon_connect(Handle* handle) override;
    Status accept(ListenComm* listen_comm, RecvComm** recv_comm, DeviceHandle* dev_handle) override;

    Status reg_mr(void* comm, void* data, size_t size, MemType type, MemHandle** mhandle) override;
    Status dereg_mr(void* comm, MemHandle* mhandle) override;

    Status isend(SendComm* comm, const void* data, size_t size, int tag, MemHandle* mhandle,
                 Request** request) override;
    Status irecv(RecvComm* comm, int n, void* const* data, const size_t* sizes, const int* tags,
                 MemHandle* const* mhandles, Request** request) override;
    Status test(Request* request, bool* done, size_t* sizes) override;
    Status irecv_consumed(RecvComm* comm, int n, Request* request) override;
    StatusOr<UnpackSlot> unpack_slot(RecvComm* comm, Request* request) override;

    Status close_send(SendComm* comm) override;
    Status close_recv(RecvComm* comm) override;
    // With an accept() in progress on the listener (a plugin such as Google's runs it in a
    // thread that uses the listen comm, which its closeListen frees), the plugin's closeListen
    // waits until that accept ends: the listener is parked, and later calls of listen, connect,
    // accept and close_listen, and the destructor, try its accept again; a connection it
    // yields is closed, then the listener. An accept that never ends (no peer connects) keeps
    // its listener open for the life of the process: the plugin offers no way to cancel it.
    Status close_listen(ListenComm* comm) override;
    // Listeners parked by close_listen, not yet closed.
    size_t parked_listeners() const;
    // Collects parked listeners whose accept has ended (at most every 100 ms), so that they go
    // even when no listen, connect or accept follows: the engine calls it on every pass.
    bool progress() override;
    // Tests: whether a listener parked during an accept has that accept ended at once
    // (end_parked_accepts_locked; the default) or waits for it to end by itself.
    void set_end_parked_accepts(bool on) { end_parked_accepts_ = on; }

 private:
    struct CommWrap;
    struct ListenWrap;
    struct RequestWrap;

    // Under mu_: ends the plugin's accepts of listeners parked during one (Google's layout
    // only), at most once a second.
    void end_parked_accepts_locked();
    V7Net(const NcclNetTable* table, V7Options options, int ndev);
    static void* unwrap_comm(void* comm);
    static RequestWrap* new_request(CommWrap* comm, void* request, bool is_recv, int n);
    static void release_request(RequestWrap* r);
    // The plugin's send and receive comms open now: one handed out twice is refused (two
    // wrappers would close it twice).
    Status note_live_comm(void* comm, const char* call);
    void forget_live_comm(void* comm);
    // A counted registration (reg_mr) deregistered: its place in the descriptor budget goes back.
    void forget_counted_mr(void* comm, void* mhandle);
    // A comm closed: the places of its counted registrations go back where the close releases
    // them.
    void forget_counted_mrs_of(void* comm);
    // Frees the wrappers of requests abandoned by closing `comm`.
    static void release_all(CommWrap* comm);
    // The rest of close_send / close_recv once the plugin's close returned `closed` (`call`
    // names it in an error): forgets and frees what the wrapper held, and the wrapper.
    Status close_wrap(CommWrap* w, tcpx_ncclResult_t closed, const char* call);

    const NcclNetTable* const table_;
    const V7Options options_;
    const std::string name_;
    const int ndev_;
    const HandleKind handle_kind_;
    const bool dereg_after_close_;  // Properties::dereg_after_close
    const size_t max_transfer_;     // one isend/irecv buffer, on any device
    std::atomic<bool> end_parked_accepts_{true};
    std::vector<bool> reports_sizes_;  // by device: whether test() reports received sizes
    bool reports_sizes_of(int dev) const {
        return dev >= 0 && static_cast<size_t>(dev) < reports_sizes_.size() &&
               reports_sizes_[static_cast<size_t>(dev)];
    }

    mutable std::mutex mu_;
    // connect() in progress, by the caller's handle: its device-handle storage must stay put
    // across retries (a plugin may write it when the connection completes).
    std::unordered_map<Handle*, std::unique_ptr<CommWrap>> connecting_;
    // Abandoned connects' storage, for a table whose layout is unknown (it might still write it).
    std::vector<std::unique_ptr<CommWrap>> abandoned_;
    // GPU registrations holding a place in the descriptor budget (common/socket.h), by the
    // plugin's handle: the comm (our wrapper) they were made with.
    std::unordered_multimap<void*, void*> counted_mrs_;
    std::unordered_set<void*> live_comms_;  // (note_live_comm)
    // Listeners closed during an accept, until the accept ends (close_listen).
    std::vector<ListenWrap*> parked_;
    std::atomic<size_t> parked_count_{0};   // parked_.size(), read without mu_
    std::atomic<int64_t> next_reap_ns_{0};  // progress(): when it next reaps
    int64_t next_end_ns_ = 0;               // under mu_: end_parked_accepts_locked

    // Tries the accept of each parked listener once; closes those whose accept ended. Takes mu_.
    void reap_parked();
    // Closes a listener with no accept in progress, and frees it.
    Status close_listen_now(ListenWrap* l);
};

}  // namespace tcpx::net
