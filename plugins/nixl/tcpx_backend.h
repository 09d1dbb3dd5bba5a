// The NIXL backend "TCPX": NIXL's backend contract (nixlBackendEngine) over one tcpx::Endpoint.
//
// A thin adapter: agents are endpoints named after the agent, registrations are endpoint
// registrations (their RemoteMem descriptor is the public blob), a transfer request is one
// writev/readv, notifications (a WRITE's and a READ's included) are the engine's. What the engine
// does not say in NIXL's terms is translated here and nowhere else: status codes, local transfers
// (Endpoint::copy), releasing a request still in flight, which agent a connection belongs to.
//
// No call waits for a peer: connections are Endpoint::connect_async, and what is posted or
// notified while one is being made waits in the engine and goes out, in order, once it is made
// (a peer whose agent has no progress thread answers only from inside that agent's calls,
// possibly made by the very thread that would wait).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "backend/backend_engine.h"
#include "tcpx/endpoint.h"

namespace tcpx::nixl_backend {

// NIXL's status for an engine status.
nixl_status_t to_nixl(const Status& st);

class TcpxBackend final : public nixlBackendEngine {
 public:
    explicit TcpxBackend(const nixlBackendInitParams* init_params);
    ~TcpxBackend() override;

    bool supportsRemote() const override { return true; }
    bool supportsLocal() const override { return true; }
    bool supportsNotif() const override { return true; }
    nixl_mem_list_t getSupportedMems() const override;

    nixl_status_t registerMem(const nixlBlobDesc& mem, const nixl_mem_t& nixl_mem,
                              nixlBackendMD*& out) override;
    nixl_status_t deregisterMem(nixlBackendMD* meta) override;
    nixl_status_t getPublicData(const nixlBackendMD* meta, std::string& str) const override;

    nixl_status_t getConnInfo(std::string& str) const override;
    nixl_status_t loadRemoteConnInfo(const std::string& remote_agent,
                                     const std::string& remote_conn_info) override;
    nixl_status_t connect(const std::string& remote_agent) override;
    nixl_status_t disconnect(const std::string& remote_agent) override;

    nixl_status_t loadRemoteMD(const nixlBlobDesc& input, const nixl_mem_t& nixl_mem,
                               const std::string& remote_agent, nixlBackendMD*& output) override;
    nixl_status_t loadLocalMD(nixlBackendMD* input, nixlBackendMD*& output) override;
    nixl_status_t unloadMD(nixlBackendMD* input) override;

    nixl_status_t prepXfer(const nixl_xfer_op_t& operation, const nixl_meta_dlist_t& local,
                           const nixl_meta_dlist_t& remote, const std::string& remote_agent,
                           nixlBackendReqH*& handle,
                           const nixl_opt_b_args_t* opt_args = nullptr) const override;
    nixl_status_t postXfer(const nixl_xfer_op_t& operation, const nixl_meta_dlist_t& local,
                           const nixl_meta_dlist_t& remote, const std::string& remote_agent,
                           nixlBackendReqH*& handle,
                           const nixl_opt_b_args_t* opt_args = nullptr) const override;
    nixl_status_t checkXfer(nixlBackendReqH* handle) const override;
    nixl_status_t releaseReqH(nixlBackendReqH* handle) const override;

    nixl_status_t getNotifs(notif_list_t& notif_list) override;
    nixl_status_t genNotif(const std::string& remote_agent, const std::string& msg) const override;

    // The backend parameters NIXL lists for TCPX (name -> default or description).
    static nixl_b_params_t default_params();

 private:
    struct Request;

