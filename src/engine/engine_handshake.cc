// A peer's way to kReady (engine.h, Peer::State): its control connection, authentication
// (auth.h), the HELLO exchange, and its data channels. Everything a peer sends before it is ready
// is read here, in small bounded messages, and nothing of it reaches a transport unchecked.
#include <netinet/in.h>
#include <sys/epoll.h>

#include <algorithm>
#include <cstring>
#include <optional>

#include "common/log.h"
#include "common/status_util.h"
#include "common/strings.h"
#include "engine/auth.h"
#include "engine/ctrl_wire.h"
#include "engine/engine.h"
#include "engine/metadata.h"

namespace tcpx {

using engine::Clock;
using State = engine::Peer::State;
namespace wire = engine::wire;
namespace auth = engine::auth;

namespace {

std::string_view view(const auth::Bytes& b) {
    return std::string_view(reinterpret_cast<const char*>(b.data()), b.size());
}

}  // namespace

// --- connections
// -----------------------------------------------------------------------------------

Status Endpoint::Impl::watch(const Peer& p, bool writable) {
    epoll_event ev{};
    ev.events = EPOLLIN | (writable ? EPOLLOUT : 0u);
    ev.data.u64 = p.id;
    if (::epoll_ctl(epfd_, EPOLL_CTL_MOD, p.ctrl.fd(), &ev) != 0) {
        return errno_status(errno, "epoll_ctl");
    }
    return Status();
}

StatusOr<Endpoint::Impl::Peer*> Endpoint::Impl::add_peer(Fd fd, bool outbound,
                                                         const SocketAddress& address) {
    auto p = std::make_unique<Peer>();
    p->id = next_peer_++;
    p->outbound = outbound;
    p->address = address;
    p->name = address.to_string();
    p->started = p->last_recv = p->last_send = Clock::now();
    p->deadline = engine::deadline_after(std::chrono::milliseconds(
        outbound ? config_.connect_timeout_ms : config_.handshake_timeout_ms));
    p->ctrl.reset(std::move(fd));
    p->ctrl.set_room(&ctrl_room_);
    p->ctrl.set_reply_room(&reply_room_);
    if (outbound) {
        p->state = State::kConnecting;
    } else {
        p->state = secrets_.enabled() ? State::kAuthInit : State::kHello;
    }
    epoll_event ev{};
    // Outbound: writable when the connect completes (no polling while it is in progress).
    ev.events = EPOLLIN | (outbound ? EPOLLOUT : 0u);
    ev.data.u64 = p->id;
    if (::epoll_ctl(epfd_, EPOLL_CTL_ADD, p->ctrl.fd(), &ev) != 0) {
        return errno_status(errno, "epoll_ctl");
    }
    Peer* raw = p.get();
    peers_.emplace(p->id, std::move(p));
    return raw;
}

bool Endpoint::Impl::evict_stalest_handshake(const char* limit, const Peer* except,
                                             bool before_hello_only) {
    // The oldest inbound connection still in its handshake that has not proved the shared secret
    // (without a secret: the oldest of them all). A real peer finishes its handshake in a few
    // round trips, so under a flood of connections that never finish the oldest is one of the
    // flood; a peer that has proved the secret is never closed for a stranger.
    // Connections that have not yet sent a HELLO go first: a peer setting up its channels has
    // at least spoken the protocol.
    Peer* stalest = nullptr;
    for (const auto& [id, p] : peers_) {
        if (p->outbound || p->authenticated || !in_handshake(*p) || p.get() == except) continue;
        if (before_hello_only &&
            (!before_hello(*p) || Clock::now() - p->started < kSocketBudgetMinAge)) {
            continue;
        }
        if (stalest == nullptr ||
            std::pair(p->state == State::kChannels, p->started) <
                std::pair(stalest->state == State::kChannels, stalest->started)) {
            stalest = p.get();
        }
    }
    if (stalest == nullptr) return false;
    const auto held =
        std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - stalest->started);
    if (may_log_stranger_event()) {
        TCPX_WARN(
            "endpoint '%s': connection from %s closed after %lld ms in its handshake, for a "
            "newer one: TCPX_P2P_%s reached",
            name_.c_str(), stalest->address.to_string().c_str(),
            static_cast<long long>(held.count()), limit);
    }
    fail_peer(*stalest, unavailable(strformat("closed in its handshake for a newer connection "
                                              "(TCPX_P2P_%s reached)",
                                              limit)));
    settle_peer(*stalest);
    peers_.erase(stalest->id);  // inbound, never accepted: nobody is to be told
    return true;
}

