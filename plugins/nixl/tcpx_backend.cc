#include "tcpx_backend.h"

#include <algorithm>
#include <cctype>
#include <chrono>
#include <exception>
#include <new>
#include <optional>
#include <string_view>
#include <utility>

#include "tcpx/config.h"

namespace tcpx::nixl_backend {
namespace {

// Our registration, as NIXL holds it; and, as a copy of it (`alias`), the "remote" side of a
// local transfer that loadLocalMD hands out. The copy is NIXL's to unload, on its own schedule:
// an agent destroyed with memory registered deregisters it (deleting the registration's LocalMD)
// before it unloads what loadLocalMD gave, so that must not be the same object.
struct LocalMD final : nixlBackendMD {
    LocalMD() : nixlBackendMD(true) {}
    MemId mem = 0;
    RemoteMem desc;
    bool alias = false;
};

// A peer's registration, from its public blob.
struct RemoteMD final : nixlBackendMD {
    RemoteMD() : nixlBackendMD(false) {}
    RemoteMem desc;
    std::string agent;
};

// Backend parameters that name an engine setting, and the setting. Any TCPX_P2P_* parameter is
// accepted by its own name too (e.g. "WINDOW" or "window").
constexpr std::pair<const char*, const char*> kAliases[] = {
    {"channels", "CHANNELS"},
    {"nsocks", "NSOCKS"},
    {"chunk_size", "XFER_CHUNK_SIZE"},
    {"interface", "SOCKET_IFNAME"},
    {"net_plugin", "NET_PLUGIN"},
    {"gpu_index", "GPU_INDEX"},
    {"port", "PORT"},
    {"auth_secret", "AUTH_SECRET"},
};

std::string upper(std::string s) {
    std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::toupper(c); });
    return s;
}

// Whether `name` (upper case, with or without the TCPX_P2P_ prefix) is an engine setting.
// Config::set cannot tell an unknown name from a bad value (both INVALID_ARGUMENT), and unknown
// keys are not errors here: NIXL hands every backend whatever the application passed.
bool is_setting(std::string_view name) {
    constexpr std::string_view kPrefix = "TCPX_P2P_";
    if (name.substr(0, kPrefix.size()) == kPrefix) name.remove_prefix(kPrefix.size());
    static constexpr std::string_view kSettings[] = {
#define TCPX_PARAM_INT(field, NAME, ...) #NAME,
#define TCPX_PARAM_SIZE(field, NAME, ...) #NAME,
#define TCPX_PARAM_CHOICE(field, NAME, ...) #NAME,
#define TCPX_PARAM_STRING(field, NAME, ...) #NAME,
#include "tcpx/config_params.inc"
#undef TCPX_PARAM_INT
#undef TCPX_PARAM_SIZE
#undef TCPX_PARAM_CHOICE
#undef TCPX_PARAM_STRING
    };
    return std::find(std::begin(kSettings), std::end(kSettings), name) != std::end(kSettings);
}

bool is_memory(nixl_mem_t m) { return m == DRAM_SEG || m == VRAM_SEG; }

// Where [addr, addr + len) lies in a registration starting at `base` of `size` bytes.
std::optional<uint64_t> offset_in(uintptr_t addr, size_t len, uint64_t base, uint64_t size) {
    if (addr < base || addr - base > size || len > size - (addr - base)) return std::nullopt;
    return addr - base;
}

// Runs an entry point's body so that no exception (out of memory) reaches NIXL: its agent does
// not expect one from a backend, and one in an application's progress thread would end the
// process. A plugin must never take the application down; NIXL sees an error instead.
template <typename Body>
nixl_status_t guarded(const char* what, Body&& body) noexcept {
    const auto report = [what](const char* why) noexcept {
        try {
            NIXL_ERROR << "TCPX " << what << ": " << why;
        } catch (...) {
            // Not even memory for the message: the status says enough.
        }
    };
    try {
        return body();
    } catch (const std::bad_alloc&) {
        report("out of memory");
    } catch (const std::exception& e) {
        report(e.what());
    } catch (...) {
        report("unexpected exception");
    }
    return NIXL_ERR_BACKEND;
}

// How long a transfer the target refused as naming memory it does not know (NOT_FOUND) waits to
// see whether the target's connection is ending too. An agent that goes away deregisters its
// memory before its backend closes the connection, so a transfer in flight then is refused just
// before the connection ends: that is the target going away (NIXL_ERR_REMOTE_DISCONNECT), not a
// bad descriptor (NIXL_ERR_NOT_FOUND).
constexpr std::chrono::milliseconds kRefusalGrace{250};

// A connection that ended is news, not an error of ours: the peer's agent went away.
void log_lost(const char* what, const std::string& agent, const Status& st) {
    NIXL_INFO << "TCPX: " << what << ": the connection to agent '" << agent
              << "' is gone: " << st.to_string();
}

}  // namespace

template <typename Body>
nixl_status_t TcpxBackend::closing(const char* what, Body&& body) const noexcept {
    const nixl_status_t st = guarded(what, std::forward<Body>(body));
    disconnect_closed();
    return st;
}