    // The connection to `agent`: ours (made now, asynchronously, from its connection info if we
    // have none), else the one it opened to us. Locks mu_.
    StatusOr<PeerId> connection_to(const std::string& agent) const;
    // Forgets our connection to `agent` and closes it (close_peer). mu_ held.
    void drop_outbound(const std::string& agent) const;
    // Closes `peer`, remembering whether what it sent before is still to be delivered (a peer we
    // had accepted as its agent) or not (one we refused). mu_ held. The engine's disconnect
    // comes later, in disconnect_closed(), once mu_ is released.
    void close_peer(PeerId peer, bool deliver) const;
    // Disconnects the peers close_peer() closed, without mu_: an engine disconnect waits for the
    // peer's transport requests (up to 100 ms over an ncclNet plugin) and GPU work, and every
    // other call (checkXfer's polls, releaseReqH, NIXL's own lock in getNotifs) would wait on
    // mu_ meanwhile. Locks mu_ briefly.
    void disconnect_closed() const noexcept;
    // guarded(), then disconnect_closed(): for the entry points that may close connections.
    template <typename Body>
    nixl_status_t closing(const char* what, Body&& body) const noexcept;
    // Whether the connection `peer` has ended (failed, or closed); its error then.
    std::optional<Status> connection_lost(PeerId peer) const;
    // `what` on `peer` (to `agent`) failed with `st`: NIXL's status for it, logged. When the
    // connection itself is gone it is forgotten, so the next post connects again; when it stands
    // (the request alone was refused: unknown memory, a bad argument) it is kept.
    nixl_status_t failed(const char* what, const std::string& agent, PeerId peer,
                         const Status& st) const;
    // Learns the names of peers that connected to us, refusing those whose claim we cannot
    // accept, and releases connections that ended (release_lost). mu_ held.
    void harvest_inbound() const;
    // Closes and forgets the connections, ours and to us, that have ended (at most once per
    // kReleaseInterval): the engine keeps a peer the application has learnt of until it is
    // disconnected, so a departed initiator would otherwise hold one of MAX_PEERS for ever.
    // mu_ held.
    void release_lost() const;
    // At MAX_PEERS agents' connection info: forgets the earliest loaded of those with no
    // connection either way; false where every one has one. mu_ held.
    bool evict_conn_info();
    // Whether a notification taken from the engine is the application's: not if it came on a
    // connection we refused (or would have). mu_ held.
    bool deliverable(const Notification& n) const;  // may throw (out of memory)
    // Polls requests released while in flight, forgetting the finished ones. Locks mu_.
    void reap_abandoned() const;
    // Room in abandoned_ for a request whose release failed (its next release must not fail);
    // given back when it is no longer needed. Lock mu_.
    void reserve_abandon(Request* req) const;
    void unreserve_abandon(Request* req) const;
    // Leaves `req`'s transfer, still in flight, to reap_abandoned. Locks mu_.
    void abandon(Request* req) const;
    nixl_status_t start(Request* req, const nixl_opt_b_args_t* opt_args) const;

    std::unique_ptr<Endpoint> ep_;
    bool authenticated_ = false;  // auth_secret set: every connection proved the secret
    mutable std::mutex mu_;
    // Agent -> its endpoint's metadata, and when it was loaded (conn_seq_). At most
    // kConnInfoPerPeer x MAX_PEERS: NIXL forgets a remote whose metadata it then rejects without
    // disconnecting it here, so names it never connects would otherwise pile up
    // (loadRemoteConnInfo evicts the earliest loaded of those). Agents known are not
    // connections: a decode worker may load every prefill worker of a large cluster and connect
    // to the few it pulls from, so the bound is well above MAX_PEERS.
    struct ConnInfo {
        std::string metadata;
        uint64_t seq = 0;
    };
    mutable std::map<std::string, ConnInfo> conn_info_;
    uint64_t conn_seq_ = 0;
    static constexpr size_t kConnInfoPerPeer = 16;
    size_t max_conn_info_ = 0;                        // kConnInfoPerPeer x MAX_PEERS
    mutable std::map<std::string, PeerId> outbound_;  // our connections, by agent
    mutable std::map<std::string, PeerId> inbound_;   // connections to us, by agent
    mutable std::vector<XferId> abandoned_;           // released while in flight
    mutable std::atomic<bool> any_abandoned_{false};  // !abandoned_.empty(), read without mu_
    mutable size_t abandon_reserved_ = 0;             // its room kept for reserve_abandon
    mutable std::vector<std::pair<std::string, std::string>> local_notifs_;
    // Connections we closed whose notifications may still wait in the engine (it keeps what a
    // peer sent before the close), and whether to deliver them; forgotten once a later
    // get_notifications has taken everything they sent. At most max_conn_info_ (the earliest
    // forgotten first: their notifications are then judged as a connection never decided on
    // is), for an application that never calls getNotifs.
    struct Closed {
        bool deliver = true;
        uint64_t fetches = 0;  // fetches_ when it was closed
    };
    mutable std::map<PeerId, Closed> closed_;
    mutable std::vector<PeerId> to_disconnect_;  // closed, not yet disconnected (under mu_)
    mutable std::atomic<bool> any_to_disconnect_{false};  // !to_disconnect_.empty(), without mu_
    mutable uint64_t fetches_ = 0;                        // get_notifications calls made
    mutable std::chrono::steady_clock::time_point next_release_{};
    // Taken from the engine, not yet delivered: a getNotifs that could not allocate the room for
    // them leaves them here, delivered first by the next one.
    std::vector<Notification> pending_;
};

}  // namespace tcpx::nixl_backend