void Endpoint::Impl::accept_inbound() {
    // Bounded: what strangers can make us hold is MAX_PEERS peers, of which at most
    // MAX_HANDSHAKES still in their handshake (each gone after HANDSHAKE_TIMEOUT_MS). At either
    // limit a newcomer takes the place of the oldest unauthenticated handshake: connections that
    // never finish theirs delay real peers by nothing, where refusing newcomers would let a few
    // such connections per HANDSHAKE_TIMEOUT_MS keep every peer out.
    size_t handshakes = 0;
    for (const auto& [id, p] : peers_) handshakes += !p->outbound && in_handshake(*p);
    size_t live = live_peers();  // counted once a pass: each peer accepted below adds one
    for (int i = 0; i < 64; ++i) {
        // At the process's socket budget (MAX_SOCKETS), less the room one peer's data channels
        // take (so that a peer setting them up finds its places however strangers keep
        // connecting), a connection waiting takes the place of the oldest one that has not sent
        // its HELLO, as at MAX_HANDSHAKES; with none it waits in the kernel's queue.
        if (socket_budget_pressed(channel_sockets() + 1)) {
            if (!connection_waiting(listen_fd_.get())) return;
            if (!evict_for_sockets()) {
                note_room_wanted();  // (idle GPU registrations make way: progress_pass)
                // Connections that do not prove themselves soon are closed (step_peer).
                if (may_log_stranger_event()) {
                    TCPX_WARN(
                        "endpoint '%s': new connections wait: %s, the process's budget "
                        "(TCPX_P2P_MAX_SOCKETS) less a peer's channels",
                        name_.c_str(), budget_use_words().c_str());
                }
                pause_listener();
                return;
            }
            --handshakes;
            --live;
        }
        SocketAddress from;
        auto fd = accept_tcp(listen_fd_.get(), &from);
        if (!fd.ok() && fd.status().code() == StatusCode::kResourceExhausted) {
            pause_listener();  // the budget filled since the check: the connection stays queued
            return;
        }
        if (!fd.ok()) {
            if (may_log_stranger_event()) {
                TCPX_WARN("endpoint '%s': accept: %s; new connections wait %lld ms", name_.c_str(),
                          fd.status().to_string().c_str(),
                          static_cast<long long>(engine::kListenPause.count()));
            }
            pause_listener();
            return;
        }
        if (!fd->valid()) return;
        // At either limit (a MAX_PEERS below MAX_HANDSHAKES is filled by handshakes alone).
        if ((handshakes >= static_cast<size_t>(config_.max_handshakes) ||
             live >= static_cast<size_t>(config_.max_peers)) &&
            evict_stalest_handshake(
                live >= static_cast<size_t>(config_.max_peers) ? "MAX_PEERS" : "MAX_HANDSHAKES")) {
            --handshakes;
            --live;  // (it failed at once: a handshake holds no transport comm)
        }
        const char* full = nullptr;
        if (live >= static_cast<size_t>(config_.max_peers)) {
            full = "MAX_PEERS";
        } else if (handshakes >= static_cast<size_t>(config_.max_handshakes)) {
            full = "MAX_HANDSHAKES";
        }
        if (full != nullptr) {
            if (may_log_stranger_event()) {
                TCPX_WARN("endpoint '%s': connection from %s closed: TCPX_P2P_%s reached",
                          name_.c_str(), from.to_string().c_str(), full);
            }
            continue;  // the Fd closes it
        }
        (void)set_nodelay(fd->get());
        (void)set_dead_peer_timeout(fd->get(), config_.socket_timeout_ms);
        auto p = add_peer(std::move(fd).value(), false, from);
        if (!p.ok()) {
            TCPX_WARN("endpoint '%s': %s", name_.c_str(), p.status().to_string().c_str());
            continue;
        }
        ++handshakes;
        ++live;
        TCPX_DEBUG("endpoint '%s': connection from %s", name_.c_str(), from.to_string().c_str());
    }
}