struct TcpxBackend::Request final : nixlBackendReqH {
    nixl_xfer_op_t op = NIXL_WRITE;
    std::string agent;
    bool local = false;
    std::vector<IoVec> iov;         // remote transfers
    std::vector<LocalCopy> copies;  // local ones
    PeerId peer = 0;                // the connection it was last posted on
    XferId xfer = 0;
    bool active = false;  // posted, completion not yet reported
    // A release of it failed (see releaseReqH): NIXL frees its handle on the next one, whatever
    // we answer; room for its note in abandoned_ is reserved meanwhile.
    bool release_failed = false;
    bool reserved = false;
    bool cancelled = false;  // the engine was asked to cancel its transfer
    // The target refused it as naming unknown memory (reported by the engine, not yet to NIXL):
    // the refusal and when it was seen (see kRefusalGrace).
    std::optional<Status> refusal;
    std::chrono::steady_clock::time_point refused_at;
};

nixl_status_t to_nixl(const Status& st) {
    switch (st.code()) {
        case StatusCode::kOk:
            return NIXL_SUCCESS;
        case StatusCode::kInvalidArgument:
        case StatusCode::kOutOfRange:
            return NIXL_ERR_INVALID_PARAM;
        case StatusCode::kNotFound:
            return NIXL_ERR_NOT_FOUND;
        case StatusCode::kUnavailable:
        case StatusCode::kTimeout:  // a peer that stopped answering is disconnected
            return NIXL_ERR_REMOTE_DISCONNECT;
        case StatusCode::kCancelled:
            return NIXL_ERR_CANCELED;
        case StatusCode::kUnimplemented:
            return NIXL_ERR_NOT_SUPPORTED;
        case StatusCode::kFailedPrecondition:
        case StatusCode::kUnauthenticated:  // a peer without our secret, or with another one
            return NIXL_ERR_NOT_ALLOWED;
        default:
            return NIXL_ERR_BACKEND;
    }
}

nixl_b_params_t TcpxBackend::default_params() {
    // The settings as this process would run them, the environment's included and automatic
    // values resolved, so that what the plugin advertises is what runs: applications often
    // create the backend with exactly these (NIXL's getPluginParams), and passing them back
    // must not replace what TCPX_P2P_* says. (An invalid environment: the defaults; creating the
    // backend then fails with the reason.) The secret is never advertised: it would travel to
    // wherever the application prints its parameters, and an empty value leaves the
    // environment's in place.
    auto from_env = Config::from_env();
    const Config d = (from_env.ok() ? *from_env : Config{}).effective();
    return {
        {"channels", std::to_string(d.channels)},
        {"nsocks", std::to_string(d.nsocks)},
        {"chunk_size", std::to_string(d.xfer_chunk_size)},
        {"interface", d.socket_ifname},
        {"net_plugin", d.net_plugin},
        {"gpu_index", std::to_string(d.gpu_index)},
        {"port", std::to_string(d.port)},
        {"auth_secret", ""},
    };
}

TcpxBackend::TcpxBackend(const nixlBackendInitParams* init_params)
    : nixlBackendEngine(init_params) {
    auto config = Config::from_env();
    if (!config.ok()) {
        NIXL_ERROR << "TCPX: " << config.status().to_string();
        initErr = true;
        return;
    }
    // NIXL's progress-thread option decides ours: without one, progress happens in checkXfer()
    // and getNotifs() (the engine progresses inside poll() and get_notifications()).
    (void)config->set("PROGRESS_THREAD", init_params->enableProgTh ? "on" : "off");
    for (const auto& [key, value] : getCustomParams()) {
        std::string name = upper(key);
        for (const auto& [alias, setting] : kAliases) {
            if (key == alias) name = setting;
        }
        if (!is_setting(name)) {
            NIXL_DEBUG << "TCPX: ignoring backend parameter '" << key << "'";
            continue;
        }
        if (value.empty()) continue;  // left at its default
        Status st = config->set(name, value);
        if (!st.ok()) {
            NIXL_ERROR << "TCPX: backend parameter '" << key << "': " << st.to_string();
            initErr = true;
            return;
        }
    }
    auto ep = Endpoint::create(*config, localAgent);
    if (!ep.ok()) {
        NIXL_ERROR << "TCPX: " << ep.status().to_string();
        initErr = true;
        return;
    }
    ep_ = std::move(ep).value();
    // With a secret every connection proved it (strangers are refused before they are served).
    authenticated_ = !config->auth_secret.empty();
    max_conn_info_ = kConnInfoPerPeer * static_cast<size_t>(config->max_peers);
}

TcpxBackend::~TcpxBackend() {
    // Requests released in flight must be done before the memory they touch goes away: the
    // endpoint's destruction fails whatever is left (and lets no exception out).
    ep_.reset();
}

nixl_mem_list_t TcpxBackend::getSupportedMems() const { return {DRAM_SEG, VRAM_SEG}; }

// --- memory -----------------------------------------------------------------------------------

