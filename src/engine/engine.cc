// The engine's skeleton: creation, the progress loop, peers. The handshake (authentication,
// HELLO, data channels) is in engine_handshake.cc, posting and completion in engine_xfer.cc, the
// data channels in engine_channels.cc, the control messages of ready peers in engine_dispatch.cc.
#include "engine/engine.h"

#include <netinet/in.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "common/log.h"
#include "common/machine.h"
#include "common/random.h"
#include "common/status_util.h"
#include "common/strings.h"
#include "engine/ctrl_wire.h"
#include "engine/metadata.h"
#include "net/fault/fault_net.h"
#include "net/nic_select.h"
#include "net/plugin/plugin_loader.h"
#include "net/socket/socket_net.h"

namespace tcpx {

using engine::Clock;
namespace wire = engine::wire;

namespace {

// epoll tags: peer ids start at 1.
constexpr uint64_t kListenTag = 0;
constexpr uint64_t kMaxUnpackChunk = 4u << 20;
constexpr uint64_t kWakeTag = ~uint64_t{0};
constexpr uint64_t kCompletionTag = ~uint64_t{0} - 1;
// The transport's progress fd (Net::progress_fd(): socket I/O done by the progress thread).
constexpr uint64_t kNetTag = ~uint64_t{0} - 2;
// How often timers (handshake deadlines, heartbeats, liveness, stalled channels) are looked at:
// peers with nothing to do cost nothing between ticks.
constexpr auto kTick = std::chrono::milliseconds(50);
// A quiet peer hears from us at least this often, whatever our own PEER_TIMEOUT_MS (liveness,
// below): a thousand quiet peers cost a thousand small messages a second.
constexpr auto kMaxHeartbeatEvery = std::chrono::milliseconds(1000);
// How long a peer's data channels being set up are polled on every pass; after that they are
// looked at on the tick (needs_polling).
constexpr auto kChannelsPolledFor = std::chrono::milliseconds(250);
// Control output the socket has not taken for this long is waited for with EPOLLOUT instead of
// polling (Peer::watch_out). Not at once: switching the interest on every short wait costs
// syscalls and wakeups on the busy path (an EPOLLOUT watch set as soon as output waited made
// 1 MiB GPU transfers slower on the two-H200 machine, f221b9d).
constexpr auto kWatchOutputAfter = std::chrono::milliseconds(5);
// Parts of a peer's control stream (CtrlConn::read: 256 KiB or one message each) one call of
// read_control handles at most.
constexpr int kControlReadRounds = 16;
// And at most this many synchronous copies of GPU memory (inline data of small requests, about
// 10 us each under the engine's lock) per call: a peer streaming small requests for GPU memory
// kept the thread from every other peer for a whole buffer of them (thousands of copies).
constexpr uint64_t kSyncCopiesPerRead = 64;
// How long a failed peer's transport requests get to end before their comm is closed with them
// (over transports whose close does not release registrations: fail_peer).
constexpr auto kTeardownGrace = std::chrono::milliseconds(100);
// The progress thread with transport requests in flight and nothing moving: this many passes
// (yielding between them), for kBusySpinFor at most, then a sleep until the transport signals a
// completion, or where it signals none (or GPU work is in flight), timed sleeps: kShortNaps of
// kMinBusySleep, then doubling up to kMaxBusySleep. The time bound matters on a loaded machine:
// there each yield can hand the core to another process for milliseconds, and a thread that
// sleeps is woken sooner than one that keeps yielding.
// The spin is skipped while it does not pay: when most of the recent waits for work (requests in
// flight, completions the transport signals) lasted longer than kBusySpinFor (engine::SpinScore).
// That is a wire slower than the machine (a rate-limited NIC, a far peer): each wake moves a
// little (a writable socket, one completion), and a spin after each cost a third of the CPU per GB
// moved in caller mode on a 1 Gbit/s link. On a fast wire the work comes within microseconds, and
// the spin catches it sooner and cheaper than a sleep and a wakeup would.
constexpr int kBusySpins = 256;
constexpr auto kBusySpinFor = std::chrono::microseconds(100);
// The same spin once a pass that moved something has left nothing in flight (PROGRESS_QUIET_SPIN,
// by default on machines of more than 4 usable cores), while most recent quiet spells ended
// within kBusySpinFor (engine::QuietSpin: requests arriving back to back, as a peer's
// one-at-a-time transfers do): the next request is then read by a thread still polling, not one
// woken from epoll, which on a VM is a halted vCPU's wakeup, several microseconds each way (4 KiB
// lone WRITE p50 on a 16-core H200 VM, three alternating rounds: 20.8-22.1 us without, 14.6-15.4
// with; READ 20.6-23.7 against 12.4-15.1). Where requests come further apart the score turns
// the spin off. Not by default on a few cores, where the spin would take a core from the
// threads doing the work (the stand-back below, for the same reason).
// An API call waiting for a transfer (drive()): polls, yielding, this long, then sleeps until
// what it waits for happens (wake_waiters()). The spin is skipped, as the progress thread's is,
// while most recent waits were long (a wire slower than the machine): an application that waits
// with a short timeout again and again (1 ms in the benchmark's window) would otherwise spin for
// a fifth of its time, and be woken every few KiB.
constexpr auto kDriveSpinFor = std::chrono::microseconds(200);
// A wait that ends within this counts as short: spinning (and waking the waiter after every pass
// that moved something, so that it steps in while the progress thread sleeps) pays. A lone 1 MiB
// transfer over loopback on two cores takes 200-300 us; on a 1 Gbit/s wire it takes 9 ms.
constexpr auto kShortWait = std::chrono::milliseconds(1);
constexpr int kShortNaps = 4;
constexpr auto kMinBusySleep = std::chrono::nanoseconds(50'000);
constexpr auto kMaxBusySleep = std::chrono::nanoseconds(400'000);
// While API calls make progress themselves in a loop (an application polling, as NIXL's users
// poll getXferStatus: passes less than kCallerLoop apart), the progress thread stands back until
// none has for kCallerProgressFor: two threads taking turns at the lock and handing work across
// cores moved a third less at 64-256 KiB (8 in flight, 16 cores) than the polling thread alone.
// A caller that stops polling leaves progress to the thread again within that; one that goes to
// sleep in wait() hands it back at once (hand_back_progress). On a few cores the thread looks
// again only every millisecond: there each of its wakeups takes a core from the threads doing
// the work (64 KiB WRITE on two cores: 0.8-0.9x the thread alone when it looked every 100 us,
// 1.2-1.4x every millisecond). A caller that polls now and then (passes further apart) never
// makes it stand back.
constexpr auto kCallerLoop = std::chrono::microseconds(50);
constexpr auto kCallerProgressFor = std::chrono::microseconds(100);
constexpr auto kCallerProgressForFewCores = std::chrono::milliseconds(1);

// A teardown step under way (Teardown::kRunning) that an exception cuts short goes back to
// kNone, for a later fail_peer to finish: every step can run again.
struct TeardownStep {
    using Peer = engine::Peer;
    Peer& peer;
    explicit TeardownStep(Peer& p) : peer(p) { peer.teardown = Peer::Teardown::kRunning; }
    ~TeardownStep() {
        if (peer.teardown == Peer::Teardown::kRunning) peer.teardown = Peer::Teardown::kNone;
    }
};

}  // namespace

// Rails: the socket transport's interfaces, when chosen (SOCKET_IFNAME, or the GPU's NICs), each
// carry some of a peer's channels, channel i on rail i mod n, so that a peer's traffic is striped
// over every NIC. Not the interfaces found by default (a management NIC among them would slow
// every peer down). Only with a shared secret: an unauthenticated peer's channel handles must
// name the address it talks to us from (check_handles), which other NICs' addresses are not.
void Endpoint::Impl::choose_rails() {
    rails_.assign(1, dev_);
    const int n = net_->device_count();
    if (!config_.net_plugin.empty() || n <= 1 || config_.socket_ifname.empty()) return;
    if (config_.auth_secret.empty()) {
        TCPX_INFO(
            "endpoint '%s': %d interfaces, but striping a peer over several needs "
            "TCPX_P2P_AUTH_SECRET: using one",
            name_.c_str(), n);
        return;
    }
    rails_.clear();
    for (int d = 0; d < n; ++d) rails_.push_back(d);
    // At least a channel per rail (both sides must want as many: a peer uses the smaller count).
    const int64_t channels = std::min<int64_t>(std::max<int64_t>(config_.channels, n), 16);
    if (channels != config_.channels) {
        TCPX_INFO("endpoint '%s': %lld channels, at least one on each of %d interfaces",
                  name_.c_str(), static_cast<long long>(channels), n);
        config_.channels = channels;
    }
}

// --- creation and shutdown
// -------------------------------------------------------------------------

StatusOr<std::unique_ptr<Endpoint::Impl>> Endpoint::Impl::create(const Config& config,
                                                                 std::string name) {
    std::unique_ptr<Impl> impl(new Impl());
    TCPX_RETURN_IF_ERROR(impl->init(config, std::move(name)));
    return impl;
}

Status Endpoint::Impl::init(const Config& requested, std::string name) {
    TCPX_RETURN_IF_ERROR(requested.validate());
    config_ = requested.effective();
    const Config& config = config_;
    if (name.size() > wire::kMaxName) {
        return invalid_argument(
            strformat("endpoint name of %zu bytes exceeds %zu", name.size(), wire::kMaxName));
    }
    // Peers refuse a name with control characters in a handshake: refused here, it says why.
    if (!wire::valid_name(name)) {
        return invalid_argument("endpoint name '" + printable(name) + "' holds control characters");
    }
    // The NIC(s) closest to our GPU, or those TCPX_P2P_GPU_NIC_MAP names (docs/topology.md):
    // the socket transport's interfaces (and so the control listener's) unless SOCKET_IFNAME is
    // set, or the plugin's device.
    const int gpu = static_cast<int>(config.gpu_index);
    // A GPU this process does not see would be advertised to peers and matched to no NIC (the
    // default interfaces instead, or the plugin's first device): refused, with the count.
    if (gpu >= 0) {
        const int gpus = cuda::device_count();
        if (gpu >= gpus) {
            return invalid_argument(strformat(
                "TCPX_P2P_GPU_INDEX is %d, but this process sees %d GPU%s (indices are the "
                "process's own: CUDA_VISIBLE_DEVICES renumbers them from 0)",
                gpu, gpus, gpus == 1 ? "" : "s"));
        }
    }
    const std::string gpu_pci = gpu >= 0 ? cuda::device().pci_bus_id(gpu) : std::string();
    if (config.net_plugin.empty()) {
        if (gpu >= 0) {
            TCPX_ASSIGN_OR_RETURN(std::string ifname,
                                  net::socket_ifname_for_gpu(config_, gpu, gpu_pci));
            if (!ifname.empty()) config_.socket_ifname = std::move(ifname);
        }
        // SOCKET_IO=caller (`auto` picks it on machines of 4 cores or fewer): whoever
        // makes progress does the sockets' I/O, no I/O thread to wake per chunk (engine.md,
        // Progress).
        TCPX_ASSIGN_OR_RETURN(net_,
                              net::SocketNet::create(config, config.socket_io == "caller"
                                                                 ? net::SocketNet::Io::kInCaller
                                                                 : net::SocketNet::Io::kThreads));
    } else {
        TCPX_ASSIGN_OR_RETURN(net_, net::load_net_plugin(config.net_plugin, config));
        if (gpu >= 0) {
            TCPX_ASSIGN_OR_RETURN(dev_, net::net_device_for_gpu(*net_, config, gpu, gpu_pci));
        }
    }
    if (!config.fault.empty()) {
        TCPX_ASSIGN_OR_RETURN(net_, net::make_fault_net(std::move(net_), config.fault));
    }
    TCPX_RETURN_IF_ERROR(net_->get_properties(dev_, &props_));
    plugin_places_bytes_ = props_.places_bytes;  // else learnt (note_placed_bytes)
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
    TCPX_ASSIGN_OR_RETURN(nonce_, random_u64());
    secrets_ = engine::auth::Secrets(config.auth_secret, config.auth_secret_previous);
    if (!secrets_.enabled()) {
        static std::atomic<bool> said{false};
        if (!said.exchange(true)) {
            TCPX_WARN(
                "no TCPX_P2P_AUTH_SECRET: endpoints accept every peer that reaches their port "
                "(see docs/security.md)");
        }
    }
    name_ = name.empty() ? listen_addr_.to_string() : std::move(name);
    choose_rails();
    TCPX_ASSIGN_OR_RETURN(const uint64_t first_gen, random_u64());
    xfers_ = std::make_unique<engine::XferTable>(static_cast<size_t>(config.max_transfers),
                                                 static_cast<uint32_t>(first_gen));
    ctrl_room_.limit = config.max_ctrl_buffer_total;
    reply_room_.limit = config.max_queued_replies_total;
    reply_share_ = std::max<uint64_t>(
        64 << 10, config.max_queued_replies_total / static_cast<uint64_t>(config.max_peers));
    max_queued_replies_ =
        engine::kInlineReplyBudget +
        std::max(engine::kMinReplyRoomTotal,
                 static_cast<uint64_t>(config.max_transfers) * engine::kReplyRoom);

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
    stage_times_ = config.stage_times == "on";
    caller_progress_for_ = usable_cores() <= 4 ? Clock::duration(kCallerProgressForFewCores)
                                               : Clock::duration(kCallerProgressFor);
    spin_when_quiet_ = config.progress_quiet_spin == "on";  // (effective(): never "auto")
    if (own_progress_thread_ && net_->completion_wakeup() != nullptr) {
        completions_ = net_->completion_wakeup();
        ev.data.u64 = kCompletionTag;
        if (::epoll_ctl(epfd_, EPOLL_CTL_ADD, completions_->fd(), &ev) != 0) {
            return errno_status(errno, "epoll_ctl");
        }
    }
    if (own_progress_thread_ && net_->progress_fd() >= 0) {
        // The transport's I/O is this thread's: it sleeps on the sockets too.
        ev.data.u64 = kNetTag;
        if (::epoll_ctl(epfd_, EPOLL_CTL_ADD, net_->progress_fd(), &ev) != 0) {
            return errno_status(errno, "epoll_ctl");
        }
    }
    if (own_progress_thread_) progress_thread_ = std::thread([this] { run_progress_thread(); });
    TCPX_INFO("endpoint '%s' listening on %s (%d channels, window %d)", name_.c_str(),
              listen_addr_.to_string().c_str(), static_cast<int>(config.channels), window_);
    return Status();
}

Endpoint::Impl::~Impl() {
    stop_.store(true);
    wake();
    hand_back_progress();  // a thread standing back for callers ends that too
    if (progress_thread_.joinable()) progress_thread_.join();
    auto lock = api_lock();
    // Every peer failed first, then each settled: the graces of the requests a plugin still
    // holds run side by side, not one after another.
    for (bool settle : {false, true}) {
        for (auto& [id, p] : peers_) {
            if (gone(*p)) continue;
            // A destructor lets nothing out: out of memory here would end the process.
            try {
                if (p->state != Peer::State::kFailed) {
                    say_bye(*p, "");
                    fail_peer(*p, cancelled("the endpoint was destroyed"));
                }
                if (settle) settle_peer(*p);
            } catch (...) {
                report_progress_exception();
                if (settle) close_comms(*p);  // its buffers go with it below
            }
        }
    }
    // Every chunk operation belongs to a peer's channels, all torn down now: one still counted
    // is one that left them without being subtracted, which kept the progress thread napping
    // (busy) where it should have slept. Said, so that tests catch it.
    if (active_ops_ != 0) {
        TCPX_WARN("endpoint '%s': %llu chunk operations still counted at close (an engine bug)",
                  name_.c_str(), static_cast<unsigned long long>(active_ops_));
    }
    if (scratch_bytes_ != 0) {  // (the same for the drains' scratch buffers)
        TCPX_WARN("endpoint '%s': %llu bytes of scratch still counted at close (an engine bug)",
                  name_.c_str(), static_cast<unsigned long long>(scratch_bytes_));
    }
    drop_pooled();              // (rings channels gave up, not taken again)
    if (staging_bytes_ != 0) {  // (and for the channels' staging)
        TCPX_WARN("endpoint '%s': %llu bytes of staging still counted at close (an engine bug)",
                  name_.c_str(), static_cast<unsigned long long>(staging_bytes_));
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

void Endpoint::Impl::hand_back_progress() {
    if (caller_progress_at_.load(std::memory_order_relaxed) == Clock::time_point{}) return;
    caller_progress_at_.store(Clock::time_point{});
    if (standing_back_.load()) {
        const uint64_t one = 1;
        (void)!::write(wake_fd_.get(), &one, sizeof(one));
    }
}

void Endpoint::Impl::api_progress() {
    const uint64_t ops = active_ops_;
    bool moved = false;
    for (int pass = 0; pass < 4 && progress_once(); ++pass) moved = true;
    if (!own_progress_thread_) return;
    const auto now = Clock::now();
    if (now - caller_last_pass_ < kCallerLoop) {
        caller_progress_at_.store(now, std::memory_order_relaxed);
    }
    caller_last_pass_ = now;
    if (moved || active_ops_ != ops) wake();
}

bool Endpoint::Impl::progress_once(bool sleeper) {
    try {
        return progress_pass(sleeper);
    } catch (...) {
        // Outside any one peer (accepting, the pass's own bookkeeping; a peer's own failures
        // fail that peer, progress_peer): nothing is left half changed that the next pass cannot
        // redo. Neither the progress thread nor an API call that makes progress lets it out:
        // the thread serves every peer, and a caller told of an error might free memory that
        // its transfers still use.
        report_progress_exception();
        return false;
    }
}

bool Endpoint::Impl::progress_pass(bool sleeper) {
    ++passes_;
    oldest_wait_prev_ = oldest_wait_cur_;  // (take_staging)
    oldest_wait_cur_ = Clock::time_point::max();
    // A transport without threads of its own moves bytes only here.
    bool did = net_->progress();
    // Every control socket with something for us, in one call: the buffer has room for every
    // watched socket, so however many are ready, each is served in this pass (level-triggered:
    // one left out would come back at once and could starve the rest).
    events_.resize(peers_.size() + 4);  // + the listener, the two wakeups and the transport
    const int n = ::epoll_wait(epfd_, events_.data(), static_cast<int>(events_.size()), 0);
    std::unordered_set<PeerId> ready;
    bool listen_ready = false;
    bool net_ready = false;
    for (int i = 0; i < n; ++i) {
        const uint64_t tag = events_[static_cast<size_t>(i)].data.u64;
        if (tag == kListenTag) {
            listen_ready = true;
        } else if (tag == kWakeTag) {
            // Only the progress thread takes its wakeups: an API call's pass that drained one
            // meant for the sleeping thread would leave it asleep with work to do.
            uint64_t v;
            while (sleeper && ::read(wake_fd_.get(), &v, sizeof(v)) > 0) {
            }
        } else if (tag == kCompletionTag) {
            if (sleeper) completions_->drain();  // the requests are tested below either way
        } else if (tag == kNetTag) {
            net_ready = true;  // sockets became ready since this pass's progress() above
        } else {
            ready.insert(tag);
        }
    }
    if (listen_ready) {
        accept_inbound();
        did = true;
    }
    if (net_ready && net_->progress()) did = true;
    const auto now = Clock::now();
    const bool tick = now >= next_tick_;
    if (tick) next_tick_ = now + kTick;
    if (tick) resume_listener_when_due(now);
    if (tick && !staging_pool_.empty() && oldest_wait_prev_ == Clock::time_point::max() &&
        now - staging_pool_changed_ > std::chrono::seconds(1)) {
        drop_pooled();  // nothing waited for staging this last second: the spare rings go
    }
    // GPU registrations no request uses make way for a newcomer's sockets, while a listener of
    // the process (any endpoint's: the budget is the process's) leaves one waiting for room.
    if (tick && props_.gpu_regs_counted && registrations_held() > 0 && room_wanted()) {
        const uint64_t used = budget_used() + channel_sockets() + 1;
        const uint64_t budget = socket_budget();
        if (used >= budget)
            (void)give_up_idle_registrations(static_cast<size_t>(used - budget + 1));
    }
    for (auto& [id, p] : peers_) {
        if (p->state == Peer::State::kFailed) {
            if (p->teardown == Peer::Teardown::kDraining) {
                try {
                    drain_peer(*p, false);
                } catch (...) {
                    // No memory to finish it: the next pass tries again (fail_peer, below).
                }
            } else if (p->teardown != Peer::Teardown::kDone) {
                try {
                    fail_peer(*p, Status());  // finishing a teardown cut short (the error stands)
                } catch (...) {
                    // Still no memory: the next pass tries again.
                }
            }
            continue;
        }
        const bool is_ready = ready.count(id) != 0;
        if (is_ready || tick || needs_polling(*p)) did |= progress_peer(*p, is_ready, tick);
    }
    reap_peers();
    return did;
}

void Endpoint::Impl::pause_listener() {
    if (listen_paused_until_) return;
    epoll_event ev{};
    ev.data.u64 = kListenTag;  // no events: the listener is still in the set, silent
    if (::epoll_ctl(epfd_, EPOLL_CTL_MOD, listen_fd_.get(), &ev) != 0) return;
    listen_paused_until_ = Clock::now() + engine::kListenPause;
}

void Endpoint::Impl::resume_listener_when_due(Clock::time_point now) {
    if (!listen_paused_until_ || now < *listen_paused_until_) return;
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.u64 = kListenTag;
    if (::epoll_ctl(epfd_, EPOLL_CTL_MOD, listen_fd_.get(), &ev) == 0) listen_paused_until_.reset();
}

bool Endpoint::Impl::needs_polling(const Peer& p) const {
    // Transports signal no socket of ours: channels being set up, and requests in flight, are
    // polled. Everything else waits for its control socket or a tick.
    // Channels being set up: for their first moments (a real peer's take a few round trips);
    // after that on the tick, so that strangers whose channels never come up (without a
    // secret, any host can get that far) do not keep the thread polling until their deadline.
    if (p.state == Peer::State::kChannels)
        return Clock::now() - p.channels_since < kChannelsPolledFor;
    if (p.ctrl_broken) return !p.ctrl_paused;  // (step_peer)
    if (p.ctrl_backlog && !p.ctrl_paused) return true;
    // Output the socket has not taken: polled, unless it has waited long enough for epoll to
    // watch for room (watch_output).
    if (p.ctrl.has_output() && !(p.state == Peer::State::kReady && p.watch_out)) return true;
    if (p.state != Peer::State::kReady) return false;
    if (!p.tx_pending.empty() || !p.rx_pending.empty()) return true;
    for (const Channel& ch : p.tx) {
        if (ch.busy()) return true;
    }
    for (const Channel& ch : p.rx) {
        if (ch.busy()) return true;
    }
    return false;
}

bool Endpoint::Impl::waits_on_transport_only(const Peer& p) const {
    if (p.state != Peer::State::kReady || (p.ctrl.has_output() && !p.watch_out)) return false;
    if (p.ctrl_backlog) return false;  // messages read and not yet handled
    // GPU work (staging copies, kernels) finishes on the GPU, which signals nothing: polled.
    const auto host = [](const engine::Op& op) {
        return op.path == engine::OpPath::kHost || op.path == engine::OpPath::kGather;
    };
    for (const auto* side : {&p.tx, &p.rx}) {
        for (const Channel& ch : *side) {
            // Staging others free signals nothing either.
            if (ch.staging_wait && ch.busy()) return false;
            for (const engine::Op& op : ch.queued) {
                if (!host(op)) return false;
            }
            for (const Channel::InFlight& f : ch.inflight) {
                if (!host(f.op)) return false;
            }
            for (const Channel::InFlight& f : ch.finishing) {
                if (!host(f.op)) return false;
            }
        }
    }
    return true;
}

bool Endpoint::Impl::drive(const std::function<bool()>& done, Clock::time_point deadline,
                           bool learn) {
    const auto start = Clock::now();
    const auto spin_until = wait_spin_.pays() ? start + kDriveSpinFor : start;
    // Whether what this call waited for came soon enough for the spin to pay; a call that gave
    // up sooner (a poll with a short timeout) says nothing either way.
    const auto finish = [&](bool finished) {
        const bool quick = Clock::now() - start < kShortWait;
        if (quick && !finished) return false;
        if (learn) wait_spin_.record(quick);
        return finished;
    };
    for (int spins = 0;; ++spins) {
        {
            std::unique_lock<std::mutex> lock(mu_, std::try_to_lock);
            if (lock.owns_lock()) {
                if (done()) return finish(true);
                // Step in, progress thread or not: this thread sees what it waits for first,
                // with no wakeup, and while it keeps doing so the progress thread stands back.
                api_progress();
                if (done()) return finish(true);
            }
        }
        const auto now = Clock::now();
        if (now >= deadline) return finish(false);
        if (spins < 2000 && now < spin_until) {
            std::this_thread::yield();
        } else if (own_progress_thread_) {
            // The progress thread moves everything: sleep until what this call waits for happens
            // (wake_waiters(): a transfer finishes, a peer becomes ready or fails; while waits
            // are short, any pass that moved something), a tick at most.
            std::unique_lock<std::mutex> lock(mu_);
            if (done()) return finish(true);
            hand_back_progress();
            ++progress_waiters_;
            progress_cv_.wait_until(lock, std::min(deadline, Clock::now() + kTick));
            --progress_waiters_;
        } else {
            std::this_thread::sleep_for(std::chrono::microseconds(50));
        }
    }
}

void Endpoint::Impl::report_progress_exception() noexcept {
    // A line a second at most: while memory stays short, every pass may fail the same way.
    static std::atomic<int64_t> last_s{-1};
    const int64_t now_s =
        std::chrono::duration_cast<std::chrono::seconds>(Clock::now().time_since_epoch()).count();
    if (last_s.exchange(now_s) == now_s) return;
    try {
        const Status st = status_of_current_exception("progress");
        TCPX_ERROR("endpoint '%s': %s", name_.c_str(), st.to_string().c_str());
    } catch (...) {
        TCPX_ERROR("endpoint '%s': progress: out of memory", name_.c_str());
    }
}

bool Endpoint::Impl::stand_back_for_callers() {
    if (Clock::now() - caller_progress_at_.load(std::memory_order_relaxed) >=
        caller_progress_for_) {
        return false;
    }
    // Announce it, then look again (hand_back_progress() stores, then reads standing_back_).
    standing_back_.store(true);
    const auto left = caller_progress_for_ - (Clock::now() - caller_progress_at_.load());
    if (left > Clock::duration::zero() && !stop_.load()) {
        // A caller made progress moments ago and is likely to again: leave it to it, until its
        // pass grows old or it hands progress back.
        const int64_t ns = std::max<int64_t>(
            std::chrono::duration_cast<std::chrono::nanoseconds>(left).count(), 20'000);
        const timespec ts{ns / 1'000'000'000, static_cast<long>(ns % 1'000'000'000)};
        pollfd pfd{wake_fd_.get(), POLLIN, 0};
        if (::ppoll(&pfd, 1, &ts, nullptr) > 0) {
            // Drained here, or the next stand-back would end at once. Nothing is lost: wake()
            // writes only while sleeping_, and the work it announces is in posted_.
            uint64_t v;
            while (::read(wake_fd_.get(), &v, sizeof(v)) > 0) {
            }
        }
    }
    standing_back_.store(false);
    return true;
}

void Endpoint::Impl::run_progress_thread() {
    pthread_setname_np(pthread_self(), "tcpx-progress");
    int idle = 0;                  // passes in a row that moved nothing
    Clock::time_point idle_since;  // since the first of them
    int naps = 0;  // timed sleeps in a row that moved nothing, while requests are in flight
    // Since when nothing moved while something was in flight (unset: moving, or nothing to wait
    // for), and how many recent such waits a spin would have caught: whether it pays (above).
    Clock::time_point waiting_since{};
    engine::SpinScore spin;
    // Spells of nothing to do with nothing in flight, and whether to spin through them.
    engine::QuietSpin<Clock::time_point, Clock::duration> quiet(spin_when_quiet_, kBusySpinFor);
    while (!stop_.load()) {
        if (stand_back_for_callers()) {
            idle = 0;
            naps = 0;
            continue;
        }
        const uint64_t posted = posted_.load();
        bool did = false;
        bool busy = false;
        // Busy with something no file descriptor signals (everything, without the transport's
        // completion wakeup).
        bool poll = completions_ == nullptr;
        int heartbeat_ms = 1000;
        {
            std::lock_guard<std::mutex> lock(mu_);
            did = progress_once(true);
            busy = active_ops_ > 0;
            for (auto& [id, p] : peers_) {
                if (p->state == Peer::State::kFailed || !needs_polling(*p)) continue;
                busy = true;
                if (poll || !waits_on_transport_only(*p)) {
                    poll = true;
                    break;
                }
            }
            // While waits are short (a fast wire), a waiter woken by every pass that moved
            // something steps in when this thread sleeps (drive()) and sees its reply with no
            // further wakeup; on a slow wire that would wake it every few KiB for nothing.
            if (did && wait_spin_.pays()) wake_waiters();
            // Timers are checked every tick: sleep no longer than that.
            heartbeat_ms = static_cast<int>(
                std::clamp<int64_t>(config_.peer_timeout_ms / 8, 1, kTick.count()));
        }
        // Let API calls waiting for the lock in (posting threads would otherwise lose the race
        // for it again and again).
        for (int i = 0; i < 1000 && api_waiting_.load() > 0; ++i) std::this_thread::yield();
        if (did) {
            if (waiting_since != Clock::time_point{}) {
                const bool caught = Clock::now() - waiting_since < kBusySpinFor;
                spin.record(caught);
                waiting_since = Clock::time_point{};
            }
            quiet.moved(Clock::now());
            idle = 0;
            naps = 0;
            continue;
        }
        const auto now = Clock::now();
        if (!busy) {
            waiting_since = Clock::time_point{};
            quiet.quiet(now);
        } else {
            quiet.busy();
            if (waiting_since == Clock::time_point{}) waiting_since = now;
        }
        if (idle++ == 0) idle_since = now;
        // GPU work signals nothing: it is always spun for (then napped for) as before.
        const bool spin_pays = busy ? poll || spin.pays() : quiet.spin(now);
        if (spin_pays && idle < kBusySpins && now - idle_since < kBusySpinFor) {
            std::this_thread::yield();
            continue;
        }
        // Nothing moved for a while: sleep until a control socket or a wake says otherwise, or
        // briefly while chunk requests are in flight (the transport signals no fd for those).
        // While they stay in flight with nothing moving (a wire slower than this machine), the
        // thread naps instead of spinning again after each sleep, and the naps grow (after
        // kShortNaps short ones) up to kMaxBusySleep: the transport's I/O threads keep the wire
        // busy meanwhile, and a window of requests in flight outlasts the longest nap. Anything
        // that moves starts over.
        sleeping_.store(true);
        if (posted_.load() != posted || stop_.load()) {  // work came in meanwhile: no sleep
            sleeping_.store(false);
            idle = 0;
            naps = 0;
            continue;
        }
        epoll_event ev;
        if (busy && !poll) {
            // Only transport requests in flight, and the transport signals their completions:
            // arm its wakeup, look once more (a request may have finished since the pass above,
            // before the arming), then sleep until one finishes, a control socket or a wake.
            completions_->arm();
            bool moved = false;
            {
                std::lock_guard<std::mutex> lock(mu_);
                moved = progress_once(true);
                if (moved && wait_spin_.pays()) wake_waiters();
            }
            if (!moved) ::epoll_wait(epfd_, &ev, 1, heartbeat_ms);
            naps = 0;
        } else if (busy) {
            // The first kShortNaps stay short: a lone transfer finishing a few hundred us in
            // sees it no later than it would have with spins between the naps.
            const int64_t ns =
                std::min<int64_t>(kMinBusySleep.count() << std::clamp(naps - kShortNaps, 0, 8),
                                  kMaxBusySleep.count());
            const timespec ts{0, static_cast<long>(ns)};
            // A control socket or a wake (a posting thread) ends the nap early: spin again.
            naps = ::epoll_pwait2(epfd_, &ev, 1, &ts, nullptr) > 0 ? 0 : naps + 1;
        } else {
            ::epoll_wait(epfd_, &ev, 1, heartbeat_ms);
            naps = 0;
        }
        sleeping_.store(false);
        if (naps == 0) idle = 0;
    }
}

// --- peers
// -----------------------------------------------------------------------------------------

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
    if (p.state != Peer::State::kFailed) {
        say_bye(p, "");
        fail_peer(p, cancelled("disconnected by this endpoint"));
    }
    // Requests a plugin still holds get their grace, with the other peers served meanwhile.
    settle_peers(lock, {peer});
    // As reap_peers() forgets a peer: who it was stays known for its notifications, and its
    // place in the accept queue goes (an application that ends every connection itself and
    // never calls accept() would otherwise keep one there for each).
    if (it = peers_.find(peer); it != peers_.end()) {
        remember_gone(*it->second);
        peers_.erase(it);
        std::erase(accept_queue_, peer);
    }
    return Status();
}

void Endpoint::Impl::remember_gone(const Peer& p) {
    // Its notifications still queued, or returned by the last call: the application may ask who
    // sent them until its next call.
    if (p.notif_count == 0 &&
        (p.notif_returned_in == 0 || p.notif_returned_in != notification_calls_)) {
        return;
    }
    try {
        gone_.insert_or_assign(p.id,
                               GoneIdentity{p.name, p.address, p.authenticated, p.notif_count});
    } catch (const std::bad_alloc&) {
        // Unrecorded, its notifications match no metadata (peer_matches fails closed): a
        // shortage drops them rather than vouching for them.
    }
}

void Endpoint::Impl::settle_peers(std::unique_lock<std::mutex>& lock,
                                  const std::vector<PeerId>& ids) {
    const auto draining = [&] {
        return std::any_of(ids.begin(), ids.end(), [&](PeerId id) {
            auto it = peers_.find(id);
            return it != peers_.end() && it->second->teardown == Peer::Teardown::kDraining;
        });
    };
    if (draining()) {
        // The transport's grace, and GPU work however long it takes (it may wait behind the
        // application's kernels: the lock is not held meanwhile).
        lock.unlock();
        drive([&] { return !draining(); }, Clock::time_point::max(), false);
        lock.lock();
    }
    for (PeerId id : ids) {
        if (auto it = peers_.find(id); it != peers_.end()) settle_peer(*it->second);
    }
}

void Endpoint::Impl::close_comms(Peer& p) noexcept {
    for (bool tx : {true, false}) {
        for (Channel& ch : tx ? p.tx : p.rx) {
            if (tx && ch.send != nullptr) (void)net_->close_send(ch.send);
            if (!tx && ch.recv != nullptr) (void)net_->close_recv(ch.recv);
            ch.send = nullptr;
            ch.recv = nullptr;
        }
    }
    for (net::ListenComm* l : p.listens) (void)net_->close_listen(l);
    p.listens.clear();
}

StatusOr<std::string> Endpoint::Impl::peer_name(PeerId peer) {
    auto lock = api_lock();
    auto it = peers_.find(peer);
    if (it == peers_.end())
        return not_found(strformat("no peer %llu", static_cast<unsigned long long>(peer)));
    return it->second->name;
}

Status Endpoint::Impl::peer_matches(PeerId peer, std::string_view metadata) {
    auto described = engine::decode_metadata(metadata);
    if (!described.ok()) return Status(described.status()).with_context("peer_matches");
    // Who it is, from the peer, or (reaped with notifications still queued) its record; judged
    // outside the lock (is_own_address lists the interfaces).
    std::string name;
    SocketAddress from;
    bool authenticated = false;
    {
        auto lock = api_lock();
        if (auto it = peers_.find(peer); it != peers_.end()) {
            name = it->second->name;
            from = it->second->address;
            authenticated = it->second->authenticated;
        } else if (auto g = gone_.find(peer); g != gone_.end()) {
            name = g->second.name;
            from = g->second.address;
            authenticated = g->second.authenticated;
        } else {
            return not_found(strformat("no peer %llu", static_cast<unsigned long long>(peer)));
        }
    }
    if (name != described->name) {
        return unauthenticated(strformat("peer '%s' is not the endpoint '%s' described",
                                         printable(name).c_str(),
                                         printable(described->name).c_str()));
    }
    if (authenticated) return Status();
    // A stranger's word for its name is all it gives: its address is what TCP vouches for.
    const SocketAddress& listens = described->address;
    const bool same_host =
        from.same_host(listens) || (is_own_address(from) && is_own_address(listens));
    if (!same_host) {
        return unauthenticated(strformat(
            "peer '%s' talks to us from %s, not from the host of the endpoint of that name (%s)",
            printable(name).c_str(), from.host_string().c_str(), listens.host_string().c_str()));
    }
    return Status();
}

Stats Endpoint::Impl::stats() {
    auto lock = api_lock();
    Stats s = totals_;
    s.staging_bytes = staging_in_use();
    s.staging_peak_bytes = staging_peak_;
    return s;
}

StatusOr<Stats> Endpoint::Impl::peer_stats(PeerId peer) {
    auto lock = api_lock();
    auto it = peers_.find(peer);
    if (it == peers_.end()) {
        return not_found(strformat("no peer %llu", static_cast<unsigned long long>(peer)));
    }
    Stats s = it->second->stats;
    for (bool tx : {true, false}) {
        for (const Channel& ch : tx ? it->second->tx : it->second->rx) {
            s.staging_bytes += ch.held.total();
        }
    }
    return s;
}

Status Endpoint::Impl::peer_status(PeerId peer) {
    if (!own_progress_thread_) {
        std::unique_lock<std::mutex> lock(mu_, std::try_to_lock);
        if (lock.owns_lock()) progress_once();
    }
    auto lock = api_lock();
    return ready_peer(peer).status();
}

StatusOr<Endpoint::Impl::Peer*> Endpoint::Impl::postable_peer(PeerId id) {
    auto it = peers_.find(id);
    if (it != peers_.end() && it->second->outbound && it->second->state != Peer::State::kReady &&
        it->second->state != Peer::State::kFailed) {
        return it->second.get();
    }
    return ready_peer(id);
}

Status Endpoint::Impl::check_deferrable(const Peer& p) const {
    if (p.state == Peer::State::kReady || p.deferred.size() < engine::kMaxDeferred) {
        return Status();
    }
    return resource_exhausted(
        strformat("peer '%s' is still connecting and %zu requests already wait for it",
                  p.name.c_str(), p.deferred.size()));
}

void Endpoint::Impl::issue_or_defer(Peer& p, std::function<void()> issue) {
    if (p.state == Peer::State::kReady) {
        issue();
    } else {
        p.deferred.push_back(std::move(issue));
    }
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

void Endpoint::Impl::send_ctrl(Peer& p, std::string msg, std::string tail) {
    p.ctrl.queue(std::move(msg), std::move(tail));
    p.last_send = Clock::now();
}

void Endpoint::Impl::send_reply(Peer& p, std::string msg, std::string tail) {
    p.ctrl.queue_reply(std::move(msg), std::move(tail));
    p.last_send = Clock::now();
}

bool Endpoint::Impl::read_control(Peer& p) {
    bool did = false;
    const uint64_t copies_at_start = sync_copies_;
    p.ctrl_backlog = false;
    // What has arrived is read a little at a time (CtrlConn::read), each part handled before
    // the next is read: a few rounds per call, so that a peer streaming at us does not keep
    // this thread from the others (the socket stays readable: the next pass comes back).
    bool more = true;
    for (int round = 0; more && round < kControlReadRounds; ++round) {
        bool eof = false;
        // A failed read (a reset) is reported once the whole messages that came before it are
        // handled: a peer's last notifications, which waited for room, are not lost with it.
        const Status read_status = p.ctrl.read(&eof, &more);
        Status st;
        while (p.state != Peer::State::kFailed) {
            wire::Header h;
            std::string_view body;
            auto whole = p.ctrl.next_message(&h, &body);
            if (!whole.ok()) {
                fail_peer(p, whole.status());
                return true;
            }
            if (!*whole) break;
            did = true;
            p.last_recv = Clock::now();
            st = in_handshake(p) ? dispatch_handshake(p, static_cast<wire::MsgType>(h.type), body)
                                 : dispatch(p, h, body);
            if (!st.ok()) {
                fail_peer(p, st);
                return true;
            }
            if (p.ctrl_paused) {
                // The message waits for room (a NOTIF): handed out again when reading resumes.
                p.ctrl.unread_message();
                return true;
            }
            if (p.state != Peer::State::kFailed && replies_past_bound(p)) {
                // What is queued went out as far as the socket took it (flush), and the peer
                // keeps asking: it does not read what it asks for.
                (void)p.ctrl.flush();
                if (replies_past_bound(p)) {
                    // Closed with a reset: a graceful close would leave the kernel holding what
                    // the socket took (megabytes) for a peer that reads nothing, and it hears
                    // no BYE.
                    const linger abort_close{1, 0};
                    (void)::setsockopt(p.ctrl.fd(), SOL_SOCKET, SO_LINGER, &abort_close,
                                       sizeof(abort_close));
                    fail_peer(p, resource_exhausted(strformat(
                                     "the peer asks without reading the replies: %llu bytes of "
                                     "them queued (%llu for all peers together)",
                                     static_cast<unsigned long long>(p.ctrl.reply_bytes()),
                                     static_cast<unsigned long long>(reply_room_.used))));
                    return true;
                }
            }
            if (p.state != Peer::State::kFailed && read_status.ok() && !eof &&
                sync_copies_ - copies_at_start >= kSyncCopiesPerRead) {
                p.ctrl_backlog = true;  // the rest next pass
                return true;
            }
        }
        if (p.state == Peer::State::kFailed) return true;
        if (!read_status.ok()) {
            fail_peer(p, read_status);
            return true;
        }
        if (eof) {
            fail_peer(p, unavailable(p.ctrl.buffered() > 0
                                         ? "peer closed the connection in the middle of a message"
                                         : "peer closed the connection"));
            return true;
        }
        if (p.ctrl.starved()) {
            // The message in front waits for room, unread (TCP holds the rest back).
            if (const Status paused = pause_for_ctrl_room(p); !paused.ok()) fail_peer(p, paused);
            return true;
        }
    }
    return did;
}

bool Endpoint::Impl::replies_past_bound(const Peer& p) const {
    const uint64_t mine = p.ctrl.reply_bytes();
    return mine > max_queued_replies_ ||
           (reply_room_.used > reply_room_.limit && mine >= reply_share_);
}

bool Endpoint::Impl::set_interest(Peer& p, bool paused, bool out) {
    if (p.ctrl_broken) return true;  // out of the set
    epoll_event ev{};
    // Paused: no input (still in the set, reported only for errors and hangups).
    ev.events = (paused ? 0u : static_cast<uint32_t>(EPOLLIN)) | (out ? EPOLLOUT : 0u);
    ev.data.u64 = p.id;
    if (::epoll_ctl(epfd_, EPOLL_CTL_MOD, p.ctrl.fd(), &ev) != 0) return false;
    p.watch_out = out;
    return true;
}

void Endpoint::Impl::watch_output(Peer& p, Clock::time_point now) {
    if (!p.ctrl.has_output()) {
        p.out_blocked_since = {};
        if (p.watch_out) (void)set_interest(p, p.ctrl_paused, false);  // (else: one more wakeup)
        return;
    }
    if (p.out_blocked_since == Clock::time_point{}) {
        p.out_blocked_since = now;
    } else if (!p.watch_out && now - p.out_blocked_since >= kWatchOutputAfter) {
        (void)set_interest(p, p.ctrl_paused, true);  // (not taken: it stays polled)
    }
}

Status Endpoint::Impl::pause_control(Peer& p, uint64_t note) {
    if (!set_interest(p, true, p.watch_out)) {
        return errno_status(errno, "epoll_ctl (pausing a peer whose notification has no room)");
    }
    p.ctrl_paused = true;
    p.paused_note = note;
    p.paused_since = Clock::now();
    p.paused_need = read_room(p);
    p.paused_need.count += 1;
    p.paused_need.bytes += note;
    paused_need_.count += p.paused_need.count;
    paused_need_.bytes += p.paused_need.bytes;
    ++paused_peers_;
    TCPX_DEBUG(
        "endpoint '%s': peer '%s': a notification of %llu bytes waits for room; its "
        "control connection is not read meanwhile",
        name_.c_str(), p.name.c_str(), static_cast<unsigned long long>(note));
    return Status();
}

Status Endpoint::Impl::pause_for_ctrl_room(Peer& p) {
    if (!set_interest(p, true, p.watch_out)) {
        return errno_status(errno, "epoll_ctl (pausing a peer whose message has no room)");
    }
    p.ctrl_paused = true;
    p.paused_for_room = true;
    p.paused_note = 0;
    p.paused_since = Clock::now();
    ++paused_peers_;
    TCPX_DEBUG(
        "endpoint '%s': peer '%s': its next control message waits for buffer room (%llu of "
        "%llu bytes held for other messages); its control connection is not read meanwhile",
        name_.c_str(), p.name.c_str(), static_cast<unsigned long long>(ctrl_room_.used),
        static_cast<unsigned long long>(ctrl_room_.limit));
    return Status();
}

bool Endpoint::Impl::pause_can_end(const Peer& p) const {
    return p.paused_for_room ? p.ctrl.room_fits() : fits_notification(p, p.paused_note);
}

void Endpoint::Impl::unpause(Peer& p) noexcept {
    p.ctrl_paused = false;
    p.paused_for_room = false;
    --paused_peers_;
    paused_need_.count -= p.paused_need.count;
    paused_need_.bytes -= p.paused_need.bytes;
    p.paused_need = {};
}

bool Endpoint::Impl::resume_control(Peer& p) {
    unpause(p);
    // A broken socket stays out of the set: read_control, which comes next, handles what is
    // buffered and then fails the peer with the socket's error.
    if (!set_interest(p, false, p.watch_out)) {
        fail_peer(p, errno_status(errno, "epoll_ctl (resuming a peer)"));
        return false;
    }
    // Its heartbeats and answers were here all along, unread.
    const auto now = Clock::now();
    p.last_recv = now;
    p.last_answer = std::max(p.last_answer, now);
    return true;
}

bool Endpoint::Impl::step_paused(Peer& p, bool ready, bool tick, Clock::time_point now) {
    // Room first: what the peer sent before its connection broke is still handled (read_control
    // takes the whole messages buffered before it reports a failed read).
    if (pause_can_end(p)) return resume_control(p);
    if (ready && !p.ctrl_broken) {
        // Its socket is watched for nothing, so epoll reports it only for an error or a hangup.
        // What the peer sent before is still the application's: the socket leaves the set (or
        // it would be reported on every pass), and the wait goes on.
        pollfd pfd{p.ctrl.fd(), POLLIN, 0};
        if (::poll(&pfd, 1, 0) == 1 && (pfd.revents & (POLLERR | POLLHUP)) != 0) {
            (void)::epoll_ctl(epfd_, EPOLL_CTL_DEL, p.ctrl.fd(), nullptr);
            p.ctrl_broken = true;
        }
    }
    if (tick && now - p.paused_since > std::chrono::milliseconds(config_.peer_timeout_ms)) {
        const long long waited = config_.peer_timeout_ms;
        if (p.paused_for_room) {
            fail_peer(p, resource_exhausted(strformat(
                             "its next control message waited %lld ms (PEER_TIMEOUT_MS) for "
                             "buffer room: %llu of TCPX_P2P_MAX_CTRL_BUFFER_TOTAL's %llu bytes "
                             "held by other peers' messages",
                             waited, static_cast<unsigned long long>(ctrl_room_.used),
                             static_cast<unsigned long long>(ctrl_room_.limit))));
        } else {
            const Status room = notification_room(p, p.paused_note);
            fail_peer(p, resource_exhausted(strformat(
                             "%s; its next notification waited %lld ms for room (PEER_TIMEOUT_MS)",
                             std::string(room.message()).c_str(), waited)));
        }
    }
    return false;
}

void Endpoint::Impl::resume_paused_peers() {
    // Round the peers from the one after the peer resumed last, so that room that frees a
    // little at a time goes to each waiting peer in turn, not always to the first ones.
    auto it = peers_.upper_bound(last_resumed_);
    for (size_t left = peers_.size(); left > 0 && paused_peers_ > 0; --left) {
        if (it == peers_.end()) it = peers_.begin();
        Peer& p = *it->second;
        ++it;
        if (p.ctrl_paused && p.state == Peer::State::kReady && pause_can_end(p)) {
            last_resumed_ = p.id;
            progress_peer(p, false, false);  // (catches what it throws: fails that peer)
        }
    }
}

bool Endpoint::Impl::progress_peer(Peer& p, bool ready, bool tick) {
    try {
        return step_peer(p, ready, tick);
    } catch (...) {
        // Out of memory (or another exception) part way through serving a peer leaves its state
        // half changed: the peer is failed, its transfers end with the error, and the thread
        // (the progress thread, or an API call's) goes on serving the others. Letting it leave
        // the progress thread would end the process.
        fail_peer_for_exception(p, "serving the peer");
        return true;
    }
}

void Endpoint::Impl::fail_peer_for_exception(Peer& p, const char* where) noexcept {
    try {
        fail_peer(p, status_of_current_exception(where));
    } catch (...) {
        // No memory even for that. A teardown cut short is finished by a later pass
        // (progress_once); a peer not yet marked failed is served, and failed, again.
        TCPX_ERROR("endpoint '%s': out of memory failing a peer", name_.c_str());
    }
}

bool Endpoint::Impl::step_peer(Peer& p, bool ready, bool tick) {
    bool did = false;
    const auto now = Clock::now();
    if (!p.evict.ok()) {  // (take_staging)
        fail_peer(p, p.evict);
        return true;
    }
    if (in_handshake(p) && tick && now > p.deadline) {
        // (Its data channels may have waited for room in the socket budget all along.)
        fail_peer(p, p.no_room.ok()
                         ? timeout_error("handshake not done in time")
                         : timeout_error("handshake not done in time: " + p.no_room.to_string()));
        return true;
    }
    if (before_hello(p) && tick && !p.outbound && !p.authenticated &&
        now - p.started > kSocketBudgetGrace && socket_budget_pressed(channel_sockets() + 1)) {
        // Sockets are what the process has run short of: one that has not proved itself in
        // this long makes way (security.md, the socket budget).
        fail_peer(p, resource_exhausted(strformat(
                         "closed in its handshake after %lld ms: the process's TCP sockets are at "
                         "their bound (TCPX_P2P_MAX_SOCKETS)",
                         static_cast<long long>(kSocketBudgetGrace.count()))));
        return true;
    }
    if (p.state == Peer::State::kConnecting || p.state == Peer::State::kChannels) {
        did |= progress_handshake(p);
    }
    if (p.state == Peer::State::kFailed) return true;
    if (p.ctrl_paused) {
        // Resumed: the message that waited is handed out first. Still paused: not read.
        ready = step_paused(p, ready, tick, now);
        if (p.state == Peer::State::kFailed) return true;
        did |= ready;
    } else if (p.ctrl_broken) {
        // Out of the epoll set: read on every pass (needs_polling) until what it holds is
        // handled and its error ends it (read_control may stop after a part of it).
        ready = true;
    }
    if ((ready || p.ctrl_backlog) && p.state != Peer::State::kConnecting) {
        did |= read_control(p);
    }
    if (p.state == Peer::State::kChannels) did |= progress_handshake(p);
    if (p.state == Peer::State::kReady) {
        refill(p, false);
        refill(p, true);
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
    // (A broken connection takes nothing more: its error is reported by the read, once what
    // was read before it is handled.)
    if (p.ctrl.has_output() && !p.ctrl_broken) {
        Status st = p.ctrl.flush();
        if (!st.ok()) {
            fail_peer(p, st);
            return true;
        }
    }
    if (p.state == Peer::State::kReady && !p.ctrl_broken) watch_output(p, now);
    if (!tick || p.state != Peer::State::kReady) return did;
    p.ctrl.trim();  // (a read buffer a burst grew, once it is empty)
    // Liveness: heartbeats when quiet, a deadline on hearing from the peer, and one on every
    // channel with requests in flight (heartbeats say nothing of a lost chunk).
    const auto timeout = std::chrono::milliseconds(config_.peer_timeout_ms);
    // A heartbeat when quiet; and, busy or not, news of chunks moved since the last one: a peer
    // waiting for our answer to its request (a write's acknowledgement, when its data sat in
    // the socket buffers on its way to us) learns that we are serving it.
    // Every quarter of our timeout, and at least every kMaxHeartbeatEvery: PEER_TIMEOUT_MS is
    // each side's own, and a peer whose timeout is shorter than ours (down to about twice that)
    // must hear from us within its own.
    const auto every = std::min<Clock::duration>(timeout / 4, kMaxHeartbeatEvery);
    const bool quiet = now - p.last_send > every;
    const bool news = p.moved != p.moved_reported && now - p.reported_at > every;
    if ((quiet || news) && !p.ctrl_broken) {
        send_ctrl(p, wire::encode_ping(p.moved));
        p.moved_reported = p.moved;
        p.reported_at = now;
        (void)p.ctrl.flush();
    }
    if (p.ctrl_paused) {
        // Not read: its heartbeats and its answers to our requests wait in the socket, so
        // neither its silence nor its unanswered requests say anything meanwhile; the pause
        // has its own deadline (step_paused).
        p.last_recv = now;
        p.last_answer = std::max(p.last_answer, now);
        p.read_done_clock = now;
    }
    if (now - p.last_recv > timeout) {
        fail_peer(p, timeout_error(strformat("no word from the peer for %lld ms",
                                             static_cast<long long>(config_.peer_timeout_ms))));
        return true;
    }
    // Heartbeats say the peer is alive, not that it serves us: one that owes answers to our
    // requests (a write's acknowledgement, a read's response, a matched receive's data) and for
    // the timeout has answered none, moved no data on our channels and reported no chunk moved
    // on its own (its PINGs) will not answer (a peer stuck, or broken). Without this its
    // transfers would wait for ever. The deadline is twice the timeout: a peer whose own
    // checks find a stalled channel (the same timeout) ends the connection first, with its
    // reason. A long gap between our own checks (an endpoint without a progress thread, its
    // application away) restarts the clock: the answers may be waiting unread.
    // (Ticks come every kTick or a little later: a gap is a gap only well past that, whatever
    // the timeout; at the smallest timeouts half of it is no more than a tick.)
    if (now - p.last_tick > std::max<Clock::duration>(timeout / 2, 4 * kTick)) {
        p.last_answer = std::max(p.last_answer, now);
        p.read_done_clock = now;
    }
    p.last_tick = now;
    // Only while we owe nothing ourselves: chunks of ours still queued, in flight or finishing
    // are either waiting on our own staging (not the peer's doing) or under the channels' own
    // stall check below; the clock counts from their last completion.
    bool ours_pending = !p.tx_pending.empty() || !p.rx_pending.empty();
    Clock::time_point latest = p.last_answer;
    for (bool tx : {true, false}) {
        for (const Channel& ch : tx ? p.tx : p.rx) {
            ours_pending = ours_pending || ch.busy();
            latest = std::max(latest, ch.last_progress);
        }
    }
    if (p.answers_owed > 0 && !ours_pending && now - latest > 2 * timeout) {
        fail_peer(p, timeout_error(strformat(
                         "the peer answered none of our %llu requests waiting for an answer "
                         "and moved no data for %lld ms (its heartbeats still came)",
                         static_cast<unsigned long long>(p.answers_owed),
                         2 * static_cast<long long>(config_.peer_timeout_ms))));
        return true;
    }
    // The oldest read whose data has left us and whose READ_DONE has not come: the reader
    // holds our room for its notification, and nothing above bounds that (see read_done_due).
    if (!p.read_done_due.empty() &&
        now - std::max(p.read_done_due.begin()->first, p.read_done_clock) > 2 * timeout) {
        fail_peer(p,
                  timeout_error(strformat(
                      "the peer sent no READ_DONE for a read we served it %lld ms "
                      "ago (%zu such reads; we hold their notifications)",
                      static_cast<long long>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                                 now - p.read_done_due.begin()->first)
                                                 .count()),
                      p.read_done_due.size())));
        return true;
    }
    for (bool tx : {true, false}) {
        for (const Channel& ch : tx ? p.tx : p.rx) {
            if ((!ch.inflight.empty() || !ch.finishing.empty()) &&
                now - ch.last_progress > timeout) {
                fail_peer(
                    p, timeout_error(strformat("a data channel %s made no progress for %lld ms",
                                               tx ? "send" : "receive",
                                               static_cast<long long>(config_.peer_timeout_ms))));
                return true;
            }
            if (ch.refused_since != Clock::time_point{} && ch.inflight.empty() &&
                ch.finishing.empty() && !ch.queued.empty() && now - ch.refused_since > timeout) {
                fail_peer(p, timeout_error(strformat(
                                 "the transport took no %s request of a data channel for %lld "
                                 "ms, none of ours in it",
                                 tx ? "send" : "receive",
                                 static_cast<long long>(config_.peer_timeout_ms))));
                return true;
            }
        }
    }
    return did;
}

void Endpoint::Impl::say_bye(Peer& p, std::string_view reason) {
    if (p.said_bye || !p.ctrl.valid()) return;
    p.said_bye = true;
    p.ctrl.queue(wire::encode_bye(reason));
    (void)p.ctrl.flush();  // best effort: the connection closes right after
}

void Endpoint::Impl::fail_peer(Peer& p, Status why) {
    // Once failed, a call from inside the teardown (or after it) does nothing. A teardown an
    // exception cut short (out of memory) is finished by the next call (progress_once makes
    // it): every step below can run again, and the first error stands.
    if (p.state == Peer::State::kFailed && p.teardown != Peer::Teardown::kNone) return;
    TeardownStep step(p);  // an exception leaves it to be finished
    const bool first = p.state != Peer::State::kFailed;
    if (p.ctrl_paused) unpause(p);
    if (first) {
        // A ready peer learns why we end the connection (its transfers then fail with our
        // reason, not a bare "closed"); one that ended it, or is gone, does not read it, at no
        // cost. Sent last, as the close was: when the peer hears of it, nothing of ours touches
        // memory any more.
        if (p.state == Peer::State::kReady) p.bye = why.to_string();
        p.error = std::move(why).with_context("peer '" + p.name + "'");
        p.failed_seq = ++failures_;
        const bool lost = std::any_of(p.xfers.begin(), p.xfers.end(),
                                      [](const Xfer* x) { return x->user_id != 0; });
        if (lost) {
            TCPX_WARN("endpoint '%s': %s", name_.c_str(), p.error.to_string().c_str());
        } else {
            TCPX_DEBUG("endpoint '%s': %s", name_.c_str(), p.error.to_string().c_str());
        }
        p.state = Peer::State::kFailed;
        wake_waiters();  // connect() waits for this peer's fate
        count(p, &Stats::errors);
        if (stage_times_) log_stage_times(p);
    }
    // Nothing more is read from the peer; its connection stays open for the BYE.
    if (p.ctrl.valid()) ::epoll_ctl(epfd_, EPOLL_CTL_DEL, p.ctrl.fd(), nullptr);
    // The channels go first: their requests end (complete, or are abandoned by closing the comm,
    // after which the transport touches none of their buffers), then the transfers can be failed
    // and their regions released. GPU work goes first (it may be writing into the transfers'
    // regions). Memory is deregistered from a comm only once none of its requests is in flight
    // (a transport may still be reading a buffer it was given): over a transport whose close
    // does not release registrations (ncclNet plugins), requests get a short grace to finish,
    // and a comm that still has some after it is closed with its registrations, which close
    // releases. The grace runs over later passes (kDraining, drain_peer): waiting for it here,
    // under the engine's lock, would hold every other peer's progress and every post for up to
    // 100 ms per failing peer (a vanished host's requests never finish). The socket transport's
    // close releases them anyway: no grace.
    for (size_t i = 0; i < p.tx.size() && i < p.remote_handles.size(); ++i) {
        if (p.tx[i].send == nullptr) net_->abandon_connect(&p.remote_handles[i]);
    }
    // GPU work of the peer's rings (copies and kernels into and out of its transfers' regions)
    // is waited for the same way, over later passes: it may sit behind the application's
    // kernels for as long as they run, and a wait for it here held the engine's lock (every
    // API call, every other peer) that long.
    size_t in_flight = 0;
    for (bool tx : {true, false}) {
        for (Channel& ch : tx ? p.tx : p.rx) in_flight += ch.inflight.size();
    }
    const bool gpu_busy = gpu_work_left(p);
    if ((in_flight > 0 && !props_.close_releases_registrations) || gpu_busy) {
        if (p.drain_until == Clock::time_point{}) {
            p.drain_until = Clock::now() + kTeardownGrace;
            TCPX_DEBUG(
                "endpoint '%s': peer '%s': %zu transport requests in flight get up to "
                "100 ms to end (other peers are served meanwhile)",
                name_.c_str(), p.name.c_str(), in_flight);
        }
        p.teardown = Peer::Teardown::kDraining;
        drain_peer(p, false);
        return;
    }
    finish_teardown(p);
}

bool Endpoint::Impl::gpu_work_left(Peer& p) {
    bool busy = false;
    for (bool tx : {true, false}) {
        for (Channel& ch : tx ? p.tx : p.rx) {
            if (ch.ring && !ch.ring->idle()) busy = true;
            if (ch.gring && !ch.gring->idle()) busy = true;
        }
    }
    return busy;
}

void Endpoint::Impl::drain_peer(Peer& p, bool now_or_never) {
    if (p.teardown != Peer::Teardown::kDraining) return;
    // (The transport's requests get their grace only where its close does not release their
    // registrations; the socket transport's does.)
    const bool grace = !props_.close_releases_registrations;
    for (bool more = true; more;) {
        bool in_flight = false;
        for (bool tx : {true, false}) {
            if (!grace) break;
            for (Channel& ch : tx ? p.tx : p.rx) {
                // In the order posted: a plugin may require its requests tested so (Google's).
                while (!ch.inflight.empty()) {
                    bool done = false;
                    if (net_->test(ch.inflight.front().req, &done, nullptr).ok() && !done) break;
                    ch.inflight.pop_front();
                    --active_ops_;
                }
                in_flight |= !ch.inflight.empty();
            }
        }
        const bool waiting = in_flight && Clock::now() < p.drain_until;
        // GPU work has no grace: the transfers' regions are released only once it has ended.
        const bool gpu = gpu_work_left(p);
        more = waiting || gpu;
        if (!now_or_never) {
            if (more) return;  // a later pass looks again
        } else if (waiting) {
            (void)net_->progress();
        } else if (gpu) {
            for (bool tx : {true, false}) {  // (now or never: wait for it)
                for (Channel& ch : tx ? p.tx : p.rx) {
                    if (ch.ring) ch.ring->synchronize();
                    if (ch.gring) ch.gring->synchronize();
                }
            }
        }
    }
    TeardownStep step(p);  // cut short, the next pass (fail_peer) finishes it
    finish_teardown(p);
}

void Endpoint::Impl::settle_peer(Peer& p) {
    if (p.state != Peer::State::kFailed) return;
    if (p.teardown == Peer::Teardown::kNone) fail_peer(p, Status());  // cut short: finished
    drain_peer(p, true);
}

void Endpoint::Impl::finish_teardown(Peer& p) {
    size_t abandoned = 0;  // requests still in flight when their comm closed
    for (bool tx : {true, false}) {
        for (Channel& ch : tx ? p.tx : p.rx) {
            abandoned += ch.inflight.size();
            if (ch.inflight.empty()) drop_mrs(ch, tx);
        }
    }
    close_comms(p);  // (with the registrations of requests still in flight)
    // Those the close did not release either (Google's plugin: each CUDA one keeps a dma-buf
    // fd): deregistered now that nothing of the comm runs. Left, they stayed for good, one set
    // for every peer that failed with requests in flight (a vanished host's).
    if (abandoned > 0 && props_.dereg_after_close) {
        for (bool tx : {true, false}) {
            for (Channel& ch : tx ? p.tx : p.rx) {
                if (!ch.inflight.empty()) drop_mrs(ch, tx, /*after_close=*/true);
            }
        }
    }
    drop_read_notifications(p);  // no READ_DONE can come any more
    for (bool tx : {true, false}) {
        for (Channel& ch : tx ? p.tx : p.rx) {
            ch.mrs.clear();
            ch.scratch_mr = nullptr;
            ch.scratch_registered = false;
            free_scratch(ch);  // (the comm is closed: nothing writes it any more)
            ch.ring_mr = nullptr;
            ch.hslots_mr = nullptr;
            ch.gring_mr = nullptr;
            ch.gtwin_mr = nullptr;
            ch.gtwin = nullptr;
            active_ops_ -= ch.queued.size() + ch.inflight.size() + ch.finishing.size();
            ch.queued.clear();
            ch.inflight.clear();
            ch.finishing.clear();
            ch.staged_ahead = 0;
            // (freed off the lock and the progress thread, counted until they are)
            reaper_.put(std::move(ch.ring), ch.held.ring);
            reaper_.put(std::move(ch.gring), ch.held.gather);
            ch.hslots.reset();
            staging_bytes_ -= ch.held.total();
            ch.held = {};
            ch.staging_wait = false;
        }
    }
    if (abandoned > 0) {
        TCPX_DEBUG("endpoint '%s': peer '%s': %zu transport requests abandoned at close (%s)",
                   name_.c_str(), p.name.c_str(), abandoned,
                   props_.close_releases_registrations ? "at once: the close releases them"
                                                       : "after a grace of 100 ms");
    }
    for (auto* pending : {&p.tx_pending, &p.rx_pending}) {
        for (const engine::Extent& e : *pending) {
            const Xfer* x = e.xfer;
            const auto len_at = [x](size_t i) { return x->pieces[i].len; };
            active_ops_ -= engine::packer::count(len_at, x->pieces.size(), x->chunk, e.at);
        }
        pending->clear();
    }
    std::vector<Xfer*> xfers(p.xfers.begin(), p.xfers.end());
    for (Xfer* x : xfers) {
        // Each of ours was counted when it started; it ends failed here, also one a cancel has
        // already reported (detached: its id is 0, but it was still waiting for the peer).
        if (!x->served()) count(p, &Stats::transfers_failed);
        if (x->user_id != 0) xfers_->finish(x->user_id, p.error);
        destroy(x);
    }
    p.awaiting.clear();
    p.answers_owed = 0;
    p.posted_recvs.clear();
    served_weight_ -= p.unexpected.size();
    p.unexpected.clear();
    p.deferred.clear();
    if (p.bye) say_bye(p, *std::exchange(p.bye, std::nullopt));
    p.ctrl.close_after_draining_input();
    p.teardown = Peer::Teardown::kDone;
    wake_waiters();  // disconnect() may wait for the teardown
}

size_t Endpoint::Impl::live_peers() const {
    size_t n = 0;
    for (const auto& [id, p] : peers_) n += !gone(*p);
    return n;
}

void Endpoint::Impl::reap_peers() {
    // Failed peers the application never learnt of (inbound, not accepted) have nobody to tell.
    // Those it knows of stay, with their error, until disconnect(); but at most MAX_PEERS of
    // them: an application that never disconnects failed peers (an accept loop) would otherwise
    // keep one for every connection ever made.
    const auto is_record = [](const Peer& p) { return gone(p) && (p.known_to_user || p.outbound); };
    size_t records = 0;
    for (const auto& [id, p] : peers_) records += is_record(*p);
    // Past the bound, the records of the peers that failed first go (not the oldest peers: a
    // long-lived one that just failed keeps its error).
    uint64_t forget_up_to = 0;
    if (records > static_cast<size_t>(config_.max_peers)) {
        std::vector<uint64_t> seqs;
        seqs.reserve(records);
        for (const auto& [id, p] : peers_) {
            if (is_record(*p)) seqs.push_back(p->failed_seq);
        }
        const size_t excess = records - static_cast<size_t>(config_.max_peers);
        std::nth_element(seqs.begin(), seqs.begin() + static_cast<ptrdiff_t>(excess - 1),
                         seqs.end());
        forget_up_to = seqs[excess - 1];
    }
    bool reaped = false;
    for (auto it = peers_.begin(); it != peers_.end();) {
        const Peer& p = *it->second;
        const bool record = p.known_to_user || p.outbound;
        if (gone(p) && (!record || p.failed_seq <= forget_up_to)) {
            remember_gone(p);
            it = peers_.erase(it);
            reaped = true;
        } else {
            ++it;
        }
    }
    // Their places in the accept queue go with them: accept() would skip them, but an
    // application that never calls it would otherwise keep one for every connection ever made.
    if (reaped) {
        std::erase_if(accept_queue_, [this](PeerId id) { return !peers_.contains(id); });
    }
}

}  // namespace tcpx