StatusOr<PeerId> Endpoint::Impl::connect_async(std::string_view metadata) {
    TCPX_ASSIGN_OR_RETURN(engine::EndpointAddress addr, engine::decode_metadata(metadata));
    PeerId id;
    {
        auto lock = api_lock();
        // Strangers still in their handshake make way for the application's own connection.
        if (const size_t live = live_peers(); live >= static_cast<size_t>(config_.max_peers) &&
                                              !evict_stalest_handshake("MAX_PEERS")) {
            return resource_exhausted(
                strformat("connect: %zu peers already (TCPX_P2P_MAX_PEERS)", live));
        }
        if (socket_budget_full()) (void)evict_for_sockets();
        TCPX_ASSIGN_OR_RETURN(Fd fd, start_connect(addr.address));
        TCPX_ASSIGN_OR_RETURN(Peer * p, add_peer(std::move(fd), true, addr.address));
        id = p->id;
        p->name = p->expected_name = addr.name;
        p->expected_nonce = addr.nonce;
        p->known_to_user = true;
        // Our listeners for its channels are opened when our HELLO goes (send_hello): with a
        // shared secret, only once the peer has proved it.
    }
    wake();
    return id;
}

StatusOr<PeerId> Endpoint::Impl::connect(std::string_view metadata) {
    TCPX_ASSIGN_OR_RETURN(engine::EndpointAddress addr, engine::decode_metadata(metadata));
    TCPX_ASSIGN_OR_RETURN(PeerId id, connect_async(metadata));
    drive(
        [&] {
            auto it = peers_.find(id);
            return it == peers_.end() || it->second->state == State::kReady ||
                   it->second->state == State::kFailed;
        },
        Clock::time_point::max());  // the peer's own handshake deadline ends it
    auto lock = api_lock();
    auto it = peers_.find(id);
    if (it == peers_.end()) return unavailable("connect: the connection went away");
    Peer& p = *it->second;
    if (p.state == State::kReady) return id;
    Status why = p.state == State::kFailed
                     ? p.error
                     : timeout_error(strformat("not ready after %lld ms",
                                               static_cast<long long>(config_.connect_timeout_ms)));
    if (p.state != State::kFailed) fail_peer(p, why);
    settle_peers(lock, {id});
    if (it = peers_.find(id); it != peers_.end()) peers_.erase(it);
    return why.with_context("connect to '" + addr.name + "' at " + addr.address.to_string());
}

// --- the handshake
// ---------------------------------------------------------------------------------

void Endpoint::Impl::refuse(Peer& p, Status why) {
    if (p.ctrl.valid()) {
        p.ctrl.queue(wire::encode_auth_fail(why.message()));
        (void)p.ctrl.flush();
    }
    if (!p.outbound && may_log_stranger_event()) {
        TCPX_WARN("endpoint '%s': connection from %s refused: %s", name_.c_str(),
                  p.address.to_string().c_str(), why.to_string().c_str());
    }
    fail_peer(p, std::move(why));
}

Status Endpoint::Impl::start_handshake(Peer& p) {
    (void)set_nodelay(p.ctrl.fd());
    (void)set_dead_peer_timeout(p.ctrl.fd(), config_.socket_timeout_ms);
    if (!secrets_.enabled()) return send_hello(p);
    TCPX_ASSIGN_OR_RETURN(auth::Bytes nonce, auth::make_nonce());
    p.nonce_c = std::string(view(nonce));
    wire::AuthInit init;
    init.nonce = p.nonce_c;
    init.name = name_;
    send_ctrl(p, wire::encode_auth_init(init));
    p.state = State::kAuthChallenge;
    return Status();
}

Status Endpoint::Impl::send_hello(Peer& p) {
    if (p.outbound && p.listens.empty()) {
        // Not before: a transport's listener is a port anyone may connect to, and a transport
        // that cannot tell who connects to it (Google's TCPX plugin) takes the first comer as the
        // peer's data channel (docs/security.md).
        TCPX_RETURN_IF_ERROR(start_channels(p, static_cast<int>(config_.channels)));
    }
    wire::Hello hello;
    hello.channels = static_cast<uint16_t>(p.listens.size());
    hello.nonce = nonce_;
    hello.chunk = chunk_;
    hello.name = name_;
    hello.handles = p.listen_handles;
    send_ctrl(p, encode_hello(p, std::move(hello)));
    p.state = State::kHello;
    return Status();
}

