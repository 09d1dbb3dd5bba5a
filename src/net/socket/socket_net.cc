#include "net/socket/socket_net.h"

#include <net/if.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstring>
#include <memory>
#include <thread>
#include <type_traits>

#include "common/log.h"
#include "common/random.h"
#include "common/status_util.h"
#include "common/strings.h"
#include "common/topology.h"
#include "net/socket/io_pool.h"
#include "net/socket/socket_comm.h"
#include "net/socket/wire.h"

namespace tcpx::net {

using socket_internal::Comm;
using socket_internal::CommConfig;
using socket_internal::ReqBase;
using Clock = std::chrono::steady_clock;

namespace {

// The protocol's bound on data sockets per comm (NSOCKS's range).
constexpr int kMaxSocketsPerComm = 64;

constexpr int kListenBacklog = 1024;
// Inbound sockets in handshake (pending or grouped) per listener; more are closed at once.
constexpr size_t kMaxHandshaking = 1024;
// Comms being set up through one listener at once (each of up to kMaxSocketsPerComm + 1
// sockets): see advance_handshakes.
constexpr size_t kMaxGroupsInProgress = 4;
// Connections accepted per accept() call, so one call stays short under a connection storm.
constexpr int kAcceptsPerCall = 64;

constexpr uint32_t kListenMagic = 0x4c534e54;  // "TNSL"
constexpr uint32_t kMrMagic = 0x4d524d54;      // "TMRM"

struct MrRecord {
    uint32_t magic = kMrMagic;
    void* data = nullptr;
    size_t size = 0;
    void* comm = nullptr;  // registered with
    // hint_device_reads(): receives into it are written back out of the CPU's caches. Set by the
    // thread that posts the receives, before it posts them.
    bool device_reads = false;
};

struct Pending {
    Fd fd;
    SocketAddress peer;
    wire::Hello hello{};
    size_t got = 0;
    Clock::time_point since;
};

struct Group {
    Fd control;
    std::vector<Fd> data;
    int have_data = 0;
    uint16_t nsocks = 0;  // the connector's data sockets: at most the listener's
    SocketAddress peer;
    Clock::time_point since;
};

struct SocketListen {
    uint32_t magic = kListenMagic;
    int dev = 0;
    Fd fd;
    SocketAddress addr;
    uint64_t nonce = 0;
    uint16_t nsocks = 0;
    std::mutex mu;  // accept() may be called from several threads
    std::vector<Pending> pending;
    std::unordered_map<uint64_t, Group> groups;
    size_t grouped_sockets = 0;
};

CommConfig comm_config(const Settings& s) {
    CommConfig c;
    // Whole units of wire::kChunkAlign (both are at least one), as the receiver requires.
    c.chunk_size = s.chunk_size / wire::kChunkAlign * wire::kChunkAlign;
    c.min_chunk_size = s.min_chunk_size / wire::kChunkAlign * wire::kChunkAlign;
    c.inline_threshold = std::min<uint64_t>(s.inline_threshold, wire::kMaxInlineSize);
    c.max_requests = static_cast<int>(s.max_requests);
    c.rcvlowat = s.socket_rcvlowat;
    return c;
}

Status configure_socket(int fd, const Settings& s) {
    TCPX_RETURN_IF_ERROR(set_nodelay(fd));
    TCPX_RETURN_IF_ERROR(set_buffer_sizes(fd, s.socket_sndbuf, s.socket_rcvbuf));
    return set_dead_peer_timeout(fd, s.socket_timeout_ms);
}

// Best effort: tells a refused connector why, then the caller closes the socket.
void send_reply(int fd, wire::ReplyStatus status) {
    const wire::HelloReply reply{wire::kReplyMagic, wire::kVersion, static_cast<uint16_t>(status)};
    const iovec iov{const_cast<wire::HelloReply*>(&reply), sizeof(reply)};
    (void)send_some(fd, &iov, 1);
}

// Reads what the listener's connections in handshake have sent: each is dropped once it has
// ended or its `timeout` has passed, refused with a reply when its hello is wrong, or joins its
// comm's group.
void advance_handshakes(SocketListen* l, Clock::time_point now, std::chrono::milliseconds timeout) {
    for (size_t i = 0; i < l->pending.size();) {
        Pending& p = l->pending[i];
        auto drop = [&] {
            p = std::move(l->pending.back());
            l->pending.pop_back();
        };
        bool eof = false;
        auto n = recv_some(p.fd.get(), reinterpret_cast<uint8_t*>(&p.hello) + p.got,
                           sizeof(p.hello) - p.got, &eof);
        if (!n.ok() || eof) {
            if (may_log_stranger_event()) {
                TCPX_INFO("connection from %s closed during its handshake: %s",
                          p.peer.to_string().c_str(),
                          n.ok() ? "end of stream" : n.status().to_string().c_str());
            }
            drop();
            continue;
        }
        p.got += *n;
        if (p.got < sizeof(p.hello)) {
            if (now - p.since > kSocketBudgetGrace && socket_budget_full()) {
                if (may_log_stranger_event()) {
                    TCPX_WARN(
                        "closing connection from %s: no handshake after %lld ms, and the "
                        "process's TCP sockets are at their bound (TCPX_P2P_MAX_SOCKETS)",
                        p.peer.to_string().c_str(),
                        static_cast<long long>(kSocketBudgetGrace.count()));
                }
                drop();
                continue;
            }
            if (now - p.since > timeout) {
                if (may_log_stranger_event()) {
                    TCPX_WARN(
                        "closing connection from %s: no complete handshake within %lld ms "
                        "(%zu of %zu bytes)",
                        p.peer.to_string().c_str(), static_cast<long long>(timeout.count()), p.got,
                        sizeof(p.hello));
                }
                drop();
                continue;
            }
            ++i;
            continue;
        }
        const wire::Hello& h = p.hello;
        const std::optional<wire::ReplyStatus> verdict = wire::check_hello(h, l->nonce, l->nsocks);
        if (!verdict) {
            if (may_log_stranger_event()) {
                TCPX_WARN("refused connection from %s: not a tcpx-p2p handshake (first bytes %s)",
                          p.peer.to_string().c_str(), to_hex(&h, 8).c_str());
            }
            drop();
            continue;
        }
        wire::ReplyStatus refuse = *verdict;
        Group* group = nullptr;
        if (refuse == wire::ReplyStatus::kAccepted && l->groups.count(h.comm_nonce) == 0 &&
            l->groups.size() >= kMaxGroupsInProgress) {
            // A listener's handle goes to one peer, which sets up one comm through it (the
            // engine and NCCL accept one per listen): a peer that knows the nonce and starts
            // comm after comm without finishing them would otherwise hold up to 1024 sockets
            // here, grouped and never closed for a newcomer, the whole socket budget.
            refuse = wire::ReplyStatus::kBusy;
        }
        if (refuse == wire::ReplyStatus::kAccepted) {
            auto [it, fresh] = l->groups.try_emplace(h.comm_nonce);
            group = &it->second;
            if (fresh) {
                group->nsocks = h.nsocks;
                group->data.resize(h.nsocks);
                group->peer = p.peer;
                group->since = now;
            }
            if (h.nsocks != group->nsocks) {
                refuse = wire::ReplyStatus::kBadHello;  // its sockets disagree on their count
            }
        }
        if (refuse == wire::ReplyStatus::kAccepted) {
            Fd& slot = h.role == static_cast<uint16_t>(wire::Role::kControl) ? group->control
                                                                             : group->data[h.index];
            if (slot.valid()) {
                refuse = wire::ReplyStatus::kBadHello;  // a socket of this role arrived twice
            } else {
                slot = std::move(p.fd);
                ++l->grouped_sockets;
                if (h.role == static_cast<uint16_t>(wire::Role::kData)) ++group->have_data;
            }
        }
        if (refuse != wire::ReplyStatus::kAccepted) {
            if (may_log_stranger_event()) {
                TCPX_WARN("refused connection from %s: %s (its version %u, ours %u)",
                          p.peer.to_string().c_str(), wire::reply_status_text(refuse), h.version,
                          wire::kVersion);
            }
            send_reply(p.fd.get(), refuse);
        }
        drop();
    }
}

StatusOr<SocketAddress> handle_address(const wire::HandleBlob& blob) {
    sockaddr_storage ss{};
    socklen_t len = 0;
    if (blob.family == AF_INET) {
        auto* in = reinterpret_cast<sockaddr_in*>(&ss);
        in->sin_family = AF_INET;
        std::memcpy(&in->sin_addr, blob.addr, 4);
        len = sizeof(sockaddr_in);
    } else if (blob.family == AF_INET6) {
        auto* in6 = reinterpret_cast<sockaddr_in6*>(&ss);
        in6->sin6_family = AF_INET6;
        std::memcpy(&in6->sin6_addr, blob.addr, 16);
        in6->sin6_scope_id = blob.scope_id;
        len = sizeof(sockaddr_in6);
    } else {
        return invalid_argument(strformat("handle has unknown address family %u", blob.family));
    }
    TCPX_ASSIGN_OR_RETURN(SocketAddress addr,
                          SocketAddress::from_sockaddr(reinterpret_cast<sockaddr*>(&ss), len));
    addr.set_port(blob.port);
    return addr;
}

}  // namespace

// --- creation, properties ------------------------------------------------------------------------

struct SocketNet::ConnectState {
    SocketAddress addr;
    uint16_t nsocks = 0;
    struct Sock {
        Fd fd;
        bool connected = false;
        wire::Hello hello{};
        size_t sent = 0;
    };
    std::vector<Sock> socks;  // [0] is the control socket
    Clock::time_point deadline;
};

StatusOr<std::unique_ptr<SocketNet>> SocketNet::create(const Settings& requested, Io io) {
    TCPX_RETURN_IF_ERROR(requested.validate());
    const Settings settings = requested.effective();
    AddressFamily family = AddressFamily::kAny;
    if (!parse_address_family(settings.socket_family, &family)) {
        return invalid_argument("TCPX_P2P_SOCKET_FAMILY: '" + settings.socket_family +
                                "' is not any, ipv4 or ipv6");
    }
    auto devices = find_interfaces(settings.socket_ifname, family);
    if (!devices.ok()) {
        return Status(devices.status()).with_context("socket transport: choosing interfaces");
    }
    // In the caller's thread, one round serves every socket: more rounds would only be more
    // epoll_wait calls per progress().
    const bool in_caller = io == Io::kInCaller;
    const int threads = in_caller ? 1 : static_cast<int>(settings.io_threads);
    TCPX_ASSIGN_OR_RETURN(auto pool, IoPool::create(threads, in_caller ? IoPool::Mode::kDriven
                                                                       : IoPool::Mode::kThreads));
    std::string names;
    for (const auto& d : *devices) names += " " + d.name + "=" + d.address.host_string();
    const std::string io_text =
        in_caller ? "I/O in the caller's thread" : std::to_string(threads) + " I/O threads";
    TCPX_INFO("socket transport: %s, %lld data sockets per comm, interfaces:%s", io_text.c_str(),
              static_cast<long long>(settings.nsocks), names.c_str());
    return std::unique_ptr<SocketNet>(
        new SocketNet(settings, std::move(devices).value(), std::move(pool)));
}

SocketNet::SocketNet(Settings settings, std::vector<NetInterface> devices,
                     std::unique_ptr<IoPool> pool)
    : settings_(std::move(settings)), devices_(std::move(devices)), pool_(std::move(pool)) {}

SocketNet::~SocketNet() = default;

int SocketNet::io_threads() const { return pool_->size(); }

Wakeup* SocketNet::completion_wakeup() { return &pool_->completions(); }

bool SocketNet::progress() { return pool_->drive(); }

int SocketNet::progress_fd() { return pool_->wait_fd(); }

Status SocketNet::get_properties(int dev, Properties* props) const {
    if (dev < 0 || dev >= device_count()) {
        return invalid_argument(
            strformat("device %d does not exist (%d devices)", dev, device_count()));
    }
    const NetInterface& iface = devices_[static_cast<size_t>(dev)];
    *props = Properties{};
    props->name = iface.name;
    // Read as the GPU-to-NIC map reads it (common/topology.h), so that NCCL, pairing GPUs with
    // devices by pciPath, sees the PCI function the engine's map sees.
    const topo::Nic nic = topo::read_nic(settings_.sysfs_root, iface.name);
    props->pci_path = nic.pci_path;
    props->guid = static_cast<uint64_t>(dev);
    props->ptr_support = static_cast<int>(MemType::kHost);
    props->speed_mbps = nic.speed_mbps > 0 ? nic.speed_mbps : 10000;
    props->port = 0;
    props->latency_us = 0;
    props->max_comms = 65536;
    props->max_recvs = socket_internal::kMaxRecvs;
    props->segments = true;
    props->close_releases_registrations = true;  // forget_mrs()
    props->device_type = DeviceType::kHost;
    props->device_version = 0;
    props->max_requests = static_cast<int>(settings_.max_requests);
    props->reports_sizes = true;
    return Status();
}

// --- listen / connect / accept -------------------------------------------------------------------

Status SocketNet::listen(int dev, Handle* handle, ListenComm** listen_comm) {
    if (handle == nullptr || listen_comm == nullptr) {
        return invalid_argument("listen: null handle or comm");
    }
    *listen_comm = nullptr;
    if (dev < 0 || dev >= device_count()) {
        return invalid_argument(strformat("listen: device %d does not exist", dev));
    }
    const NetInterface& iface = devices_[static_cast<size_t>(dev)];
    auto l = std::make_unique<SocketListen>();
    l->dev = dev;
    TCPX_ASSIGN_OR_RETURN(l->fd, listen_tcp(iface.address, kListenBacklog));
    TCPX_ASSIGN_OR_RETURN(l->addr, local_address(l->fd.get()));
    TCPX_ASSIGN_OR_RETURN(l->nonce, random_u64());
    l->nsocks = static_cast<uint16_t>(settings_.nsocks);

    wire::HandleBlob blob{};
    blob.magic = wire::kHandleMagic;
    blob.version = wire::kVersion;
    blob.family = static_cast<uint16_t>(l->addr.family());
    if (l->addr.family() == AF_INET) {
        std::memcpy(blob.addr, &reinterpret_cast<const sockaddr_in*>(l->addr.get())->sin_addr, 4);
    } else {
        const auto* in6 = reinterpret_cast<const sockaddr_in6*>(l->addr.get());
        std::memcpy(blob.addr, &in6->sin6_addr, 16);
        blob.scope_id = in6->sin6_scope_id;
    }
    blob.port = l->addr.port();
    blob.nsocks = l->nsocks;
    blob.listen_nonce = l->nonce;
    blob.connect_key = 0;
    handle->bytes.fill(0);
    std::memcpy(handle->bytes.data(), &blob, sizeof(blob));
    TCPX_DEBUG("listening on %s (%s)", l->addr.to_string().c_str(), iface.name.c_str());
    *listen_comm = reinterpret_cast<ListenComm*>(l.release());
    return Status();
}

void SocketNet::abandon_connect(Handle* handle) {
    if (handle == nullptr) return;
    wire::HandleBlob blob;
    std::memcpy(&blob, handle->bytes.data(), sizeof(blob));
    if (blob.magic != wire::kHandleMagic || blob.connect_key == 0) return;
    std::lock_guard<std::mutex> lock(connect_mu_);
    connecting_.erase(blob.connect_key);
    blob.connect_key = 0;
    std::memcpy(handle->bytes.data(), &blob, sizeof(blob));
}

Status check_socket_handle(Handle* handle, const SocketAddress& peer_address) {
    if (handle == nullptr) return invalid_argument("handle: null");
    wire::HandleBlob blob;
    std::memcpy(&blob, handle->bytes.data(), sizeof(blob));
    if (blob.magic != wire::kHandleMagic) {
        return invalid_argument("handle: not made by the socket transport");
    }
    if (blob.version != wire::kVersion) {
        return invalid_argument(
            strformat("handle: protocol version %u, ours is %u", blob.version, wire::kVersion));
    }
    // A handle may offer more sockets than this end's NSOCKS: connect() opens at most NSOCKS and
    // the listener accepts any count up to its own.
    if (blob.nsocks < 1 || blob.nsocks > kMaxSocketsPerComm) {
        return invalid_argument(strformat("handle: asks for %u data sockets (1 to %d)", blob.nsocks,
                                          kMaxSocketsPerComm));
    }
    if (blob.port == 0) return invalid_argument("handle: port 0");
    TCPX_ASSIGN_OR_RETURN(SocketAddress addr, handle_address(blob));
    // A handle may only send us to the host the peer itself is on: never a third party.
    if (peer_address.size() != 0 && !names_peer_host(addr, peer_address)) {
        return protocol_error(strformat("handle: names %s, but the peer is at %s",
                                        addr.host_string().c_str(),
                                        peer_address.host_string().c_str()));
    }
    // A link-local address names a host only on its link, and the handle's scope is the peer's
    // numbering of its own interfaces: we connect over the link the peer talks to us on (another
    // scope could reach another host of the same address).
    if (peer_address.size() != 0 && peer_address.is_link_local() && addr.is_link_local()) {
        blob.scope_id = peer_address.scope_id();
    }
    // connect()'s own progress key is ours to set, never the wire's; the tail is unused.
    blob.connect_key = 0;
    handle->bytes.fill(0);
    std::memcpy(handle->bytes.data(), &blob, sizeof(blob));
    return Status();
}

Status SocketNet::check_peer_handle(Handle* handle, const SocketAddress& peer_address) const {
    return check_socket_handle(handle, peer_address);
}

Status SocketNet::connect(int dev, Handle* handle, SendComm** send_comm, DeviceHandle* dev_handle) {
    if (handle == nullptr || send_comm == nullptr) {
        return invalid_argument("connect: null handle or comm");
    }
    *send_comm = nullptr;
    if (dev < 0 || dev >= device_count()) {
        return invalid_argument(strformat("connect: device %d does not exist", dev));
    }
    if (dev_handle != nullptr) *dev_handle = DeviceHandle{};
    wire::HandleBlob blob;
    std::memcpy(&blob, handle->bytes.data(), sizeof(blob));
    if (blob.magic != wire::kHandleMagic) {
        return invalid_argument("connect: the handle was not made by the socket transport");
    }
    if (blob.version != wire::kVersion) {
        return invalid_argument(strformat("connect: handle of protocol version %u, ours is %u",
                                          blob.version, wire::kVersion));
    }
    if (blob.nsocks < 1 || blob.nsocks > kMaxSocketsPerComm) {
        return invalid_argument(strformat("connect: handle asks for %u data sockets", blob.nsocks));
    }
    // However the handle came, this end opens no more sockets per comm than it is configured
    // to: the listener takes any count up to its own.
    const uint16_t nsocks = static_cast<uint16_t>(std::min<int64_t>(blob.nsocks, settings_.nsocks));

    std::lock_guard<std::mutex> lock(connect_mu_);
    // Connects whose caller went away without abandon_connect(): their deadline passed long ago
    // and nobody will call again; their sockets go.
    const auto now = Clock::now();
    const auto grace = std::chrono::milliseconds(settings_.handshake_timeout_ms);
    std::erase_if(connecting_, [&](const auto& e) { return now > e.second->deadline + grace; });
    auto save_key = [&](uint64_t key) {
        blob.connect_key = key;
        std::memcpy(handle->bytes.data(), &blob, sizeof(blob));
    };
    ConnectState* st = nullptr;
    auto it = connecting_.find(blob.connect_key);
    if (blob.connect_key != 0 && it != connecting_.end()) st = it->second.get();
    if (st == nullptr) {
        auto state = std::make_unique<ConnectState>();
        TCPX_ASSIGN_OR_RETURN(state->addr, handle_address(blob));
        state->nsocks = nsocks;
        state->deadline = Clock::now() + std::chrono::milliseconds(settings_.handshake_timeout_ms);
        TCPX_ASSIGN_OR_RETURN(const uint64_t comm_nonce, random_u64());
        // From the device's own address: each comm of a peer striped over several NICs leaves
        // through its own (routing picks the interface of the source's subnet).
        const SocketAddress& source = devices_[static_cast<size_t>(dev)].address;
        // All of its sockets or none: a connect that cannot open them all would reach the
        // listener with some and close them again.
        TCPX_RETURN_IF_ERROR(socket_budget_room(static_cast<uint64_t>(nsocks) + 1, "connect"));
        for (int i = 0; i <= nsocks; ++i) {
            ConnectState::Sock sock;
            auto fd = start_connect(state->addr, &source);
            if (!fd.ok()) return Status(fd.status()).with_context("connect");
            sock.fd = std::move(fd).value();
            sock.hello = wire::Hello{
                wire::kHelloMagic,
                wire::kVersion,
                static_cast<uint16_t>(i == 0 ? wire::Role::kControl : wire::Role::kData),
                blob.listen_nonce,
                comm_nonce,
                static_cast<uint16_t>(i == 0 ? 0 : i - 1),
                nsocks,
                0};
            state->socks.push_back(std::move(sock));
        }
        uint64_t key = 0;
        while (key == 0 || connecting_.count(key) != 0) {
            TCPX_ASSIGN_OR_RETURN(key, random_u64());
        }
        st = state.get();
        connecting_.emplace(key, std::move(state));
        save_key(key);
    }

    auto abandon = [&](Status why) {
        why.with_context("connect to " + st->addr.to_string());
        connecting_.erase(blob.connect_key);  // frees *st
        save_key(0);
        return why;
    };
    bool all_sent = true;
    for (auto& sock : st->socks) {
        if (!sock.connected) {
            bool done = false;
            Status s = finish_connect(sock.fd.get(), st->addr, &done);
            if (!s.ok()) return abandon(std::move(s));
            if (!done) {
                all_sent = false;
                continue;
            }
            sock.connected = true;
            s = configure_socket(sock.fd.get(), settings_);
            if (!s.ok()) return abandon(std::move(s));
        }
        if (sock.sent < sizeof(sock.hello)) {
            const iovec iov{reinterpret_cast<uint8_t*>(&sock.hello) + sock.sent,
                            sizeof(sock.hello) - sock.sent};
            auto n = send_some(sock.fd.get(), &iov, 1);
            if (!n.ok()) return abandon(n.status());
            sock.sent += *n;
            if (sock.sent < sizeof(sock.hello)) all_sent = false;
        }
    }
    if (!all_sent) {
        if (Clock::now() > st->deadline) {
            return abandon(
                timeout_error(strformat("handshake not done after %lld ms",
                                        static_cast<long long>(settings_.handshake_timeout_ms))));
        }
        return Status();  // in progress: call again
    }
    std::vector<Fd> data;
    for (size_t i = 1; i < st->socks.size(); ++i) data.push_back(std::move(st->socks[i].fd));
    auto comm = std::make_unique<socket_internal::SendComm>(
        pool_.get(), comm_config(settings_), st->addr.to_string(), std::move(st->socks[0].fd),
        std::move(data));
    connecting_.erase(blob.connect_key);
    save_key(0);
    if (Status started = comm->start(); !started.ok()) {
        comm->shut_down();
        return started;
    }
    *send_comm = reinterpret_cast<SendComm*>(comm.release());
    return Status();
}

Status SocketNet::accept(ListenComm* listen_comm, RecvComm** recv_comm, DeviceHandle* dev_handle) {
    if (listen_comm == nullptr || recv_comm == nullptr) {
        return invalid_argument("accept: null listen comm or comm");
    }
    *recv_comm = nullptr;
    if (dev_handle != nullptr) *dev_handle = DeviceHandle{};
    auto* l = reinterpret_cast<SocketListen*>(listen_comm);
    if (l->magic != kListenMagic) return invalid_argument("accept: not a listen comm");
    std::lock_guard<std::mutex> lock(l->mu);
    const auto now = Clock::now();
    const auto handshake_timeout = std::chrono::milliseconds(settings_.handshake_timeout_ms);

    // 1. New connections. With the handshakes in progress at the limit, first see which of them
    // have ended or timed out: their places go to the newcomers (not to the next call).
    if (l->pending.size() + l->grouped_sockets >= kMaxHandshaking) {
        advance_handshakes(l, now, handshake_timeout);
    }
    for (int i = 0; i < kAcceptsPerCall; ++i) {
        // At the process's socket budget (MAX_SOCKETS) new connections wait in the kernel's
        // queue. None of this listener's own is closed for them: those just accepted have not
        // been read yet, and a real connector's socket closed would leave its comm incomplete
        // for good; those that do not send their hello soon are closed (advance_handshakes).
        if (socket_budget_full()) {
            if (connection_waiting(l->fd.get())) note_room_wanted();
            break;
        }
        SocketAddress peer;
        auto fd = accept_tcp(l->fd.get(), &peer);
        if (!fd.ok() && fd.status().code() == StatusCode::kResourceExhausted) {
            break;  // the budget filled since the check: the connection stays queued
        }
        if (!fd.ok() && fd.status().code() == StatusCode::kFailedPrecondition) {
            return fd.status();  // the listening socket was shut down: it takes nothing more
        }
        if (!fd.ok()) {
            // Out of descriptors or memory (EMFILE, ENFILE, ENOBUFS, ENOMEM): the connection
            // waits in the kernel's queue for a later call, and the handshakes in progress still
            // advance and time out below, which is what gives descriptors back. Not the caller's
            // error: its comm may come on the next call.
            if (may_log_stranger_event()) {
                TCPX_WARN("accept on %s: %s", l->addr.to_string().c_str(),
                          fd.status().to_string().c_str());
            }
            break;
        }
        if (!fd->valid()) break;
        if (l->pending.size() + l->grouped_sockets >= kMaxHandshaking && !l->pending.empty()) {
            // The newcomer takes the place of the oldest connection that has not sent its hello:
            // a real connector sends it at once, so connections that never do cannot keep it
            // out. Grouped sockets are never closed for a newcomer (their hello named this
            // listener's nonce, which only the holder of its handle knows).
            auto oldest = std::min_element(
                l->pending.begin(), l->pending.end(),
                [](const Pending& a, const Pending& b) { return a.since < b.since; });
            if (may_log_stranger_event()) {
                TCPX_WARN(
                    "closing connection from %s after %lld ms without a handshake, for a newer "
                    "one: %zu connections in handshake on %s",
                    oldest->peer.to_string().c_str(),
                    static_cast<long long>(
                        std::chrono::duration_cast<std::chrono::milliseconds>(now - oldest->since)
                            .count()),
                    kMaxHandshaking, l->addr.to_string().c_str());
            }
            std::iter_swap(oldest, l->pending.end() - 1);
            l->pending.pop_back();
        }
        if (l->pending.size() + l->grouped_sockets >= kMaxHandshaking) {
            if (may_log_stranger_event()) {
                TCPX_WARN("closing connection from %s: %zu connections already in handshake on %s",
                          peer.to_string().c_str(), kMaxHandshaking, l->addr.to_string().c_str());
            }
            continue;
        }
        l->pending.push_back(Pending{std::move(fd).value(), peer, {}, 0, now});
    }

    // 2. Handshakes.
    advance_handshakes(l, now, handshake_timeout);

    // 3. Complete comms (one per call) and abandoned groups.
    for (auto it = l->groups.begin(); it != l->groups.end();) {
        Group& g = it->second;
        const int arrived = (g.control.valid() ? 1 : 0) + g.have_data;
        const bool complete = g.control.valid() && g.have_data == g.nsocks;
        if (complete && *recv_comm == nullptr) {
            Status st = configure_socket(g.control.get(), settings_);
            for (Fd& fd : g.data) {
                if (st.ok()) st = configure_socket(fd.get(), settings_);
            }
            const wire::HelloReply reply{wire::kReplyMagic, wire::kVersion,
                                         static_cast<uint16_t>(wire::ReplyStatus::kAccepted)};
            const iovec iov{const_cast<wire::HelloReply*>(&reply), sizeof(reply)};
            if (st.ok()) {
                auto n = send_some(g.control.get(), &iov, 1);
                if (!n.ok()) {
                    st = n.status();
                } else if (*n != sizeof(reply)) {
                    st = unavailable("could not send the handshake reply");
                }
            }
            l->grouped_sockets -= static_cast<size_t>(arrived);
            if (!st.ok()) {
                TCPX_WARN("dropping connection from %s: %s", g.peer.to_string().c_str(),
                          st.to_string().c_str());
                it = l->groups.erase(it);
                continue;
            }
            auto comm = std::make_unique<socket_internal::RecvComm>(
                pool_.get(), comm_config(settings_), g.peer.to_string(), std::move(g.control),
                std::move(g.data));
            it = l->groups.erase(it);
            if (Status started = comm->start(); !started.ok()) {
                comm->shut_down();
                return started;
            }
            *recv_comm = reinterpret_cast<RecvComm*>(comm.release());
            continue;
        }
        // A complete group waits for the next call however old it is: it did its part in time.
        if (!complete && now - g.since > handshake_timeout) {
            TCPX_WARN(
                "dropping incomplete connection from %s: %d of %d sockets arrived within "
                "%lld ms",
                g.peer.to_string().c_str(), arrived, g.nsocks + 1,
                static_cast<long long>(settings_.handshake_timeout_ms));
            l->grouped_sockets -= static_cast<size_t>(arrived);
            it = l->groups.erase(it);
            continue;
        }
        ++it;
    }
    return Status();
}

// --- memory registration -------------------------------------------------------------------------

Status SocketNet::reg_mr(void* comm, void* data, size_t size, MemType type, MemHandle** mhandle) {
    if (comm == nullptr || mhandle == nullptr) return invalid_argument("reg_mr: null argument");
    *mhandle = nullptr;
    if (type != MemType::kHost) {
        return unimplemented(
            strformat("reg_mr: the socket transport moves host memory only (memory type %d)",
                      static_cast<int>(type)));
    }
    if (data == nullptr && size > 0) return invalid_argument("reg_mr: null buffer");
    auto rec = std::make_unique<MrRecord>();
    rec->data = data;
    rec->size = size;
    rec->comm = comm;
    {
        std::lock_guard<std::mutex> lock(mr_mu_);
        mrs_[comm].push_back(rec.get());
    }
    *mhandle = reinterpret_cast<MemHandle*>(rec.release());
    return Status();
}

void SocketNet::forget_mrs(void* comm) {
    std::vector<void*> left;
    {
        std::lock_guard<std::mutex> lock(mr_mu_);
        auto it = mrs_.find(comm);
        if (it == mrs_.end()) return;
        left = std::move(it->second);
        mrs_.erase(it);
    }
    for (void* r : left) {
        static_cast<MrRecord*>(r)->magic = 0;
        delete static_cast<MrRecord*>(r);
    }
}

bool SocketNet::live_mr_locked(void* comm, MemHandle* mhandle) const {
    // By the handle's value, never reading through it: a handle deregistered already, or
    // forgotten with its comm's close, points at freed memory (or at a later registration that
    // took its place, which the comm's own list tells apart only if it is this comm's).
    auto it = mrs_.find(comm);
    if (it == mrs_.end()) return false;
    const auto& recs = it->second;
    return std::find(recs.begin(), recs.end(), static_cast<void*>(mhandle)) != recs.end() &&
           reinterpret_cast<MrRecord*>(mhandle)->magic == kMrMagic;
}

Status SocketNet::dereg_mr_failing_pending(void* comm, MemHandle* mhandle) {
    {
        // Held throughout: a close of the comm on another thread forgets its registrations
        // under it, and deletes the comm only after.
        std::lock_guard<std::mutex> lock(mr_mu_);
        if (!live_mr_locked(comm, mhandle)) {
            return invalid_argument(
                "dereg_mr: not a live registration of this comm of the socket transport");
        }
        auto* rec = reinterpret_cast<MrRecord*>(mhandle);
        auto* c = reinterpret_cast<socket_internal::Comm*>(rec->comm);
        if (rec->data != nullptr &&
            (c->kind() == Comm::kSendKind || c->kind() == Comm::kRecvKind)) {
            c->drop_memory(static_cast<const uint8_t*>(rec->data), rec->size);
        }
    }
    return dereg_mr(comm, mhandle);
}

Status SocketNet::hint_device_reads(void* comm, MemHandle* mhandle) {
    std::lock_guard<std::mutex> lock(mr_mu_);
    if (!live_mr_locked(comm, mhandle)) {
        return invalid_argument("hint_device_reads: not a registration of the socket transport");
    }
    reinterpret_cast<MrRecord*>(mhandle)->device_reads = true;
    return Status();
}

Status SocketNet::dereg_mr(void* comm, MemHandle* mhandle) {
    auto* rec = reinterpret_cast<MrRecord*>(mhandle);
    {
        std::lock_guard<std::mutex> lock(mr_mu_);
        if (!live_mr_locked(comm, mhandle)) {
            return invalid_argument(
                "dereg_mr: not a live registration of this comm of the socket transport");
        }
        auto it = mrs_.find(comm);
        std::erase(it->second, static_cast<void*>(rec));
        if (it->second.empty()) mrs_.erase(it);
    }
    rec->magic = 0;
    delete rec;
    return Status();
}

// --- data path -----------------------------------------------------------------------------------

namespace {

// What every posting entry point checks before `post` runs on the comm, and the request it made
// (none: no room) handed out as a net::Request.
template <typename CommT, typename ReqT, typename Post>
Status post_on(void* comm, const char* what, Request** request, Post post) {
    auto* c = reinterpret_cast<CommT*>(comm);
    if (c == nullptr || request == nullptr) {
        return invalid_argument(strformat("%s: null comm or request", what));
    }
    constexpr bool kSend = std::is_same_v<CommT, socket_internal::SendComm>;
    if (c->kind() != (kSend ? Comm::kSendKind : Comm::kRecvKind)) {
        return invalid_argument(strformat("%s: not a %s comm", what, kSend ? "send" : "receive"));
    }
    ReqT* req = nullptr;
    Status st = post(c, &req);
    *request = req ? reinterpret_cast<Request*>(static_cast<ReqBase*>(req)) : nullptr;
    return st;
}

using socket_internal::RecvReq;
using socket_internal::SendReq;
using SendC = socket_internal::SendComm;
using RecvC = socket_internal::RecvComm;

}  // namespace

Status SocketNet::isend(SendComm* comm, const void* data, size_t size, int tag, MemHandle* mhandle,
                        Request** request) {
    return post_on<SendC, SendReq>(comm, "isend", request, [&](SendC* c, SendReq** req) {
        return c->isend(data, size, tag, req);
    });
}

Status SocketNet::irecv(RecvComm* comm, int n, void* const* data, const size_t* sizes,
                        const int* tags, MemHandle* const* mhandles, Request** request) {
    // Registrations are needed by no receive here; one hinted for a device's reads marks its
    // buffer, up to WRITE_BACK_MAX. That default is measured on the two-H200 host
    // (docs/benchmarking.md, 2026-11-30): 1 MiB GPU chunks moved 1.5x with their receives written
    // back (WRITE at 8 in flight; READ the same); 4 MiB chunks, the default for large transfers,
    // lost up to half (READ 64 MiB: 40 -> 20 GB/s), having found their lines where the copy reads
    // them fast without it. A CPU whose CLWB evicts the line (as CLFLUSHOPT does) may want 0.
    // (A handle that is not one of ours marks nothing; the arguments themselves are checked by
    // the comm.)
    const uint64_t max_bytes = settings_.write_back_max;
    unsigned write_back = 0;
    for (int i = 0; mhandles != nullptr && sizes != nullptr && i < n && i < 32; ++i) {
        const auto* rec = reinterpret_cast<const MrRecord*>(mhandles[i]);
        if (rec != nullptr && rec->magic == kMrMagic && rec->device_reads && sizes[i] > 0 &&
            sizes[i] <= max_bytes) {
            write_back |= 1u << i;
        }
    }
    return post_on<RecvC, RecvReq>(comm, "irecv", request, [&](RecvC* c, RecvReq** req) {
        return c->irecv(n, data, sizes, tags, req, write_back);
    });
}

Status SocketNet::isendv(SendComm* comm, std::span<const IoSeg> segs, int tag, Request** request) {
    return post_on<SendC, SendReq>(comm, "isendv", request, [&](SendC* c, SendReq** req) {
        return c->isendv(segs, tag, req);
    });
}

Status SocketNet::irecvv(RecvComm* comm, std::span<const IoSeg> segs, int tag, Request** request) {
    return post_on<RecvC, RecvReq>(comm, "irecvv", request, [&](RecvC* c, RecvReq** req) {
        return c->irecvv(segs, tag, req);
    });
}

Status SocketNet::test(Request* request, bool* done, size_t* sizes) {
    if (request == nullptr || done == nullptr) return invalid_argument("test: null argument");
    auto* base = reinterpret_cast<ReqBase*>(request);
    if (base->kind == ReqBase::kSend) {
        auto* req = static_cast<socket_internal::SendReq*>(base);
        return req->comm->test(req, done, sizes);
    }
    if (base->kind == ReqBase::kRecv) {
        auto* req = static_cast<socket_internal::RecvReq*>(base);
        return req->comm->test(req, done, sizes);
    }
    return invalid_argument("test: not a request of the socket transport");
}

Status SocketNet::irecv_consumed(RecvComm* comm, int n, Request* request) {
    // Host memory: received data is in place when test() reports it; nothing to return.
    return Status();
}

Status SocketNet::close_send(SendComm* comm) {
    auto* c = reinterpret_cast<socket_internal::SendComm*>(comm);
    if (c == nullptr) return Status();
    if (c->kind() != Comm::kSendKind) return invalid_argument("close_send: not a send comm");
    c->shut_down();
    forget_mrs(comm);
    delete c;
    return Status();
}

Status SocketNet::close_recv(RecvComm* comm) {
    auto* c = reinterpret_cast<socket_internal::RecvComm*>(comm);
    if (c == nullptr) return Status();
    if (c->kind() != Comm::kRecvKind) return invalid_argument("close_recv: not a receive comm");
    c->shut_down();
    forget_mrs(comm);
    delete c;
    return Status();
}

Status SocketNet::close_listen(ListenComm* comm) {
    auto* l = reinterpret_cast<SocketListen*>(comm);
    if (l == nullptr) return Status();
    if (l->magic != kListenMagic) return invalid_argument("close_listen: not a listen comm");
    l->magic = 0;
    delete l;
    return Status();
}

}  // namespace tcpx::net