nixl_status_t TcpxBackend::registerMem(const nixlBlobDesc& mem, const nixl_mem_t& nixl_mem,
                                       nixlBackendMD*& out) {
    return guarded("registerMem", [&]() -> nixl_status_t {
        if (!is_memory(nixl_mem)) return NIXL_ERR_NOT_SUPPORTED;
        // Allocated first: out of memory after the engine's registration would leave it there
        // with nothing holding its id.
        auto md = std::make_unique<LocalMD>();
        auto id = ep_->reg(reinterpret_cast<void*>(mem.addr), mem.len);
        if (!id.ok()) {
            NIXL_ERROR << "TCPX: registerMem: " << id.status().to_string();
            return to_nixl(id.status());
        }
        auto desc = ep_->describe(*id);
        const MemKind want = nixl_mem == VRAM_SEG ? MemKind::kCuda : MemKind::kHost;
        if (!desc.ok() || desc->kind != want) {
            (void)ep_->dereg(*id);
            NIXL_ERROR << "TCPX: registerMem: " << (nixl_mem == VRAM_SEG ? "VRAM" : "DRAM")
                       << " segment at 0x" << std::hex << mem.addr << std::dec << " is "
                       << (want == MemKind::kCuda ? "not GPU memory (or this build has no CUDA)"
                                                  : "GPU memory");
            return NIXL_ERR_INVALID_PARAM;
        }
        md->mem = *id;
        md->desc = *desc;
        out = md.release();
        return NIXL_SUCCESS;
    });
}

nixl_status_t TcpxBackend::deregisterMem(nixlBackendMD* meta) {
    return guarded("deregisterMem", [&]() -> nixl_status_t {
        auto* md = dynamic_cast<LocalMD*>(meta);
        if (md == nullptr || md->alias) return NIXL_ERR_INVALID_PARAM;
        Status st = ep_->dereg(md->mem);
        delete md;
        return to_nixl(st);
    });
}

nixl_status_t TcpxBackend::getPublicData(const nixlBackendMD* meta, std::string& str) const {
    return guarded("getPublicData", [&]() -> nixl_status_t {
        const auto* md = dynamic_cast<const LocalMD*>(meta);
        if (md == nullptr) return NIXL_ERR_INVALID_PARAM;
        str = md->desc.serialize();
        return NIXL_SUCCESS;
    });
}

nixl_status_t TcpxBackend::loadRemoteMD(const nixlBlobDesc& input, const nixl_mem_t& nixl_mem,
                                        const std::string& remote_agent, nixlBackendMD*& output) {
    return guarded("loadRemoteMD", [&]() -> nixl_status_t {
        if (!is_memory(nixl_mem)) return NIXL_ERR_NOT_SUPPORTED;
        auto desc = RemoteMem::parse(input.metaInfo);
        if (!desc.ok()) {
            NIXL_ERROR << "TCPX: loadRemoteMD from " << remote_agent << ": "
                       << desc.status().to_string();
            return NIXL_ERR_INVALID_PARAM;
        }
        auto* md = new RemoteMD;
        md->desc = *desc;
        md->agent = remote_agent;
        output = md;
        return NIXL_SUCCESS;
    });
}

nixl_status_t TcpxBackend::loadLocalMD(nixlBackendMD* input, nixlBackendMD*& output) {
    return guarded("loadLocalMD", [&]() -> nixl_status_t {
        const auto* md = dynamic_cast<LocalMD*>(input);
        if (md == nullptr || md->alias) return NIXL_ERR_INVALID_PARAM;
        // A local transfer's "remote" side is our own registration: a copy that names it by mem id
        // (a transfer through it after deregisterMem fails with NOT_FOUND, touching nothing).
        auto* alias = new LocalMD;
        alias->mem = md->mem;
        alias->desc = md->desc;
        alias->alias = true;
        output = alias;
        return NIXL_SUCCESS;
    });
}

nixl_status_t TcpxBackend::unloadMD(nixlBackendMD* input) {
    return guarded("unloadMD", [&]() -> nixl_status_t {
        if (auto* remote = dynamic_cast<RemoteMD*>(input)) {
            delete remote;
        } else if (auto* local = dynamic_cast<LocalMD*>(input); local != nullptr && local->alias) {
            delete local;
        } else {
            return NIXL_ERR_INVALID_PARAM;  // a registration itself is deregisterMem's to free
        }
        return NIXL_SUCCESS;
    });
}

// --- connections ------------------------------------------------------------------------------

nixl_status_t TcpxBackend::getConnInfo(std::string& str) const {
    return guarded("getConnInfo", [&]() -> nixl_status_t {
        str = ep_->metadata();
        return NIXL_SUCCESS;
    });
}