std::string Endpoint::Impl::encode_hello(const Peer& p, wire::Hello hello) const {
    std::string msg = wire::encode_hello(hello);
    if (!p.authenticated) return msg;
    const auto role = p.outbound ? auth::Role::kConnector : auth::Role::kListener;
    hello.mac = std::string(view(
        auth::hello_mac(p.session_key, role, std::string_view(msg).substr(sizeof(wire::Header)))));
    return wire::encode_hello(hello);
}

Status Endpoint::Impl::dispatch_handshake(Peer& p, wire::MsgType type, std::string_view body) {
    // Each state takes exactly the message it waits for (and an AUTH_FAIL or BYE, which end it).
    switch (type) {
        case wire::MsgType::kAuthFail:
            return on_auth_fail(p, body);
        case wire::MsgType::kBye:
            return unavailable("peer disconnected");
        case wire::MsgType::kPing:
            if (p.state == State::kChannels) return Status();
            break;
        default:
            break;
    }
    switch (p.state) {
        case State::kAuthInit:
            if (type == wire::MsgType::kAuthInit) return on_auth_init(p, body);
            if (type == wire::MsgType::kHello) {
                refuse(p, unauthenticated(
                              "authentication failed: this endpoint requires a shared secret "
                              "(TCPX_P2P_AUTH_SECRET) and the peer sent none"));
                return Status();
            }
            break;
        case State::kAuthChallenge:
            if (type == wire::MsgType::kAuthChallenge) return on_auth_challenge(p, body);
            break;
        case State::kAuthProof:
            if (type == wire::MsgType::kAuthProof) return on_auth_proof(p, body);
            break;
        case State::kHello:
            if (type == wire::MsgType::kHello) return handle_hello(p, body);
            if (type == wire::MsgType::kAuthInit && !p.outbound) {
                refuse(p, unauthenticated(
                              "authentication failed: the peer requires a shared secret and "
                              "this endpoint has none (TCPX_P2P_AUTH_SECRET)"));
                return Status();
            }
            break;
        case State::kChannels:
            if (type == wire::MsgType::kReady) {
                p.ready_received = true;
                // Our channels may be up already: then we are ready now, before the peer's first
                // request (which may follow in the same read) is dispatched.
                if (p.ready_sent) become_ready(p);
                return Status();
            }
            break;
        default:
            break;
    }
    return protocol_error(
        strformat("%s before the connection was ready", wire::msg_type_name(type)));
}

Status Endpoint::Impl::on_auth_fail(Peer& p, std::string_view body) {
    std::string_view reason;
    TCPX_RETURN_IF_ERROR(wire::decode_auth_fail(body, &reason));
    // The reason is the peer's words: printable characters only reach our messages.
    fail_peer(p,
              unauthenticated("authentication failed: the peer refused us: " + printable(reason)));
    return Status();
}

Status Endpoint::Impl::on_auth_init(Peer& p, std::string_view body) {
    wire::AuthInit init;
    TCPX_RETURN_IF_ERROR(wire::decode_auth_init(body, &init));
    TCPX_ASSIGN_OR_RETURN(auth::Bytes nonce, auth::make_nonce());
    p.nonce_c = std::string(init.nonce);
    p.nonce_l = std::string(view(nonce));
    p.name = std::string(init.name);  // claimed until the proof comes
    const std::vector<auth::Bytes> macs =
        auth::ListenerCheck::challenge_macs(secrets_, p.nonce_c, p.nonce_l, p.name, name_);
    wire::AuthChallenge ch;
    ch.nonce = p.nonce_l;
    ch.name = name_;
    for (const auth::Bytes& m : macs) ch.macs.push_back(view(m));
    send_ctrl(p, wire::encode_auth_challenge(ch));
    p.state = State::kAuthProof;
    return Status();
}

