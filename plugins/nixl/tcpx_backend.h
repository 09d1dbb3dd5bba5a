// The NIXL backend "TCPX": NIXL's backend contract (nixlBackendEngine) over one tcpx::Endpoint.
//
// A thin adapter: agents are endpoints named after the agent, registrations are endpoint
// registrations (their RemoteMem descriptor is the public blob), a transfer request is one
// writev/readv, notifications are the engine's. What the engine does not say in NIXL's terms is
// translated here and nowhere else: status codes, the READ notification (sent once the read is
// complete), local transfers (Endpoint::copy), releasing a request still in flight.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
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

    // The peer for `agent`: our own connection when we have one (made now from its connection
    // info if needed), else the connection it opened to us. Locks mu_.
    StatusOr<PeerId> peer_for(const std::string& agent, bool may_connect) const;
    // Learns the names of peers that connected to us.
    void harvest_inbound() const;
    // Polls requests released while in flight, forgetting the finished ones. Locks mu_.
    void reap_abandoned() const;
    nixl_status_t start(Request* req, const nixl_opt_b_args_t* opt_args) const;

    std::unique_ptr<Endpoint> ep_;
    mutable std::mutex mu_;
    mutable std::map<std::string, std::string> conn_info_;  // agent -> endpoint metadata
    mutable std::map<std::string, PeerId> outbound_;        // our connections, by agent
    mutable std::map<std::string, PeerId> inbound_;         // connections to us, by agent
    mutable std::vector<XferId> abandoned_;                 // released while in flight
    mutable std::vector<std::pair<std::string, std::string>> local_notifs_;
};

}  // namespace tcpx::nixl_backend