nixl_status_t TcpxBackend::loadRemoteConnInfo(const std::string& remote_agent,
                                              const std::string& remote_conn_info) {
    return closing("loadRemoteConnInfo", [&]() -> nixl_status_t {
        auto info = Endpoint::parse_metadata(remote_conn_info);
        if (!info.ok()) return NIXL_ERR_INVALID_PARAM;
        // Each agent's endpoint carries the agent's name: connection info naming another
        // endpoint would send this agent's transfers to someone else.
        if (info->name != remote_agent) {
            // (parse_metadata() refuses names with control characters.)
            NIXL_ERROR << "TCPX: loadRemoteConnInfo: the connection info for agent '"
                       << remote_agent << "' is that of endpoint '" << info->name << "'";
            return NIXL_ERR_INVALID_PARAM;
        }
        std::lock_guard<std::mutex> lock(mu_);
        auto it = conn_info_.find(remote_agent);
        if (it != conn_info_.end() && it->second.metadata != remote_conn_info) {
            // The agent came back as a new endpoint: the old connection is stale.
            drop_outbound(remote_agent);
        }
        if (it == conn_info_.end() && conn_info_.size() >= max_conn_info_ && !evict_conn_info()) {
            NIXL_ERROR << "TCPX: loadRemoteConnInfo: agent '" << remote_agent
                       << "' would be one more than the " << max_conn_info_
                       << " agents with connections (16 x TCPX_P2P_MAX_PEERS)";
            return NIXL_ERR_NOT_ALLOWED;
        }
        conn_info_[remote_agent] = ConnInfo{remote_conn_info, ++conn_seq_};
        // A connection that came in under the agent's name before we knew where the agent is
        // must come from there (harvest_inbound() judges later ones the same way).
        if (auto in = inbound_.find(remote_agent); in != inbound_.end()) {
            if (const Status st = ep_->peer_matches(in->second, remote_conn_info); !st.ok()) {
                NIXL_WARN << "TCPX: closed the connection that claimed to be agent '"
                          << remote_agent << "': " << st.to_string();
                close_peer(in->second, false);
                inbound_.erase(in);
            }
        }
        return NIXL_SUCCESS;
    });
}

bool TcpxBackend::evict_conn_info() {
    // The oldest loaded of the agents we have no connection with, either way.
    auto victim = conn_info_.end();
    for (auto it = conn_info_.begin(); it != conn_info_.end(); ++it) {
        if (outbound_.count(it->first) != 0 || inbound_.count(it->first) != 0) continue;
        if (victim == conn_info_.end() || it->second.seq < victim->second.seq) victim = it;
    }
    if (victim == conn_info_.end()) return false;
    NIXL_WARN << "TCPX: forgetting the connection info of agent '" << victim->first
              << "', loaded earliest of those not connected: connection info is kept for "
              << max_conn_info_
              << " agents (16 x TCPX_P2P_MAX_PEERS); a transfer to it reports "
                 "NIXL_ERR_REMOTE_DISCONNECT until its metadata is loaded again";
    conn_info_.erase(victim);
    return true;
}

void TcpxBackend::harvest_inbound() const {
    while (true) {
        auto peer = ep_->accept(std::chrono::milliseconds(0));
        if (!peer.ok()) break;
        auto name = ep_->peer_name(*peer);
        if (!name.ok()) {
            // Gone already, or no memory to say: closed either way, or it would hold one of
            // MAX_PEERS unrecorded (release_lost() releases only what it knows).
            close_peer(*peer, false);
            continue;
        }
        // A name is the peer's own claim. One that is ours, or that of an agent whose connection
        // to us is still up, is refused: it would take over that agent's replies (and what it
        // already sent is dropped, see deliverable()).
        // Where we know where that agent is (its connection info), a connection claiming its
        // name from elsewhere is a stranger's: its notifications would be delivered under the
        // agent's name, and it would keep the agent itself out.
        Status who;
        if (auto info = conn_info_.find(*name); info != conn_info_.end()) {
            who = ep_->peer_matches(*peer, info->second.metadata);
        }
        const std::string mismatch = who.ok() ? "" : who.to_string();
        const char* refusal = nullptr;
        if (*name == localAgent) {
            refusal = "it claims this agent's own name";
        } else if (!who.ok()) {
            refusal = mismatch.c_str();
        } else if (auto it = inbound_.find(*name); it != inbound_.end()) {
            if (!connection_lost(it->second) && !authenticated_) {
                // Nothing proves the newcomer is that agent (its host alone does not: any
                // process there could claim the name and evict the agent at will): the
                // connected one keeps its place.
                refusal = "an agent of that name is already connected";
            } else {
                // The old connection ended, or the newcomer proved the shared secret under the
                // agent's name: the agent itself, restarted while its old connection still looked
                // alive (a host that vanished without closing it). The engine has served the new
                // connection from the moment it was made, its writes' initiators told of success:
                // refusing it now would drop their notifications. The old connection's still
                // arrive.
                if (!connection_lost(it->second)) {
                    NIXL_WARN << "TCPX: a new connection from '" << *name
                              << "' replaces its earlier one";
                }
                close_peer(it->second, true);
                inbound_.erase(it);
            }
        }
        if (refusal != nullptr) {
            close_peer(*peer, false);
            NIXL_WARN << "TCPX: refused a connection from '" << *name << "': " << refusal;
            continue;
        }
        // (Without memory for the entry it stays connected, unrecorded: a working connection is
        // not cut for a passing shortage; its notifications are judged by the name they claim,
        // and release_lost() cannot release it when it ends.)
        inbound_[*name] = *peer;
    }
    release_lost();
}

void TcpxBackend::release_lost() const {
    // Asking the engine about every peer costs a progress pass each where no progress thread
    // runs: not on every call of an application that polls without pause.
    constexpr std::chrono::milliseconds kReleaseInterval{100};
    const auto now = std::chrono::steady_clock::now();
    if (now < next_release_) return;
    next_release_ = now + kReleaseInterval;
    for (auto* peers : {&inbound_, &outbound_}) {
        for (auto it = peers->begin(); it != peers->end();) {
            if (connection_lost(it->second)) {
                // What it sent before it went is still delivered; a request still in flight on
                // it has failed already and reports its own error (failed()).
                close_peer(it->second, true);
                it = peers->erase(it);
            } else {
                ++it;
            }
        }
    }
}