Status Endpoint::Impl::on_auth_challenge(Peer& p, std::string_view body) {
    wire::AuthChallenge ch;
    TCPX_RETURN_IF_ERROR(wire::decode_auth_challenge(body, &ch));
    p.nonce_l = std::string(ch.nonce);
    auto secret =
        auth::connector_match(secrets_, ch.macs, p.nonce_c, p.nonce_l, name_, std::string(ch.name));
    if (!secret) {
        refuse(p, unauthenticated("authentication failed: the peer does not know our shared "
                                  "secret (TCPX_P2P_AUTH_SECRET)"));
        return Status();
    }
    // Authenticated: it is the endpoint it says; it must be the one we meant to reach.
    if (!p.expected_name.empty() && ch.name != p.expected_name) {
        refuse(p,
               unauthenticated(strformat("authentication failed: the endpoint at %s is '%s', "
                                         "not '%s'",
                                         p.address.to_string().c_str(),
                                         std::string(ch.name).c_str(), p.expected_name.c_str())));
        return Status();
    }
    wire::AuthProof proof;
    const auth::Bytes m =
        auth::mac(*secret, auth::Role::kConnector, p.nonce_c, p.nonce_l, name_, ch.name);
    proof.mac = view(m);
    send_ctrl(p, wire::encode_auth_proof(proof));
    p.authenticated = true;
    p.session_key = auth::session_key(*secret, p.nonce_c, p.nonce_l, name_, ch.name);
    return send_hello(p);
}

Status Endpoint::Impl::on_auth_proof(Peer& p, std::string_view body) {
    wire::AuthProof proof;
    TCPX_RETURN_IF_ERROR(wire::decode_auth_proof(body, &proof));
    const std::optional<std::string> secret =
        auth::ListenerCheck::proof_match(secrets_, proof.mac, p.nonce_c, p.nonce_l, p.name, name_);
    if (!secret) {
        const std::string claimed = p.name;
        p.name = p.address.to_string();
        refuse(p, unauthenticated(strformat("authentication failed: the peer (claiming to be "
                                            "'%s') does not know our shared secret",
                                            claimed.c_str())));
        return Status();
    }
    p.authenticated = true;
    p.session_key = auth::session_key(*secret, p.nonce_c, p.nonce_l, p.name, name_);
    p.state = State::kHello;
    return Status();
}

void Endpoint::Impl::serve_gpu(std::optional<cuda::ScopedGpu>* gpu) const {
    if (config_.gpu_index < 0 || config_.gpu_index >= cuda::device_count()) return;
    gpu->emplace(static_cast<int>(config_.gpu_index));
    if (!(*gpu)->status().ok()) {
        TCPX_LOG(kDebug, "endpoint '%s': %s", name_.c_str(), (*gpu)->status().to_string().c_str());
    }
}

Status Endpoint::Impl::start_channels(Peer& p, int channels) {
    // Transports allocate per-comm GPU memory (Google's TCPX: the receive bounce buffer) and
    // record the current GPU at listen: make it the one this endpoint serves, for this call.
    std::optional<cuda::ScopedGpu> gpu;
    serve_gpu(&gpu);
    for (int i = 0; i < channels; ++i) {
        net::Handle handle;
        net::ListenComm* listen = nullptr;
        // At the process's socket budget, a stranger still in its handshake makes way.
        if (socket_budget_full()) (void)evict_for_sockets(&p);
        TCPX_RETURN_IF_ERROR(net_->listen(rail(i), &handle, &listen));
        p.listens.push_back(listen);
        p.listen_handles.push_back(handle);
    }
    return Status();
}

Status Endpoint::Impl::check_handles(Peer& p, std::vector<net::Handle>* handles) {
    // An authenticated peer may name any address of its own host (data NICs apart from the
    // control one); a stranger may only send us back to the address it talks to us from.
    const SocketAddress must_name = p.authenticated ? SocketAddress() : p.address;
    for (size_t i = 0; i < handles->size(); ++i) {
        Status st = net_->check_peer_handle(&(*handles)[i], must_name);
        if (st.code() == StatusCode::kUnimplemented && p.authenticated) {
            static std::atomic<bool> said{false};
            if (!said.exchange(true)) {
                TCPX_INFO("transport %s cannot check handles; trusting authenticated peers'",
                          std::string(net_->name()).c_str());
            }
            continue;
        }
        if (st.code() == StatusCode::kUnimplemented) {
            return unauthenticated(
                strformat("transport %s cannot check the handles peers send: use it with a shared "
                          "secret (TCPX_P2P_AUTH_SECRET)",
                          std::string(net_->name()).c_str()));
        }
        if (!st.ok()) return st.with_context(strformat("the peer's channel %zu", i));
    }
    return Status();
}

