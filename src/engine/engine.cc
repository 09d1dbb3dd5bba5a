// The engine's skeleton: creation, the progress loop, peers and their handshake. Transfers are
// in engine_xfer.cc.
#include "engine/engine.h"

#include <netinet/in.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "common/log.h"
#include "common/random.h"
#include "common/status_util.h"
#include "common/strings.h"
#include "engine/ctrl_wire.h"
#include "engine/metadata.h"
#include "net/plugin/plugin_loader.h"
#include "net/socket/socket_net.h"

namespace tcpx {

using engine::Clock;
using engine::Op;
namespace wire = engine::wire;

namespace {

// epoll tags: peer ids start at 1.
constexpr uint64_t kListenTag = 0;
constexpr uint64_t kMaxUnpackChunk = 4u << 20;
constexpr uint64_t kWakeTag = ~uint64_t{0};

}  // namespace

// --- creation and shutdown
// -------------------------------------------------------------------------

StatusOr<std::unique_ptr<Endpoint::Impl>> Endpoint::Impl::create(const Config& config,
                                                                 std::string name) {
    std::unique_ptr<Impl> impl(new Impl());
    TCPX_RETURN_IF_ERROR(impl->init(config, std::move(name)));
    return impl;
}

Status Endpoint::Impl::init(const Config& config, std::string name) {
    TCPX_RETURN_IF_ERROR(config.validate());
    config_ = config;
    if (name.size() > wire::kMaxName) {
        return invalid_argument(
            strformat("endpoint name of %zu bytes exceeds %zu", name.size(), wire::kMaxName));
    }
    if (config.net_plugin.empty()) {
        TCPX_ASSIGN_OR_RETURN(net_, net::SocketNet::create(config));
    } else {
        TCPX_ASSIGN_OR_RETURN(net_, net::load_net_plugin(config.net_plugin, config));
    }
    TCPX_RETURN_IF_ERROR(net_->get_properties(dev_, &props_));
    window_ = static_cast<int>(std::min<int64_t>(config.window, props_.max_requests));
    chunk_ = config.xfer_chunk_size;
    staging_slots_ = static_cast<int>(config.staging_slots);
    if (props_.device_type == net::DeviceType::kUnpack && chunk_ > kMaxUnpackChunk) {
        // One devmem-TCP receive holds at most a 4 MiB slice (2048 loadMeta entries).
        TCPX_INFO("XFER_CHUNK_SIZE %llu exceeds what one %s receive holds: using %llu",
                  static_cast<unsigned long long>(chunk_), std::string(net_->name()).c_str(),
                  static_cast<unsigned long long>(kMaxUnpackChunk));
        chunk_ = kMaxUnpackChunk;
    }
    // The control listener sits on the interface SOCKET_IFNAME selects (the socket transport's
    // too), so peers reach both the same way.
    AddressFamily family = AddressFamily::kAny;
    parse_address_family(config.socket_family, &family);
    TCPX_ASSIGN_OR_RETURN(auto interfaces, find_interfaces(config.socket_ifname, family));
    listen_addr_ = interfaces.front().address;
    listen_addr_.set_port(static_cast<uint16_t>(config.port));
    registry_.set_on_free([this](engine::Region* r) { forget_region(r); });
    TCPX_ASSIGN_OR_RETURN(listen_fd_, listen_tcp(listen_addr_, 1024));
    TCPX_ASSIGN_OR_RETURN(listen_addr_, local_address(listen_fd_.get()));
    nonce_ = random_u64();
    name_ = name.empty() ? listen_addr_.to_string() : std::move(name);
    xfers_ = std::make_unique<engine::XferTable>(static_cast<size_t>(config.max_transfers));

    epfd_ = ::epoll_create1(EPOLL_CLOEXEC);
    if (epfd_ < 0) return errno_status(errno, "epoll_create1");
    wake_fd_.reset(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
    if (!wake_fd_.valid()) return errno_status(errno, "eventfd");
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.u64 = kListenTag;
    if (::epoll_ctl(epfd_, EPOLL_CTL_ADD, listen_fd_.get(), &ev) != 0) {
        return errno_status(errno, "epoll_ctl");
    }
    ev.data.u64 = kWakeTag;
    if (::epoll_ctl(epfd_, EPOLL_CTL_ADD, wake_fd_.get(), &ev) != 0) {
        return errno_status(errno, "epoll_ctl");
    }
    own_progress_thread_ = config.progress_thread == "on";
    if (own_progress_thread_) progress_thread_ = std::thread([this] { run_progress_thread(); });
    TCPX_INFO("endpoint '%s' listening on %s (%d channels, window %d)", name_.c_str(),
              listen_addr_.to_string().c_str(), static_cast<int>(config.channels), window_);
    return Status();
}

Endpoint::Impl::~Impl() {
    stop_.store(true);
    wake();
    if (progress_thread_.joinable()) progress_thread_.join();
    auto lock = api_lock();
    for (auto& [id, p] : peers_) {
        if (p->state == Peer::State::kFailed) continue;
        if (p->ctrl.valid()) {
            p->ctrl.queue(wire::encode_empty(wire::MsgType::kBye));
            (void)p->ctrl.flush();
        }
        fail_peer(*p, cancelled("the endpoint was destroyed"));
    }
    peers_.clear();
    if (epfd_ >= 0) ::close(epfd_);
}

std::string Endpoint::Impl::metadata() const {
    engine::EndpointAddress a;
    a.name = name_;
    a.address = listen_addr_;
    a.gpu = static_cast<int32_t>(config_.gpu_index);
    a.nonce = nonce_;
    return engine::encode_metadata(a);
}

// --- the progress loop
// -----------------------------------------------------------------------------

void Endpoint::Impl::wake() {
    // Paired with run_progress_thread(): it announces sleeping, then re-reads posted_; we bump
    // posted_, then read sleeping_. Sequentially consistent, so one of the two sees the other and
    // no wakeup is lost.
    posted_.fetch_add(1);
    if (sleeping_.load()) {
        const uint64_t one = 1;
        (void)!::write(wake_fd_.get(), &one, sizeof(one));
    }
}

bool Endpoint::Impl::progress_once() {
    bool did = false;
    // Which control sockets have something to read (level-triggered, no waiting).
    epoll_event events[64];
    std::unordered_set<PeerId> readable;
    bool listen_ready = false;
    int n;
    do {
        n = ::epoll_wait(epfd_, events, 64, 0);
        for (int i = 0; i < n; ++i) {
            const uint64_t tag = events[i].data.u64;
            if (tag == kListenTag) {
                listen_ready = true;
            } else if (tag == kWakeTag) {
                uint64_t v;
                while (::read(wake_fd_.get(), &v, sizeof(v)) > 0) {
                }
            } else {
                readable.insert(tag);
            }
        }
    } while (n == 64);
    if (listen_ready) {
        accept_inbound();
        did = true;
    }
    for (auto& [id, p] : peers_) {
        if (p->state == Peer::State::kFailed) continue;
        did |= progress_peer(*p, readable.count(id) != 0);
    }
    reap_peers();
    return did;
}

bool Endpoint::Impl::drive(const std::function<bool()>& done, Clock::time_point deadline) {
    for (int spins = 0;; ++spins) {
        {
            std::unique_lock<std::mutex> lock(mu_, std::try_to_lock);
            if (lock.owns_lock()) {
                if (done()) return true;
                // The progress thread, while awake, is already polling: only step in when there
                // is none or it sleeps (then this thread sees a reply first, with no wakeup).
                if (!own_progress_thread_ || sleeping_.load()) progress_once();
                if (done()) return true;
            }
        }
        if (Clock::now() >= deadline) return false;
        if (spins < 2000) {
            std::this_thread::yield();
        } else {
            std::this_thread::sleep_for(std::chrono::microseconds(50));
        }
    }
}

void Endpoint::Impl::run_progress_thread() {
    pthread_setname_np(pthread_self(), "tcpx-progress");
    int idle = 0;
    while (!stop_.load()) {
        const uint64_t posted = posted_.load();
        bool did = false;
        bool busy = false;
        int heartbeat_ms = 1000;
        {
            std::lock_guard<std::mutex> lock(mu_);
            did = progress_once();
            busy = active_ops_ > 0;
            for (auto& [id, p] : peers_) {
                if (p->state != Peer::State::kReady && p->state != Peer::State::kFailed)
                    busy = true;
                if (p->ctrl.has_output()) busy = true;
            }
            heartbeat_ms =
                static_cast<int>(std::clamp<int64_t>(config_.peer_timeout_ms / 8, 1, 1000));
        }
        // Let API calls waiting for the lock in (posting threads would otherwise lose the race
        // for it again and again).
        for (int i = 0; i < 1000 && api_waiting_.load() > 0; ++i) std::this_thread::yield();
        if (did) {
            idle = 0;
            continue;
        }
        if (busy && ++idle < 256) {
            std::this_thread::yield();
            continue;
        }
        // Nothing moved for a while: sleep until a control socket or a wake says otherwise, or
        // briefly while chunk requests are in flight (the transport signals no fd for those).
        sleeping_.store(true);
        if (posted_.load() != posted || stop_.load()) {  // work came in meanwhile: no sleep
            sleeping_.store(false);
            continue;
        }
        epoll_event ev;
        if (busy) {
            const timespec ts{0, 50'000};
            ::epoll_pwait2(epfd_, &ev, 1, &ts, nullptr);
        } else {
            ::epoll_wait(epfd_, &ev, 1, heartbeat_ms);
        }
        sleeping_.store(false);
        idle = 0;
    }
}

// --- peers
// -----------------------------------------------------------------------------------------

void Endpoint::Impl::accept_inbound() {
    for (int i = 0; i < 64; ++i) {
        SocketAddress from;
        auto fd = accept_tcp(listen_fd_.get(), &from);
        if (!fd.ok()) {
            TCPX_WARN("endpoint '%s': accept: %s", name_.c_str(), fd.status().to_string().c_str());
            return;
        }
        if (!fd->valid()) return;
        (void)set_nodelay(fd->get());
        (void)set_dead_peer_timeout(fd->get(), config_.socket_timeout_ms);
        auto p = std::make_unique<Peer>();
        p->id = next_peer_++;
        p->outbound = false;
        p->state = Peer::State::kHello;
        p->address = from;
        p->name = from.to_string();
        p->started = p->last_recv = p->last_send = Clock::now();
        p->ctrl.reset(std::move(fd).value());
        epoll_event ev{};
        ev.events = EPOLLIN;
        ev.data.u64 = p->id;
        if (::epoll_ctl(epfd_, EPOLL_CTL_ADD, p->ctrl.fd(), &ev) != 0) {
            TCPX_WARN("epoll_ctl: %s", std::strerror(errno));
            continue;
        }
        TCPX_DEBUG("endpoint '%s': connection from %s", name_.c_str(), from.to_string().c_str());
        peers_.emplace(p->id, std::move(p));
    }
}

StatusOr<PeerId> Endpoint::Impl::connect(std::string_view metadata) {
    TCPX_ASSIGN_OR_RETURN(engine::EndpointAddress addr, engine::decode_metadata(metadata));
    PeerId id;
    {
        auto lock = api_lock();
        TCPX_ASSIGN_OR_RETURN(Fd fd, start_connect(addr.address));
        auto p = std::make_unique<Peer>();
        p->id = id = next_peer_++;
        p->outbound = true;
        p->state = Peer::State::kConnecting;
        p->address = addr.address;
        p->name = addr.name;
        p->known_to_user = true;
        p->started = p->last_recv = p->last_send = Clock::now();
        p->ctrl.reset(std::move(fd));
        epoll_event ev{};
        ev.events = EPOLLIN;
        ev.data.u64 = p->id;
        if (::epoll_ctl(epfd_, EPOLL_CTL_ADD, p->ctrl.fd(), &ev) != 0) {
            return errno_status(errno, "epoll_ctl");
        }
        Peer& peer = *p;
        peers_.emplace(id, std::move(p));
        // Our receive channels' listeners go in our HELLO.
        Status st = start_channels(peer, static_cast<int>(config_.channels));
        if (!st.ok()) {
            fail_peer(peer, st);
            peers_.erase(id);
            return st.with_context("connect to '" + addr.name + "'");
        }
    }
    wake();
    const auto deadline =
        engine::deadline_after(std::chrono::milliseconds(config_.connect_timeout_ms));
    drive(
        [&] {
            auto it = peers_.find(id);
            return it == peers_.end() || it->second->state == Peer::State::kReady ||
                   it->second->state == Peer::State::kFailed;
        },
        deadline);
    auto lock = api_lock();
    auto it = peers_.find(id);
    if (it == peers_.end()) return unavailable("connect: the connection went away");
    Peer& p = *it->second;
    if (p.state == Peer::State::kReady) return id;
    Status why = p.state == Peer::State::kFailed
                     ? p.error
                     : timeout_error(strformat("not ready after %lld ms",
                                               static_cast<long long>(config_.connect_timeout_ms)));
    if (p.state != Peer::State::kFailed) fail_peer(p, why);
    peers_.erase(it);
    return why.with_context("connect to '" + addr.name + "' at " + addr.address.to_string());
}

StatusOr<PeerId> Endpoint::Impl::accept(std::chrono::milliseconds timeout) {
    const auto deadline = engine::deadline_after(timeout);
    PeerId found = 0;
    auto take = [&] {
        while (!accept_queue_.empty()) {
            const PeerId id = accept_queue_.front();
            accept_queue_.pop_front();
            auto it = peers_.find(id);
            if (it == peers_.end() || it->second->state == Peer::State::kFailed) continue;
            it->second->in_accept_queue = false;
            it->second->known_to_user = true;
            found = id;
            return true;
        }
        return false;
    };
    drive(take, deadline);
    if (found != 0) return found;
    auto lock = api_lock();
    if (take()) return found;
    return timeout_error("accept: no new peer connected in time");
}

Status Endpoint::Impl::disconnect(PeerId peer) {
    auto lock = api_lock();
    auto it = peers_.find(peer);
    if (it == peers_.end())
        return not_found(
            strformat("disconnect: no peer %llu", static_cast<unsigned long long>(peer)));
    Peer& p = *it->second;
    if (p.state != Peer::State::kFailed && p.ctrl.valid()) {
        p.ctrl.queue(wire::encode_empty(wire::MsgType::kBye));
        (void)p.ctrl.flush();
        fail_peer(p, cancelled("disconnected by this endpoint"));
    }
    peers_.erase(it);
    return Status();
}

StatusOr<std::string> Endpoint::Impl::peer_name(PeerId peer) {
    auto lock = api_lock();
    auto it = peers_.find(peer);
    if (it == peers_.end())
        return not_found(strformat("no peer %llu", static_cast<unsigned long long>(peer)));
    return it->second->name;
}

StatusOr<Endpoint::Impl::Peer*> Endpoint::Impl::ready_peer(PeerId id) {
    auto it = peers_.find(id);
    if (it == peers_.end()) {
        return not_found(strformat("no peer %llu (never connected, or disconnected)",
                                   static_cast<unsigned long long>(id)));
    }
    Peer& p = *it->second;
    if (p.state == Peer::State::kFailed) {
        return Status(p.error.code(), p.error.message());
    }
    if (p.state != Peer::State::kReady) {
        return failed_precondition("peer '" + p.name + "' is still connecting");
    }
    return &p;
}

Status Endpoint::Impl::start_channels(Peer& p, int channels) {
    for (int i = 0; i < channels; ++i) {
        net::Handle handle;
        net::ListenComm* listen = nullptr;
        TCPX_RETURN_IF_ERROR(net_->listen(dev_, &handle, &listen));
        p.listens.push_back(listen);
        p.listen_handles.push_back(handle);
    }
    return Status();
}

void Endpoint::Impl::send_ctrl(Peer& p, std::string msg) {
    p.ctrl.queue(std::move(msg));
    p.last_send = Clock::now();
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
        send_ctrl(p, wire::encode_hello(reply));
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
    p.state = Peer::State::kChannels;
    return Status();
}

bool Endpoint::Impl::progress_handshake(Peer& p) {
    const auto now = Clock::now();
    if (now - p.started > std::chrono::milliseconds(config_.connect_timeout_ms)) {
        fail_peer(p, timeout_error(strformat("handshake not done after %lld ms",
                                             static_cast<long long>(config_.connect_timeout_ms))));
        return true;
    }
    if (p.state == Peer::State::kConnecting) {
        bool done = false;
        Status st = finish_connect(p.ctrl.fd(), p.address, &done);
        if (!st.ok()) {
            fail_peer(p, st);
            return true;
        }
        if (!done) return false;
        (void)set_nodelay(p.ctrl.fd());
        (void)set_dead_peer_timeout(p.ctrl.fd(), config_.socket_timeout_ms);
        wire::Hello hello;
        hello.channels = static_cast<uint16_t>(p.listens.size());
        hello.nonce = nonce_;
        hello.chunk = chunk_;
        hello.name = name_;
        hello.handles = p.listen_handles;
        send_ctrl(p, wire::encode_hello(hello));
        p.state = Peer::State::kHello;
        return true;
    }
    if (p.state != Peer::State::kChannels) return false;
    bool did = false;
    bool all = true;
    // Transports allocate per-comm GPU memory (Google's TCPX: the receive bounce buffer) on the
    // calling thread's current GPU: make it the one this endpoint serves.
    if (config_.gpu_index >= 0 && config_.gpu_index < cuda::device_count()) {
        Status st = cuda::device().select(static_cast<int>(config_.gpu_index));
        if (!st.ok()) TCPX_LOG(kDebug, "endpoint '%s': %s", name_.c_str(), st.to_string().c_str());
    }
    for (int i = 0; i < p.channels; ++i) {
        Channel& tx = p.tx[static_cast<size_t>(i)];
        Channel& rx = p.rx[static_cast<size_t>(i)];
        if (tx.send == nullptr) {
            Status st =
                net_->connect(dev_, &p.remote_handles[static_cast<size_t>(i)], &tx.send, nullptr);
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
    p.state = Peer::State::kReady;
    TCPX_DEBUG("endpoint '%s': peer '%s' ready (%d channels)", name_.c_str(), p.name.c_str(),
               p.channels);
    if (!p.outbound) {
        p.in_accept_queue = true;
        accept_queue_.push_back(p.id);
    }
}

bool Endpoint::Impl::read_control(Peer& p) {
    bool eof = false;
    Status st = p.ctrl.read(&eof);
    if (!st.ok()) {
        fail_peer(p, st);
        return true;
    }
    bool did = false;
    while (p.state != Peer::State::kFailed) {
        wire::Header h;
        std::string_view body;
        auto more = p.ctrl.next_message(&h, &body);
        if (!more.ok()) {
            fail_peer(p, more.status());
            return true;
        }
        if (!*more) break;
        did = true;
        p.last_recv = Clock::now();
        st = dispatch(p, h, body);
        if (!st.ok()) {
            fail_peer(p, st);
            return true;
        }
    }
    if (eof && p.state != Peer::State::kFailed) {
        fail_peer(p, unavailable(p.ctrl.buffered() > 0
                                     ? "peer closed the connection in the middle of a message"
                                     : "peer closed the connection"));
        return true;
    }
    return did;
}

bool Endpoint::Impl::progress_peer(Peer& p, bool readable) {
    bool did = false;
    if (p.state == Peer::State::kConnecting || p.state == Peer::State::kChannels) {
        did |= progress_handshake(p);
    }
    if (p.state == Peer::State::kFailed) return true;
    if (readable) did |= read_control(p);
    if (p.state == Peer::State::kChannels) did |= progress_handshake(p);
    if (p.state == Peer::State::kReady) {
        for (Channel& ch : p.rx) {
            if (p.state != Peer::State::kReady) break;
            if (ch.busy()) did |= progress_channel(p, ch, false);
        }
        for (Channel& ch : p.tx) {
            if (p.state != Peer::State::kReady) break;
            if (ch.busy()) did |= progress_channel(p, ch, true);
        }
    }
    if (p.state == Peer::State::kFailed) return true;
    if (p.ctrl.has_output()) {
        Status st = p.ctrl.flush();
        if (!st.ok()) {
            fail_peer(p, st);
            return true;
        }
    }
    // Liveness: heartbeats when quiet, and a deadline on hearing from the peer.
    const auto now = Clock::now();
    const auto timeout = std::chrono::milliseconds(config_.peer_timeout_ms);
    if (p.state == Peer::State::kReady) {
        if (now - p.last_send > timeout / 4) {
            send_ctrl(p, wire::encode_empty(wire::MsgType::kPing));
            (void)p.ctrl.flush();
        }
        if (now - p.last_recv > timeout) {
            fail_peer(p, timeout_error(strformat("no word from the peer for %lld ms",
                                                 static_cast<long long>(config_.peer_timeout_ms))));
            return true;
        }
    }
    return did;
}

void Endpoint::Impl::fail_peer(Peer& p, Status why) {
    if (p.state == Peer::State::kFailed) return;
    p.error = std::move(why).with_context("peer '" + p.name + "'");
    const bool lost =
        std::any_of(p.xfers.begin(), p.xfers.end(), [](const Xfer* x) { return x->user_id != 0; });
    if (lost) {
        TCPX_WARN("endpoint '%s': %s", name_.c_str(), p.error.to_string().c_str());
    } else {
        TCPX_DEBUG("endpoint '%s': %s", name_.c_str(), p.error.to_string().c_str());
    }
    p.state = Peer::State::kFailed;
    // Close the data channels first: once close returns, the transport touches none of the
    // buffers of the requests it abandons, so the transfers can be failed and their regions
    // released.
    // GPU work of the channels goes first (it may be writing into the transfers' regions), then
    // the staging slots' registrations, and the slots themselves once the comm is closed.
    for (bool tx : {true, false}) {
        for (Channel& ch : tx ? p.tx : p.rx) {
            if (ch.ring) ch.ring->synchronize();
            drop_mrs(ch, tx);
            if (tx && ch.send != nullptr) (void)net_->close_send(ch.send);
            if (!tx && ch.recv != nullptr) (void)net_->close_recv(ch.recv);
            ch.send = nullptr;
            ch.recv = nullptr;
            active_ops_ -= ch.queued.size() + ch.inflight.size() + ch.finishing.size();
            ch.queued.clear();
            ch.inflight.clear();
            ch.finishing.clear();
            ch.staged_ahead = 0;
            ch.ring.reset();
        }
    }
    for (net::ListenComm* l : p.listens) (void)net_->close_listen(l);
    p.listens.clear();
    std::vector<Xfer*> xfers(p.xfers.begin(), p.xfers.end());
    for (Xfer* x : xfers) {
        if (x->user_id != 0) xfers_->finish(x->user_id, p.error);
        destroy(x);
    }
    p.awaiting.clear();
    p.posted_recvs.clear();
    p.unexpected.clear();
    if (p.ctrl.valid()) {
        ::epoll_ctl(epfd_, EPOLL_CTL_DEL, p.ctrl.fd(), nullptr);
        p.ctrl.close();
    }
}

void Endpoint::Impl::reap_peers() {
    // Failed peers the application never learnt of (inbound, not accepted) have nobody to tell.
    for (auto it = peers_.begin(); it != peers_.end();) {
        const Peer& p = *it->second;
        if (p.state == Peer::State::kFailed && !p.known_to_user && !p.outbound) {
            it = peers_.erase(it);
        } else {
            ++it;
        }
    }
}

}  // namespace tcpx