void TcpxBackend::close_peer(PeerId peer, bool deliver) const {
    try {
        closed_.insert_or_assign(peer, Closed{deliver, fetches_});
    } catch (const std::bad_alloc&) {
        // Unrecorded, its notifications are judged by the name they claim (deliverable()).
    }
    // (Peer ids grow: the earliest closed go first, judged as the unrecorded are.)
    while (closed_.size() > max_conn_info_) closed_.erase(closed_.begin());
    try {
        to_disconnect_.push_back(peer);
        any_to_disconnect_.store(true, std::memory_order_release);
    } catch (const std::bad_alloc&) {
        (void)ep_->disconnect(peer);  // (no memory to defer it: here, as it was)
    }
}

void TcpxBackend::disconnect_closed() const noexcept {
    if (!any_to_disconnect_.load(std::memory_order_acquire)) return;  // (as almost always)
    std::vector<PeerId> peers;
    {
        std::lock_guard<std::mutex> lock(mu_);
        peers.swap(to_disconnect_);
        any_to_disconnect_.store(false, std::memory_order_release);
    }
    // (Each closed already, out of the maps: nothing else picks it meanwhile; ids never repeat.)
    for (PeerId peer : peers) {
        try {
            (void)ep_->disconnect(peer);
        } catch (...) {
            // Out of memory in the engine: the peer stays connected, unrecorded here, as one
            // whose entry could not be made (harvest_inbound); the others still go.
        }
    }
}

bool TcpxBackend::deliverable(const Notification& n) const {
    if (auto it = closed_.find(n.peer_id); it != closed_.end()) return it->second.deliver;
    auto in = inbound_.find(n.peer);
    if (in != inbound_.end() && in->second == n.peer_id) return true;
    if (auto out = outbound_.find(n.peer); out != outbound_.end() && out->second == n.peer_id) {
        return true;
    }
    // A connection we never decided on: it ended before accept() could hand it to us (the
    // engine returns live peers only). Judged as harvest_inbound() would have judged it.
    if (n.peer == localAgent) return false;
    // Where we know where the agent it names is, it must have come from there (the engine
    // keeps who a connection was until its notifications are taken).
    if (auto info = conn_info_.find(n.peer);
        info != conn_info_.end() && !ep_->peer_matches(n.peer_id, info->second.metadata).ok()) {
        return false;
    }
    if (in == inbound_.end()) return true;
    const Status st = ep_->peer_status(in->second);
    return !(st.ok() || st.code() == StatusCode::kFailedPrecondition);
}

std::optional<Status> TcpxBackend::connection_lost(PeerId peer) const {
    Status st = ep_->peer_status(peer);
    if (st.ok() || st.code() == StatusCode::kFailedPrecondition)
        return std::nullopt;  // up, or
                              // being made
    return st;
}

StatusOr<PeerId> TcpxBackend::connection_to(const std::string& agent) const {
    std::lock_guard<std::mutex> lock(mu_);
    if (auto out = outbound_.find(agent); out != outbound_.end()) return out->second;
    if (auto info = conn_info_.find(agent); info != conn_info_.end()) {
        // The entry first: a connection made and then not recorded would never be released.
        auto slot = outbound_.emplace(agent, 0).first;
        // Returns at once; what is posted on it meanwhile waits in the engine.
        auto peer = ep_->connect_async(info->second.metadata);
        if (!peer.ok()) {
            outbound_.erase(slot);
            return peer.status();
        }
        slot->second = *peer;
        return *peer;
    }
    harvest_inbound();
    if (auto in = inbound_.find(agent); in != inbound_.end()) return in->second;
    return Status(StatusCode::kNotFound,
                  "TCPX: no connection to agent '" + agent +
                      "': its connection info was never loaded, or was forgotten to make room "
                      "for agents loaded later (16 x TCPX_P2P_MAX_PEERS of those not connected "
                      "are kept); load its metadata again");
}

void TcpxBackend::drop_outbound(const std::string& agent) const {
    auto it = outbound_.find(agent);
    if (it == outbound_.end()) return;
    close_peer(it->second, true);  // its transfers in flight fail, here and there
    outbound_.erase(it);
}

nixl_status_t TcpxBackend::failed(const char* what, const std::string& agent, PeerId peer,
                                  const Status& st) const {
    std::optional<Status> lost = connection_lost(peer);
    if (!lost) {
        NIXL_ERROR << "TCPX: " << what << " (agent '" << agent << "'): " << st.to_string();
        return to_nixl(st);
    }
    log_lost(what, agent, *lost);
    {
        std::lock_guard<std::mutex> lock(mu_);
        if (auto it = outbound_.find(agent); it != outbound_.end() && it->second == peer) {
            drop_outbound(agent);
        }
        if (auto it = inbound_.find(agent); it != inbound_.end() && it->second == peer) {
            close_peer(peer, true);
            inbound_.erase(it);
        }
    }
    // Unless the peer was refused for its credentials, a lost connection is a disconnect. One
    // already released (release_lost) no longer says why it ended; the transfer's own error,
    // which is the connection's, does.
    const nixl_status_t code = to_nixl(lost->code() == StatusCode::kNotFound ? st : *lost);
    return code == NIXL_ERR_NOT_ALLOWED ? code : NIXL_ERR_REMOTE_DISCONNECT;
}