Status Endpoint::Impl::handle_hello(Peer& p, std::string_view body) {
    wire::Hello hello;
    TCPX_RETURN_IF_ERROR(wire::decode_hello(body, &hello));
    if (hello.channels < 1 || hello.channels > 16) {
        return protocol_error(strformat("peer asks for %u channels", hello.channels));
    }
    if (hello.chunk < 4096) {
        return protocol_error(strformat("peer offers chunks of %llu bytes",
                                        static_cast<unsigned long long>(hello.chunk)));
    }
    if (p.authenticated) {
        // Everything it says (where our data channels go, how many, the chunk size) comes from
        // the peer that proved the secret, unchanged on the way.
        const auto role = p.outbound ? auth::Role::kListener : auth::Role::kConnector;
        if (!auth::equal(hello.mac, auth::hello_mac(p.session_key, role,
                                                    wire::hello_signed_part(body, hello)))) {
            return unauthenticated(hello.mac.empty()
                                       ? "authentication failed: the peer's HELLO has no MAC"
                                       : "authentication failed: the peer's HELLO has a wrong "
                                         "MAC (changed on the way?)");
        }
    } else if (!hello.mac.empty()) {
        return protocol_error("a HELLO with a MAC on a connection that is not authenticated");
    }
    if (p.authenticated && hello.name != p.name && !p.outbound) {
        return protocol_error("HELLO names another endpoint than the one authenticated");
    }
    TCPX_RETURN_IF_ERROR(check_handles(p, &hello.handles));
    if (!p.outbound) {
        // We answer with as many channels as both sides want, and listeners for ours.
        p.name = hello.name;
        p.channels = std::min<int>(hello.channels, static_cast<int>(config_.channels));
        p.remote_handles.assign(hello.handles.begin(), hello.handles.begin() + p.channels);
        p.chunk = std::min(hello.chunk, chunk_);
        TCPX_RETURN_IF_ERROR(start_channels(p, p.channels));
        wire::Hello reply;
        reply.channels = static_cast<uint16_t>(p.channels);
        reply.nonce = nonce_;
        reply.chunk = p.chunk;
        reply.name = name_;
        reply.handles = p.listen_handles;
        send_ctrl(p, encode_hello(p, std::move(reply)));
    } else {
        if (hello.channels > p.listens.size()) {
            return protocol_error(strformat("peer answered with %u channels, we offered %zu",
                                            hello.channels, p.listens.size()));
        }
        if (hello.chunk > chunk_) {
            return protocol_error(
                strformat("peer answered with chunks of %llu bytes, we offered %llu",
                          static_cast<unsigned long long>(hello.chunk),
                          static_cast<unsigned long long>(chunk_)));
        }
        if (p.authenticated && hello.name != p.expected_name) {
            return protocol_error("HELLO names another endpoint than the one authenticated");
        }
        // Without a secret the name proves nothing, but a listener of another name, or of the
        // same name with another endpoint nonce (one made since), is not the endpoint the
        // metadata describes: stale metadata, whose endpoint is gone and whose port another took.
        // Its memory descriptors and notifications are not the application's to mix up with the
        // one it meant. UNAVAILABLE, as for an endpoint not there at all (FAILED_PRECONDITION is
        // peer_status()'s "still connecting").
        if (!p.expected_name.empty() && hello.name != p.expected_name) {
            return unavailable(strformat(
                "the endpoint at %s is '%s', not '%s' named by the metadata (stale metadata: "
                "that endpoint is gone)",
                p.address.to_string().c_str(), hello.name.c_str(), p.expected_name.c_str()));
        }
        if (p.expected_nonce != 0 && hello.nonce != p.expected_nonce) {
            return unavailable(strformat(
                "the endpoint '%s' at %s is not the one the metadata describes, but one made since "
                "under its name (stale metadata)",
                hello.name.c_str(), p.address.to_string().c_str()));
        }
        p.name = hello.name;
        p.channels = hello.channels;
        p.chunk = hello.chunk;
        p.remote_handles = hello.handles;
        while (p.listens.size() > static_cast<size_t>(p.channels)) {
            (void)net_->close_listen(p.listens.back());
            p.listens.pop_back();
            p.listen_handles.pop_back();
        }
    }
    p.tx.resize(static_cast<size_t>(p.channels));
    p.rx.resize(static_cast<size_t>(p.channels));
    p.state = State::kChannels;
    p.channels_since = Clock::now();
    return Status();
}