nixl_status_t TcpxBackend::connect(const std::string& remote_agent) {
    return closing("connect", [&]() -> nixl_status_t {
        if (remote_agent == localAgent) return NIXL_SUCCESS;
        // Started, not awaited: a failure shows in the first transfer.
        auto peer = connection_to(remote_agent);
        if (!peer.ok()) NIXL_ERROR << "TCPX: connect: " << peer.status().to_string();
        return peer.ok() ? NIXL_SUCCESS : to_nixl(peer.status());
    });
}

nixl_status_t TcpxBackend::disconnect(const std::string& remote_agent) {
    return closing("disconnect", [&]() -> nixl_status_t {
        std::lock_guard<std::mutex> lock(mu_);
        drop_outbound(remote_agent);
        // NIXL disconnects only when the application invalidates the agent's metadata, and
        // loads the connection info again with the metadata: kept, it would pile up, one entry
        // per agent ever loaded.
        conn_info_.erase(remote_agent);
        return NIXL_SUCCESS;
    });
}

// --- transfers --------------------------------------------------------------------------------

nixl_status_t TcpxBackend::prepXfer(const nixl_xfer_op_t& operation, const nixl_meta_dlist_t& local,
                                    const nixl_meta_dlist_t& remote,
                                    const std::string& remote_agent, nixlBackendReqH*& handle,
                                    const nixl_opt_b_args_t* /*opt_args*/) const {
    return guarded("prepXfer", [&]() -> nixl_status_t {
        if (operation != NIXL_WRITE && operation != NIXL_READ) return NIXL_ERR_INVALID_PARAM;
        if (!is_memory(local.getType()) || !is_memory(remote.getType())) {
            return NIXL_ERR_NOT_SUPPORTED;
        }
        if (local.descCount() != remote.descCount()) return NIXL_ERR_MISMATCH;
        auto req = std::make_unique<Request>();
        req->op = operation;
        req->agent = remote_agent;
        req->local = remote_agent == localAgent;
        const int n = local.descCount();
        for (int i = 0; i < n; ++i) {
            const nixlMetaDesc& l = local[i];
            const nixlMetaDesc& r = remote[i];
            if (l.len != r.len) return NIXL_ERR_MISMATCH;
            const auto* lmd = dynamic_cast<const LocalMD*>(l.metadataP);
            if (lmd == nullptr) return NIXL_ERR_INVALID_PARAM;
            auto loff = offset_in(l.addr, l.len, lmd->desc.addr, lmd->desc.len);
            if (!loff) return NIXL_ERR_INVALID_PARAM;
            if (req->local) {
                const auto* rmd = dynamic_cast<const LocalMD*>(r.metadataP);
                if (rmd == nullptr) return NIXL_ERR_INVALID_PARAM;
                auto roff = offset_in(r.addr, r.len, rmd->desc.addr, rmd->desc.len);
                if (!roff) return NIXL_ERR_INVALID_PARAM;
                // WRITE copies local -> remote; READ remote -> local.
                req->copies.push_back(operation == NIXL_WRITE
                                          ? LocalCopy{rmd->mem, *roff, lmd->mem, *loff, l.len}
                                          : LocalCopy{lmd->mem, *loff, rmd->mem, *roff, l.len});
            } else {
                const auto* rmd = dynamic_cast<const RemoteMD*>(r.metadataP);
                if (rmd == nullptr || rmd->agent != remote_agent) return NIXL_ERR_INVALID_PARAM;
                auto roff = offset_in(r.addr, r.len, rmd->desc.addr, rmd->desc.len);
                if (!roff) return NIXL_ERR_INVALID_PARAM;
                IoVec v;
                v.mem = lmd->mem;
                v.offset = *loff;
                v.remote = rmd->desc;
                v.remote_offset = *roff;
                v.len = l.len;
                req->iov.push_back(v);
            }
        }
        handle = req.release();
        return NIXL_SUCCESS;
    });
}

nixl_status_t TcpxBackend::postXfer(const nixl_xfer_op_t& operation,
                                    const nixl_meta_dlist_t& /*local*/,
                                    const nixl_meta_dlist_t& /*remote*/,
                                    const std::string& remote_agent, nixlBackendReqH*& handle,
                                    const nixl_opt_b_args_t* opt_args) const {
    return closing("postXfer", [&]() -> nixl_status_t {
        auto* req = dynamic_cast<Request*>(handle);
        if (req == nullptr || req->op != operation || req->agent != remote_agent) {
            return NIXL_ERR_INVALID_PARAM;
        }
        reap_abandoned();
        // Reposted before its completion was reported: only if it has completed meanwhile.
        if (req->active && checkXfer(req) == NIXL_IN_PROG) return NIXL_ERR_REPOST_ACTIVE;
        return start(req, opt_args);
    });
}

nixl_status_t TcpxBackend::start(Request* req, const nixl_opt_b_args_t* opt_args) const {
    const bool notify = opt_args != nullptr && opt_args->hasNotif;
    req->refusal.reset();
    // Reposted after a failed release (NIXL allows it once the handle's status is an error):
    // a new transfer, released anew.
    unreserve_abandon(req);
    req->release_failed = false;
    req->cancelled = false;
    if (req->local) {
        Status st = ep_->copy(req->copies);
        if (!st.ok()) {
            NIXL_ERROR << "TCPX: local transfer: " << st.to_string();
            return to_nixl(st);
        }
        if (notify) {
            std::lock_guard<std::mutex> lock(mu_);
            local_notifs_.emplace_back(localAgent, opt_args->notifMsg);
        }
        return NIXL_SUCCESS;
    }
    auto peer = connection_to(req->agent);
    if (!peer.ok()) {
        NIXL_ERROR << "TCPX: postXfer: " << peer.status().to_string();
        // NIXL posts only to an agent whose metadata it loaded (and we took): unknown here, its
        // connection info was forgotten. As a connection lost, so that NIXL invalidates the
        // agent and the application loads its metadata again (NOT_FOUND would leave NIXL
        // believing it loaded, and every later post failing the same way).
        return peer.status().code() == StatusCode::kNotFound ? NIXL_ERR_REMOTE_DISCONNECT
                                                             : to_nixl(peer.status());
    }
    // The engine delivers the notification either way: a WRITE's once its data is in the
    // target's memory, a READ's once its data is in ours (sent by whatever makes progress here,
    // with no checkXfer needed).
    std::optional<std::string_view> notif;
    if (notify) notif = opt_args->notifMsg;
    StatusOr<XferId> x = req->op == NIXL_WRITE ? ep_->writev(*peer, req->iov, notif)
                                               : ep_->readv(*peer, req->iov, notif);
    if (!x.ok()) return failed("postXfer", req->agent, *peer, x.status());
    req->peer = *peer;
    req->xfer = *x;
    req->active = true;
    return NIXL_IN_PROG;
}

nixl_status_t TcpxBackend::checkXfer(nixlBackendReqH* handle) const {
    return closing("checkXfer", [&]() -> nixl_status_t {
        auto* req = dynamic_cast<Request*>(handle);
        if (req == nullptr) return NIXL_ERR_INVALID_PARAM;
        reap_abandoned();
        if (!req->active) return NIXL_SUCCESS;
        if (!req->refusal) {
            XferStatus s = ep_->poll(req->xfer);
            if (s.state == XferState::kInProgress) return NIXL_IN_PROG;
            if (s.state == XferState::kDone) {
                req->active = false;
                return NIXL_SUCCESS;
            }
            if (req->release_failed && s.error.code() == StatusCode::kCancelled) {
                req->active = false;  // (our cancel, from a failed release: the caller knows why)
                return NIXL_ERR_CANCELED;
            }
            if (s.error.code() != StatusCode::kNotFound) {
                req->active = false;
                return failed("transfer", req->agent, req->peer, s.error);
            }
            req->refusal = s.error;
            req->refused_at = std::chrono::steady_clock::now();
        }
        // Refused as naming unknown memory: the target going away, or a bad descriptor?
        if (!connection_lost(req->peer) &&
            std::chrono::steady_clock::now() - req->refused_at < kRefusalGrace) {
            return NIXL_IN_PROG;
        }
        req->active = false;
        return failed("transfer", req->agent, req->peer,
                      *std::exchange(req->refusal, std::nullopt));
    });
}

nixl_status_t TcpxBackend::releaseReqH(nixlBackendReqH* handle) const {
    return guarded("releaseReqH", [&]() -> nixl_status_t {
        auto* req = dynamic_cast<Request*>(handle);
        if (req == nullptr) return NIXL_ERR_INVALID_PARAM;
        // NIXL's contract: a release cancels the transfer, or fails if it cannot. After a failed
        // one NIXL keeps its handle with our error as its status (getXferStatus no longer asks
        // us; a repost may start it again once it has ended), and the next release frees the
        // handle whatever we answer: so this one is marked before anything here can fail, and
        // room for the note of a transfer left in flight is reserved before anything else, so
        // that the next release frees the request without allocating.
        const bool again = std::exchange(req->release_failed, true);
        if (req->active && !req->refusal) {
            if (!again) reserve_abandon(req);
            // (A refused request has finished in the engine: nothing to wait for. poll() takes
            // the outcome of one that has finished.)
            if (ep_->poll(req->xfer).state == XferState::kInProgress) {
                // Released in flight: the application means to abort it, and may reuse the
                // memory once the release succeeds. The engine cancels it: a READ's chunks not
                // yet on their way land in scratch and its notification is never delivered; a
                // WRITE's data, once its request is out, is sent whole (the target waits for it).
                Status c;
                if (!req->cancelled) {
                    c = ep_->cancel(req->xfer);  // (out of memory: RESOURCE_EXHAUSTED, not done)
                    req->cancelled = c.ok() || c.code() == StatusCode::kUnavailable ||
                                     c.code() == StatusCode::kFailedPrecondition;
                }
                if (again) {
                    // NIXL frees its handle now: the engine ends the transfer on its own, and
                    // its outcome is taken then.
                    abandon(req);
                } else if (!c.ok() && c.code() != StatusCode::kFailedPrecondition) {
                    // Still touching memory: chunks on their way land first (a window's worth),
                    // or a WRITE's data is still being read and sent (UNAVAILABLE); or out of
                    // memory. The release fails (releaseXferReq answers NIXL_ERR_REPOST_ACTIVE)
                    // and NIXL keeps the handle.
                    if (c.code() == StatusCode::kUnavailable) return NIXL_ERR_REPOST_ACTIVE;
                    NIXL_ERROR << "TCPX: releaseReqH: " << c.to_string();
                    return to_nixl(c);
                } else {
                    (void)ep_->poll(req->xfer);  // (takes its CANCELLED, or the outcome reached)
                }
            }
        }
        unreserve_abandon(req);
        delete req;
        return NIXL_SUCCESS;
    });
}