bool Endpoint::Impl::progress_handshake(Peer& p) {
    if (p.state == State::kConnecting) {
        bool done = false;
        Status st = finish_connect(p.ctrl.fd(), p.address, &done);
        if (st.ok() && !done) return false;
        if (st.ok()) st = watch(p, false);  // connected: readable is all we wait for now
        if (st.ok()) st = start_handshake(p);
        if (!st.ok()) fail_peer(p, st);
        return true;
    }
    if (p.state != State::kChannels) return false;
    bool did = false;
    bool all = true;
    std::optional<cuda::ScopedGpu> gpu;  // as in start_channels: connect and accept allocate too
    serve_gpu(&gpu);
    // At the process's socket budget, connections that have not sent their HELLO make way for
    // this peer's sockets; a connect that finds no room (it opens all its sockets or none) is
    // tried again on a later pass until the handshake's deadline, which then says why, and the
    // listeners leave the peer's sockets in the kernel's queue until there is.
    if (socket_budget_full()) (void)evict_for_sockets(&p);
    for (int i = 0; i < p.channels; ++i) {
        Channel& tx = p.tx[static_cast<size_t>(i)];
        Channel& rx = p.rx[static_cast<size_t>(i)];
        if (tx.send == nullptr) {
            Status st = net_->connect(rail(i), &p.remote_handles[static_cast<size_t>(i)], &tx.send,
                                      nullptr);
            if (st.code() == StatusCode::kResourceExhausted) {
                p.no_room = st;
                (void)evict_for_sockets(&p);
                st = Status();
            }
            if (!st.ok()) {
                fail_peer(p, st.with_context("opening a data channel"));
                return true;
            }
            did |= tx.send != nullptr;
        }
        if (rx.recv == nullptr) {
            Status st = net_->accept(p.listens[static_cast<size_t>(i)], &rx.recv, &rx.dev_handle);
            if (!st.ok()) {
                fail_peer(p, st.with_context("accepting a data channel"));
                return true;
            }
            did |= rx.recv != nullptr;
        }
        all = all && tx.send != nullptr && rx.recv != nullptr;
    }
    if (!all) return did;
    for (net::ListenComm* l : p.listens) (void)net_->close_listen(l);
    p.listens.clear();
    if (!p.ready_sent) {
        send_ctrl(p, wire::encode_empty(wire::MsgType::kReady));
        p.ready_sent = true;
    }
    if (p.ready_received) become_ready(p);
    return true;
}

void Endpoint::Impl::become_ready(Peer& p) {
    p.state = State::kReady;
    // From now on the peer's requests may be as large as MAX_CTRL_MESSAGE, plus a transfer's
    // bytes inline (at most the largest inline limit a peer can be configured with).
    p.ctrl.set_max_message(static_cast<uint32_t>(config_.max_ctrl_message), wire::kMaxInlineData);
    const auto now = Clock::now();
    for (Channel& ch : p.tx) ch.last_progress = now;
    for (Channel& ch : p.rx) ch.last_progress = now;
    p.last_answer = now;
    p.last_tick = now;
    // The peer's clock starts now: until we were ready it had nothing to say (its READY may
    // have come long before our side of the handshake ended, which has its own deadline), and
    // it sends heartbeats only once it is ready itself.
    p.last_recv = now;
    TCPX_DEBUG("endpoint '%s': peer '%s' ready (%d channels%s)", name_.c_str(), p.name.c_str(),
               p.channels, p.authenticated ? ", authenticated" : "");
    // What was posted while connecting goes out now, in order.
    std::deque<std::function<void()>> deferred = std::move(p.deferred);
    p.deferred.clear();
    for (auto& issue : deferred) issue();
    if (!p.outbound) {
        p.in_accept_queue = true;
        accept_queue_.push_back(p.id);
    }
    wake_waiters();  // connect() waits for this peer, accept() for the queue
}

}  // namespace tcpx