void TcpxBackend::reserve_abandon(Request* req) const {
    std::lock_guard<std::mutex> lock(mu_);
    if (req->reserved) return;
    // (capacity >= size + abandon_reserved_ holds: reap_abandoned's erase keeps the capacity)
    abandoned_.reserve(abandoned_.size() + abandon_reserved_ + 1);
    ++abandon_reserved_;
    req->reserved = true;
}

void TcpxBackend::unreserve_abandon(Request* req) const {
    if (!req->reserved) return;
    std::lock_guard<std::mutex> lock(mu_);
    --abandon_reserved_;
    req->reserved = false;
}

void TcpxBackend::abandon(Request* req) const {
    std::lock_guard<std::mutex> lock(mu_);
    if (req->reserved) {
        --abandon_reserved_;  // (its room: the push below does not allocate)
        req->reserved = false;
    } else {
        // (Its reservation failed: room of its own, not another request's.)
        abandoned_.reserve(abandoned_.size() + abandon_reserved_ + 1);
    }
    abandoned_.push_back(req->xfer);
    any_abandoned_.store(true, std::memory_order_release);
    req->active = false;
}

void TcpxBackend::reap_abandoned() const {
    // (Without mu_ where none is abandoned, as almost always: every checkXfer and postXfer
    // comes here.)
    if (!any_abandoned_.load(std::memory_order_acquire)) return;
    std::lock_guard<std::mutex> lock(mu_);
    std::erase_if(abandoned_,
                  [&](XferId x) { return ep_->poll(x).state != XferState::kInProgress; });
    any_abandoned_.store(!abandoned_.empty(), std::memory_order_release);
}

// --- notifications ----------------------------------------------------------------------------

nixl_status_t TcpxBackend::getNotifs(notif_list_t& notif_list) {
    return closing("getNotifs", [&]() -> nixl_status_t {
        // Exactly once, even out of memory: nothing is moved into notif_list (which NIXL drops
        // when we fail) until there is room for all of it; what cannot be delivered now stays,
        // in pending_ and local_notifs_, for the next call.
        reap_abandoned();
        std::lock_guard<std::mutex> lock(mu_);
        harvest_inbound();
        if (pending_.empty()) {
            // (Older than anything the engine still holds: those wait there meanwhile.)
            pending_ = ep_->get_notifications();
            ++fetches_;
            // Peers whose first notifications these are: decided on before they are delivered.
            if (!pending_.empty()) harvest_inbound();
        }
        // Judged first, all of them: a judgement that fails (out of memory in the engine's
        // checks) fails this call with pending_ untouched, delivered by the next.
        std::vector<char> drop(pending_.size());
        size_t dropped = 0;
        for (size_t i = 0; i < pending_.size(); ++i) {
            drop[i] = deliverable(pending_[i]) ? 0 : 1;
            dropped += static_cast<size_t>(drop[i]);
        }
        size_t kept = 0;
        for (size_t i = 0; i < pending_.size(); ++i) {
            if (drop[i] == 0 && kept++ != i) pending_[kept - 1] = std::move(pending_[i]);
        }
        pending_.resize(kept);  // (shrinks: no allocation)
        notif_list.reserve(notif_list.size() + pending_.size() + local_notifs_.size());
        for (Notification& n : pending_) {
            notif_list.emplace_back(std::move(n.peer), std::move(n.payload));
        }
        pending_.clear();
        for (auto& n : local_notifs_) notif_list.push_back(std::move(n));
        local_notifs_.clear();
        // Everything the closed connections sent before this call's engine fetch is decided on.
        std::erase_if(closed_, [&](const auto& c) { return c.second.fetches < fetches_; });
        if (dropped != 0) {
            try {
                NIXL_WARN << "TCPX: dropped " << dropped
                          << " notification(s) from refused connections";
            } catch (...) {
                // Delivered already: a message is not worth failing the call for.
            }
        }
        return NIXL_SUCCESS;
    });
}

nixl_status_t TcpxBackend::genNotif(const std::string& remote_agent, const std::string& msg) const {
    return closing("genNotif", [&]() -> nixl_status_t {
        if (remote_agent == localAgent) {
            std::lock_guard<std::mutex> lock(mu_);
            local_notifs_.emplace_back(localAgent, msg);
            return NIXL_SUCCESS;
        }
        auto peer = connection_to(remote_agent);
        if (!peer.ok()) {
            NIXL_ERROR << "TCPX: genNotif: " << peer.status().to_string();
            return to_nixl(peer.status());
        }
        // Sent at once, or once the connection is made.
        Status st = ep_->notify(*peer, msg);
        return st.ok() ? NIXL_SUCCESS : failed("genNotif", remote_agent, *peer, st);
    });
}

}  // namespace tcpx::nixl_backend
