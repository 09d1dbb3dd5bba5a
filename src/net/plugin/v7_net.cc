#include "net/plugin/v7_net.h"

#include <dirent.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <optional>
#include <unordered_set>

#include "common/env.h"
#include "common/log.h"
#include "common/socket.h"
#include "common/status_util.h"
#include "common/strings.h"
#include "net/plugin/log_limiter.h"
#include "net/plugin/tcpx_layout.h"
#include "net/socket/socket_net.h"
#include "net/socket/socket_v7.h"
#include "net/v7_common.h"

namespace tcpx::net {
namespace {

constexpr uint32_t kSendWrap = 0x56375343;      // "V7SC"
constexpr uint32_t kRecvWrap = 0x56375243;      // "V7RC"
constexpr uint32_t kListenWrap = 0x56374c43;    // "V7LC"
constexpr uint32_t kRequestWrap = 0x56375251;   // "V7RQ"
constexpr uint32_t kParkedListen = 0x5637504c;  // "V7PL": closed, its accept not yet ended
constexpr int kMaxRecvs = kMaxRecvBuffers;
// Network devices a plugin may report (NICs and virtual NICs of one machine).
constexpr int kMaxDevices = 1024;

Status check_size(size_t size, size_t limit, const NcclNetTable& table, const char* what) {
    if (size > limit) {
        return invalid_argument(
            strformat("%s: %zu bytes exceed what this ncclNet v%d transport takes in one call "
                      "(%zu)",
                      what, size, table.version(), limit));
    }
    return Status();
}

DeviceHandle to_device_handle(const tcpx_ncclNetDeviceHandle_v7_t& h) {
    DeviceHandle out;
    out.type = static_cast<DeviceType>(h.netDeviceType);
    out.version = h.netDeviceVersion;
    out.handle = h.handle;
    out.size = h.size;
    out.needs_proxy_progress = h.needsProxyProgress != 0;
    return out;
}

// One address of a Google TCPX handle as a SocketAddress (port included), or why not.
StatusOr<SocketAddress> tcpx_handle_address(const google_tcpx::SocketAddress& a, const char* what) {
    socklen_t len = 0;
    if (a.sa.sa_family == AF_INET) {
        len = sizeof(sockaddr_in);
    } else if (a.sa.sa_family == AF_INET6) {
        len = sizeof(sockaddr_in6);
    } else {
        return invalid_argument(strformat("handle: %s has address family %d, not IPv4 or IPv6",
                                          what, static_cast<int>(a.sa.sa_family)));
    }
    TCPX_ASSIGN_OR_RETURN(SocketAddress addr, SocketAddress::from_sockaddr(&a.sa, len));
    if (addr.port() == 0) return invalid_argument(strformat("handle: %s has port 0", what));
    return addr;
}

// How a table's handles are read: by the setting, else by the table's name.
V7Net::HandleKind handle_kind_for(const std::string& table_name, const std::string& layout) {
    if (layout == "google-tcpx") return V7Net::HandleKind::kGoogleTcpx;
    if (layout == "socket") return V7Net::HandleKind::kSocket;
    if (table_name.rfind("GPUDirectTCPX", 0) == 0) return V7Net::HandleKind::kGoogleTcpx;
    if (table_name == kSocketTableName) return V7Net::HandleKind::kSocket;
    return V7Net::HandleKind::kUnknown;
}

}  // namespace

int own_tcpx_threads() {
    const std::optional<std::string> v = env_get("NCCL_SOCKET_NTHREADS");
    const int n = v.has_value() ? std::atoi(v->c_str()) : 1;
    return std::clamp(n, 1, google_tcpx::kMaxThreads);
}

Status check_tcpx_handle(Handle* handle, const SocketAddress& peer_address, int max_threads) {
    google_tcpx::Handle h;
    std::memcpy(&h, handle->bytes.data(), sizeof(h));
    TCPX_ASSIGN_OR_RETURN(SocketAddress data_addr,
                          tcpx_handle_address(h.connect_addr, "connect_addr"));
    // The control socket goes to ctrl_addr whether or not redirect_ctrl says it was redirected,
    // so it is checked either way.
    TCPX_ASSIGN_OR_RETURN(SocketAddress ctrl_addr, tcpx_handle_address(h.ctrl_addr, "ctrl_addr"));
    // A handle may only send us to the host the peer itself is on: never a third party. (An
    // empty address: an authenticated peer whose data NICs may differ from its control one.)
    for (const SocketAddress* addr : {&data_addr, &ctrl_addr}) {
        if (peer_address.size() != 0 && !names_peer_host(*addr, peer_address)) {
            return protocol_error(strformat("handle: %s names %s, but the peer is at %s",
                                            addr == &data_addr ? "connect_addr" : "ctrl_addr",
                                            addr->host_string().c_str(),
                                            peer_address.host_string().c_str()));
        }
    }
    if (h.num_socks < 1 || h.num_socks > google_tcpx::kMaxSockets) {
        return invalid_argument(strformat("handle: num_socks %d outside [1, %d]", h.num_socks,
                                          google_tcpx::kMaxSockets));
    }
    if (h.num_threads < 1 || h.num_threads > google_tcpx::kMaxThreads) {
        return invalid_argument(strformat("handle: num_threads %d outside [1, %d]", h.num_threads,
                                          google_tcpx::kMaxThreads));
    }
    // Google's connect takes both for its comm, and its thread t serves sockets t, t + threads,
    // ... for num_socks / num_threads rounds: sockets past the last whole round are never served
    // (with more threads than sockets, none is), and the connection's transfers stall.
    if (h.num_socks % h.num_threads != 0) {
        return invalid_argument(strformat(
            "handle: num_socks %d is not a multiple of num_threads %d (Google's plugin would "
            "serve only some of the sockets)",
            h.num_socks, h.num_threads));
    }
    // A link-local address names a host only on its link, and the handle's scope is the peer's
    // numbering of its own interfaces: we connect over the link the peer talks to us on (another
    // scope could reach another host of the same address), as the socket transport's check does.
    if (peer_address.size() != 0 && peer_address.is_link_local()) {
        for (google_tcpx::SocketAddress* a : {&h.connect_addr, &h.ctrl_addr}) {
            if (a->sa.sa_family != AF_INET6) continue;
            auto addr = SocketAddress::from_sockaddr(&a->sa, sizeof(sockaddr_in6));
            if (addr.ok() && addr->is_link_local()) a->sin6.sin6_scope_id = peer_address.scope_id();
        }
    }
    // Our side's threads are ours to choose (a multiple of them still serves every socket).
    max_threads = std::clamp(max_threads, 1, google_tcpx::kMaxThreads);
    while (h.num_threads > max_threads || h.num_socks % h.num_threads != 0) --h.num_threads;
    // connect() takes a non-null connect_args for its own state from an earlier call and follows
    // it: from the wire it is an address of the peer's choosing. The tail is unused.
    h.connect_args = nullptr;
    // redirect_ctrl is a C++ bool to the plugin: a byte other than 0 or 1 is no value it can
    // hold. Read as the byte it is on the wire and written back as one of the two.
    uint8_t redirect = 0;
    std::memcpy(&redirect, handle->bytes.data() + offsetof(google_tcpx::Handle, redirect_ctrl), 1);
    h.redirect_ctrl = redirect != 0;
    handle->bytes.fill(0);
    std::memcpy(handle->bytes.data(), &h, sizeof(h));
    return Status();
}

// A comm of the plugin plus the device-handle storage the plugin may fill in.
struct V7Net::CommWrap {
    uint32_t magic;
    void* comm = nullptr;
    bool reports_sizes = false;  // its device's (test() fills sizes only then)
    tcpx_ncclNetDeviceHandle_v7_t dev{};
    tcpx_ncclNetDeviceHandle_v7_t* dev_ptr = &dev;
    std::mutex mu;
    // Every request wrapper of this comm not yet released, so close frees abandoned ones.
    std::unordered_set<RequestWrap*> live;
    // Receives test() reported done, awaiting irecv_consumed(), oldest first (also in `live`).
    std::deque<RequestWrap*> completed;
};

struct V7Net::ListenWrap {
    uint32_t magic = kListenWrap;
    void* comm = nullptr;
    int dev = 0;
    // Storage for the next accepted comm, kept across accept() retries for the same reason.
    std::unique_ptr<CommWrap> next;
    // The plugin's accept() was called and has not yet yielded a comm or an error: the plugin
    // may be using the listen comm (Google's does, in a thread).
    bool accepting = false;
    std::mutex mu;
    // Google's layout: the addresses its listening sockets are bound to (the handle's
    // connect_addr and ctrl_addr), so that a parked accept can be ended
    // (end_parked_accepts_locked).
    std::vector<SocketAddress> bound;
    bool yielded = false;  // an accept of it has handed out a comm
    bool to_end = false;   // parked, its accept to be ended (end_parked_accepts_locked)
    // The sockets end_parked_accepts_locked shut down: descriptor and inode, to close those the
    // ended accept leaves open (Google's leaks them on its error paths).
    std::vector<std::pair<int, ino_t>> shut;
};

struct V7Net::RequestWrap {
    uint32_t magic = kRequestWrap;
    void* request = nullptr;
    CommWrap* comm = nullptr;
    bool is_recv = false;
    int n = 1;  // sizes test() reports: n for a receive, 1 for a send
};

V7Net::RequestWrap* V7Net::new_request(CommWrap* comm, void* request, bool is_recv, int n) {
    auto* r = new RequestWrap;
    r->request = request;
    r->comm = comm;
    r->is_recv = is_recv;
    r->n = n;
    std::lock_guard<std::mutex> lock(comm->mu);
    comm->live.insert(r);
    return r;
}

void V7Net::release_request(RequestWrap* r) {
    {
        std::lock_guard<std::mutex> lock(r->comm->mu);
        r->comm->live.erase(r);
    }
    r->magic = 0;
    delete r;
}

void V7Net::release_all(CommWrap* comm) {
    std::lock_guard<std::mutex> lock(comm->mu);
    for (RequestWrap* r : comm->live) delete r;
    comm->live.clear();
    comm->completed.clear();
}

StatusOr<std::unique_ptr<V7Net>> V7Net::create(const tcpx_ncclNet_v7_t* table, V7Options options) {
    if (table == nullptr) return invalid_argument("null ncclNet v7 table");
    return create(nccl_net_table(table, 7), options);
}

StatusOr<std::unique_ptr<V7Net>> V7Net::create(NcclNetTable* table, V7Options options) {
    if (table == nullptr) return invalid_argument("null ncclNet table");
    const std::string name = table->name() != nullptr ? table->name() : "(unnamed)";
    plugin_log_limiter().configure(options.settings.plugin_log_burst,
                                   options.settings.plugin_log_interval_ms);
    if (const char* missing = table->missing_function(); missing != nullptr) {
        return invalid_argument(
            strformat("ncclNet table '%s' lacks a required function (%s)", name.c_str(), missing));
    }
    {
        // One init per table and process: plugins set up global state there (Google's starts
        // threads and reads its environment once).
        static std::mutex mu;
        static std::unordered_set<const NcclNetTable*> initialized;
        std::lock_guard<std::mutex> lock(mu);
        if (initialized.count(table) == 0) {
            TCPX_RETURN_IF_ERROR(
                from_nccl_result(table->init(nccl_logger_into_tcpx_log()), name + ": init"));
            initialized.insert(table);
        }
    }
    int ndev = 0;
    TCPX_RETURN_IF_ERROR(from_nccl_result(table->devices(&ndev), name + ": devices"));
    if (ndev < 1) return not_found(name + ": no network devices");
    // More than any machine has: a broken plugin (the count is walked, e.g. for properties).
    if (ndev > kMaxDevices) {
        return invalid_argument(strformat("%s: reports %d network devices (at most %d are taken)",
                                          name.c_str(), ndev, kMaxDevices));
    }
    return std::unique_ptr<V7Net>(new V7Net(table, options, ndev));
}

V7Net::V7Net(const NcclNetTable* table, V7Options options, int ndev)
    : table_(table),
      options_(options),
      name_(table->name() != nullptr ? table->name() : "(unnamed)"),
      ndev_(ndev),
      handle_kind_(handle_kind_for(name_, options_.settings.plugin_handle_layout)),
      // (Google's: its deregMr reads only the handle, and its close releases none.)
      dereg_after_close_(name_.rfind("GPUDirectTCPX", 0) == 0),
      max_transfer_(table->max_transfer_bytes(ndev)) {
    Properties props;
    // Per device: a plugin's devices may differ (one UNPACK, another not).
    for (int dev = 0; dev < ndev_; ++dev) {
        reports_sizes_.push_back(get_properties(dev, &props).ok() && props.reports_sizes);
    }
}

V7Net::~V7Net() {
    reap_parked();
    std::lock_guard<std::mutex> lock(mu_);
    if (!parked_.empty()) {
        TCPX_DEBUG("%s: %zu listeners left open: their accept never ended", name_.c_str(),
                   parked_.size());
    }
    // A parked listener's accept never ended, so the plugin's listen comm stays open (its
    // accept may still use it). Our wrappers go: known plugins write them only inside calls; an
    // unknown one might write them later, so they stay allocated (the plugin is never unloaded).
    for (ListenWrap* l : parked_) {
        if (handle_kind_ == HandleKind::kUnknown) {
            (void)l->next.release();
        } else {
            delete l;
        }
    }
    parked_.clear();
    for (auto& w : abandoned_) (void)w.release();
    for (auto& [handle, w] : connecting_) {
        if (handle_kind_ == HandleKind::kUnknown) (void)w.release();
    }
}

void* V7Net::unwrap_comm(void* comm) {
    auto* w = static_cast<CommWrap*>(comm);
    if (w == nullptr || (w->magic != kSendWrap && w->magic != kRecvWrap)) return nullptr;
    return w->comm;
}

Status V7Net::get_properties(int dev, Properties* props) const {
    tcpx_ncclNetProperties_v7_t p{};
    TCPX_RETURN_IF_ERROR(
        from_nccl_result(table_->get_properties(dev, &p), name_ + ": getProperties"));
    *props = from_v7(p);
    const bool unpack = props->device_type == DeviceType::kUnpack;
    props->max_requests = options_.max_requests > 0 ? options_.max_requests : (unpack ? 16 : 8);
    props->reports_sizes = options_.reports_sizes.value_or(!unpack);
    // v7's regMr takes an int size (and NCCL refuses 2 GiB and more through v7): the engine
    // registers larger regions in windows of whole pages below that. v8 and later take a size_t.
    const size_t reg_limit = table_->max_reg_bytes();
    props->max_reg_size = reg_limit == SIZE_MAX ? 0 : reg_limit & ~size_t{4095};
    props->dereg_after_close = dereg_after_close_;
    props->gpu_regs_counted = true;  // (reg_mr)
    const std::string& places = options_.settings.plugin_places_bytes;
    props->places_bytes =
        places == "on" || (places == "auto" && handle_kind_ == HandleKind::kGoogleTcpx);
    return Status();
}

Status V7Net::listen(int dev, Handle* handle, ListenComm** listen_comm) {
    if (handle == nullptr || listen_comm == nullptr) {
        return invalid_argument("listen: null handle or comm");
    }
    *listen_comm = nullptr;
    reap_parked();
    auto w = std::make_unique<ListenWrap>();
    w->dev = dev;
    TCPX_RETURN_IF_ERROR(
        from_nccl_result(table_->listen(dev, handle->bytes.data(), &w->comm), name_ + ": listen"));
    if (w->comm == nullptr) {
        // (accept and closeListen would be handed a null comm)
        return internal_error(name_ + ": listen succeeded without a listen comm");
    }
    if (handle_kind_ == HandleKind::kGoogleTcpx) {
        google_tcpx::Handle h;
        std::memcpy(&h, handle->bytes.data(), sizeof(h));
        for (const google_tcpx::SocketAddress* a : {&h.connect_addr, &h.ctrl_addr}) {
            const socklen_t len =
                a->sa.sa_family == AF_INET6 ? sizeof(sockaddr_in6) : sizeof(sockaddr_in);
            auto addr = SocketAddress::from_sockaddr(&a->sa, len);
            if (addr.ok() && addr->port() != 0) w->bound.push_back(*addr);
        }
    }
    *listen_comm = reinterpret_cast<ListenComm*>(w.release());
    return Status();
}

Status V7Net::check_peer_handle(Handle* handle, const SocketAddress& peer_address) const {
    if (handle == nullptr) return invalid_argument("handle: null");
    switch (handle_kind_) {
        case HandleKind::kGoogleTcpx:
            return check_tcpx_handle(handle, peer_address, own_tcpx_threads()).with_context(name_);
        case HandleKind::kSocket:
            return check_socket_handle(handle, peer_address).with_context(name_);
        case HandleKind::kUnknown:
            break;
    }
    return Net::check_peer_handle(handle, peer_address);
}

Status V7Net::connect(int dev, Handle* handle, SendComm** send_comm, DeviceHandle* dev_handle) {
    if (handle == nullptr || send_comm == nullptr) {
        return invalid_argument("connect: null handle or comm");
    }
    reap_parked();
    *send_comm = nullptr;
    std::unique_ptr<CommWrap> w;
    {
        std::lock_guard<std::mutex> lock(mu_);
        auto it = connecting_.find(handle);
        if (it != connecting_.end()) {
            w = std::move(it->second);
            connecting_.erase(it);
        }
    }
    if (!w) {
        w = std::make_unique<CommWrap>();
        w->magic = kSendWrap;
    }
    w->reports_sizes = reports_sizes_of(dev);
    Status st = from_nccl_result(table_->connect(dev, handle->bytes.data(), &w->comm, &w->dev_ptr),
                                 name_ + ": connect");
    if (!st.ok()) return st;
    if (w->comm == nullptr) {
        std::lock_guard<std::mutex> lock(mu_);
        connecting_[handle] = std::move(w);
        return Status();
    }
    TCPX_RETURN_IF_ERROR(note_live_comm(w->comm, "connect"));
    if (dev_handle != nullptr) {
        *dev_handle = w->dev_ptr != nullptr ? to_device_handle(*w->dev_ptr) : DeviceHandle{};
    }
    *send_comm = reinterpret_cast<SendComm*>(w.release());
    return Status();
}

Status V7Net::accept(ListenComm* listen_comm, RecvComm** recv_comm, DeviceHandle* dev_handle) {
    reap_parked();
    auto* l = reinterpret_cast<ListenWrap*>(listen_comm);
    if (l == nullptr || l->magic != kListenWrap || recv_comm == nullptr) {
        return invalid_argument("accept: not a listen comm");
    }
    *recv_comm = nullptr;
    std::lock_guard<std::mutex> lock(l->mu);
    if (!l->next) {
        l->next = std::make_unique<CommWrap>();
        l->next->magic = kRecvWrap;
        l->next->reports_sizes = reports_sizes_of(l->dev);
    }
    CommWrap* w = l->next.get();
    Status st =
        from_nccl_result(table_->accept(l->comm, &w->comm, &w->dev_ptr), name_ + ": accept");
    l->accepting = st.ok() && w->comm == nullptr;
    if (!st.ok()) {
        // Google's accept hands out the comm its connection setup made, then sets up the device
        // handle and returns that step's error with the comm still made: closed here, or its
        // threads and sockets would stay for good.
        if (w->comm != nullptr) {
            (void)table_->close_recv(w->comm);
            l->next.reset();
        }
        return st;
    }
    if (w->comm == nullptr) return Status();
    if (Status live = note_live_comm(w->comm, "accept"); !live.ok()) {
        w->comm = nullptr;  // (another wrapper's: not closed through this one)
        return live;
    }
    l->yielded = true;
    if (dev_handle != nullptr) {
        *dev_handle = w->dev_ptr != nullptr ? to_device_handle(*w->dev_ptr) : DeviceHandle{};
    }
    *recv_comm = reinterpret_cast<RecvComm*>(l->next.release());
    return Status();
}

Status V7Net::reg_mr(void* comm, void* data, size_t size, MemType type, MemHandle** mhandle) {
    void* c = unwrap_comm(comm);
    if (c == nullptr || mhandle == nullptr) return invalid_argument("reg_mr: not a comm");
    TCPX_RETURN_IF_ERROR(check_size(size, table_->max_reg_bytes(), *table_, "reg_mr"));
    // GPU registrations hold a descriptor of the plugin's (Google's: a dma-buf fd), one per
    // comm and registration: each takes a place in the process's descriptor budget first.
    const bool counted = type != MemType::kHost;
    if (counted) TCPX_RETURN_IF_ERROR(take_registration_place("registering GPU memory"));
    // Given back on every way out but a registration recorded (an exception included).
    struct Place {
        bool held;
        ~Place() {
            if (held) give_back_registration_place();
        }
    } place{counted};
    void* mh = nullptr;
    Status st = from_nccl_result(table_->reg_mr(c, data, size, static_cast<int>(type), &mh),
                                 name_ + ": regMr");
    // A null handle is nothing to tell the registration by at deregMr: not counted (a plugin
    // that keeps a descriptor for a registration hands out a handle for it).
    if (counted && st.ok() && mh != nullptr) {
        try {
            std::lock_guard<std::mutex> lock(mu_);
            counted_mrs_.emplace(mh, comm);  // (a plugin may hand out one handle twice)
            place.held = false;
        } catch (...) {
            (void)table_->dereg_mr(c, mh);
            st = Status(StatusCode::kResourceExhausted, "reg_mr: out of memory");
        }
    }
    if (!st.ok()) return st;
    *mhandle = static_cast<MemHandle*>(mh);
    return Status();
}

Status V7Net::note_live_comm(void* comm, const char* call) {
    std::lock_guard<std::mutex> lock(mu_);
    if (!live_comms_.insert(comm).second) {
        return internal_error(strformat(
            "%s: %s handed out comm %p, which is open already (closing it twice would be the "
            "plugin's undoing)",
            name_.c_str(), call, comm));
    }
    return Status();
}

void V7Net::forget_live_comm(void* comm) {
    std::lock_guard<std::mutex> lock(mu_);
    live_comms_.erase(comm);
}

void V7Net::forget_counted_mr(void* comm, void* mhandle) {
    std::lock_guard<std::mutex> lock(mu_);
    // The one made with `comm` (null after the close: any made with the handle, all alike).
    auto [first, last] = counted_mrs_.equal_range(mhandle);
    if (first == last) return;
    auto it = std::find_if(first, last, [&](const auto& e) { return e.second == comm; });
    counted_mrs_.erase(it != last ? it : first);
    give_back_registration_place();
}

void V7Net::forget_counted_mrs_of(void* comm) {
    // Where the plugin's close releases what was registered with the comm (ncclNet v7 asks for
    // deregMr first, so this is what a close without it is taken to do); Google's releases
    // nothing (dereg_after_close_), and its registrations stay counted until deregistered.
    if (dereg_after_close_) return;
    std::lock_guard<std::mutex> lock(mu_);
    for (auto it = counted_mrs_.begin(); it != counted_mrs_.end();) {
        if (it->second == comm) {
            give_back_registration_place();
            it = counted_mrs_.erase(it);
        } else {
            ++it;
        }
    }
}

Status V7Net::dereg_mr(void* comm, MemHandle* mhandle) {
    // A counted registration's place goes back whatever the plugin says: the caller forgets
    // the handle either way, and a plugin that fails every deregMr must not take the
    // process's whole budget (its descriptors, if it keeps them, are its own leak).
    if (comm == nullptr && dereg_after_close_) {
        forget_counted_mr(nullptr, mhandle);
        return from_nccl_result(table_->dereg_mr(nullptr, mhandle),
                                name_ + ": deregMr (after its comm's close)");
    }
    void* c = unwrap_comm(comm);
    if (c == nullptr) return invalid_argument("dereg_mr: not a comm");
    forget_counted_mr(comm, mhandle);
    return from_nccl_result(table_->dereg_mr(c, mhandle), name_ + ": deregMr");
}

Status V7Net::isend(SendComm* comm, const void* data, size_t size, int tag, MemHandle* mhandle,
                    Request** request) {
    auto* w = reinterpret_cast<CommWrap*>(comm);
    if (w == nullptr || w->magic != kSendWrap || request == nullptr) {
        return invalid_argument("isend: not a send comm");
    }
    *request = nullptr;
    TCPX_RETURN_IF_ERROR(check_size(size, max_transfer_, *table_, "isend"));
    void* req = nullptr;
    TCPX_RETURN_IF_ERROR(
        from_nccl_result(table_->isend(w->comm, const_cast<void*>(data), size, tag, mhandle, &req),
                         name_ + ": isend"));
    if (req == nullptr) return Status();
    *request = reinterpret_cast<Request*>(new_request(w, req, false, 1));
    return Status();
}

Status V7Net::irecv(RecvComm* comm, int n, void* const* data, const size_t* sizes, const int* tags,
                    MemHandle* const* mhandles, Request** request) {
    auto* w = reinterpret_cast<CommWrap*>(comm);
    if (w == nullptr || w->magic != kRecvWrap || request == nullptr) {
        return invalid_argument("irecv: not a receive comm");
    }
    *request = nullptr;
    if (n < 1 || n > kMaxRecvs || data == nullptr || sizes == nullptr || tags == nullptr) {
        return invalid_argument(
            strformat("irecv: n = %d outside [1, %d] or null arrays", n, kMaxRecvs));
    }
    int int_tags[kMaxRecvs];
    void* bufs[kMaxRecvs];
    void* mhs[kMaxRecvs];
    for (int i = 0; i < n; ++i) {
        TCPX_RETURN_IF_ERROR(check_size(sizes[i], max_transfer_, *table_, "irecv"));
        int_tags[i] = tags[i];
        bufs[i] = data[i];
        mhs[i] = mhandles != nullptr ? mhandles[i] : nullptr;
    }
    void* req = nullptr;
    TCPX_RETURN_IF_ERROR(from_nccl_result(
        table_->irecv(w->comm, n, bufs, sizes, int_tags, mhs, &req), name_ + ": irecv"));
    if (req == nullptr) return Status();
    *request = reinterpret_cast<Request*>(new_request(w, req, true, n));
    return Status();
}

Status V7Net::test(Request* request, bool* done, size_t* sizes) {
    auto* r = reinterpret_cast<RequestWrap*>(request);
    if (r == nullptr || r->magic != kRequestWrap || done == nullptr) {
        return invalid_argument("test: not a request");
    }
    *done = false;
    int finished = 0;
    int int_sizes[kMaxRecvs];
    for (int& s : int_sizes) s = -1;
    const tcpx_ncclResult_t rc = table_->test(r->request, &finished, int_sizes);
    if (!nccl_call_ok(rc)) {
        // A failed request is finished too: release it as test() promises.
        release_request(r);
        *done = true;
        return from_nccl_result(rc, name_ + ": test");
    }
    if (!finished) return Status();
    *done = true;
    if (sizes != nullptr && r->comm->reports_sizes) {
        for (int i = 0; i < r->n; ++i) {
            sizes[i] = int_sizes[i] < 0 ? 0 : static_cast<size_t>(int_sizes[i]);
        }
    }
    if (r->is_recv && table_->has_irecv_consumed()) {
        // The plugin's own request pointer is needed once more, by irecv_consumed().
        std::lock_guard<std::mutex> lock(r->comm->mu);
        r->comm->completed.push_back(r);
        return Status();
    }
    release_request(r);
    return Status();
}

Status V7Net::irecv_consumed(RecvComm* comm, int n, Request* request) {
    auto* w = reinterpret_cast<CommWrap*>(comm);
    if (w == nullptr || w->magic != kRecvWrap)
        return invalid_argument("irecv_consumed: not a comm");
    if (!table_->has_irecv_consumed()) return Status();
    RequestWrap* r = nullptr;
    {
        std::lock_guard<std::mutex> lock(w->mu);
        if (w->completed.empty() ||
            w->completed.front() != reinterpret_cast<RequestWrap*>(request)) {
            return invalid_argument(
                "irecv_consumed: not the oldest completed receive of this comm");
        }
        r = w->completed.front();
        w->completed.pop_front();
    }
    Status st =
        from_nccl_result(table_->irecv_consumed(w->comm, n, r->request), name_ + ": irecvConsumed");
    release_request(r);
    return st;
}

StatusOr<UnpackSlot> V7Net::unpack_slot(RecvComm* comm, Request* request) {
    auto* w = reinterpret_cast<CommWrap*>(comm);
    auto* r = reinterpret_cast<RequestWrap*>(request);
    if (w == nullptr || w->magic != kRecvWrap) return invalid_argument("unpack_slot: not a comm");
    if (w->dev_ptr == nullptr || w->dev_ptr->netDeviceType != TCPX_NCCL_NET_DEVICE_UNPACK) {
        return failed_precondition("unpack_slot: the comm has no UNPACK device handle");
    }
    {
        std::lock_guard<std::mutex> lock(w->mu);
        if (std::find(w->completed.begin(), w->completed.end(), r) == w->completed.end()) {
            return invalid_argument("unpack_slot: not a completed, unconsumed receive of the comm");
        }
    }
    // Only Google's request layout is known (tcpx_layout.h): another UNPACK plugin's request
    // read as Google's would be read past its end.
    if (handle_kind_ != HandleKind::kGoogleTcpx) {
        return unimplemented(strformat(
            "%s: hands CUDA receives over as UNPACK, but its requests are not known to have "
            "Google's TCPX layout (TCPX_P2P_PLUGIN_HANDLE_LAYOUT=google-tcpx says they do)",
            name_.c_str()));
    }
    const auto* req = static_cast<const google_tcpx::Request*>(r->request);
    const google_tcpx::UnpackSlot& slot = req->unpack_slot;
    if (!slot.active || slot.idx >= static_cast<uint64_t>(google_tcpx::kQueueDepth) ||
        slot.mem == nullptr || slot.cnt == nullptr) {
        return protocol_error(strformat(
            "%s: a completed CUDA receive holds no valid unpack slot (active %d, index %llu)",
            name_.c_str(), slot.active ? 1 : 0, static_cast<unsigned long long>(slot.idx)));
    }
    return UnpackSlot{static_cast<int>(slot.idx), slot.mem, slot.cnt};
}

Status V7Net::close_send(SendComm* comm) {
    auto* w = reinterpret_cast<CommWrap*>(comm);
    if (w == nullptr) return Status();
    if (w->magic != kSendWrap) return invalid_argument("close_send: not a send comm");
    return close_wrap(w, table_->close_send(w->comm), "closeSend");
}

Status V7Net::close_recv(RecvComm* comm) {
    auto* w = reinterpret_cast<CommWrap*>(comm);
    if (w == nullptr) return Status();
    if (w->magic != kRecvWrap) return invalid_argument("close_recv: not a receive comm");
    return close_wrap(w, table_->close_recv(w->comm), "closeRecv");
}

Status V7Net::close_wrap(CommWrap* w, tcpx_ncclResult_t closed, const char* call) {
    Status st = from_nccl_result(closed, name_ + ": " + call);
    forget_live_comm(w->comm);
    forget_counted_mrs_of(w);
    release_all(w);
    w->magic = 0;
    delete w;
    return st;
}

void V7Net::abandon_connect(Handle* handle) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = connecting_.find(handle);
    if (it == connecting_.end()) return;
    if (handle_kind_ == HandleKind::kUnknown) abandoned_.push_back(std::move(it->second));
    connecting_.erase(it);
}

Status V7Net::close_listen_now(ListenWrap* l) {
    Status st = from_nccl_result(table_->close_listen(l->comm), name_ + ": closeListen");
    l->magic = 0;
    delete l;
    return st;
}

Status V7Net::close_listen(ListenComm* comm) {
    auto* l = reinterpret_cast<ListenWrap*>(comm);
    if (l == nullptr) return Status();
    if (l->magic != kListenWrap) return invalid_argument("close_listen: not a listen comm");
    bool accepting = false;
    {
        std::lock_guard<std::mutex> lock(l->mu);
        accepting = l->accepting;
    }
    if (!accepting) {
        reap_parked();
        return close_listen_now(l);
    }
    l->magic = kParkedListen;  // no longer the caller's: any use of it is refused
    l->to_end = !l->bound.empty() && !l->yielded;
    {
        std::lock_guard<std::mutex> lock(mu_);
        parked_.push_back(l);
        parked_count_.store(parked_.size(), std::memory_order_relaxed);
    }
    TCPX_DEBUG("%s: listener closed during an accept: closed once the accept ends", name_.c_str());
    reap_parked();
    return Status();
}

void V7Net::reap_parked() {
    std::vector<ListenWrap*> done;
    {
        std::lock_guard<std::mutex> lock(mu_);
        if (parked_.empty()) return;
        end_parked_accepts_locked();
        for (auto it = parked_.begin(); it != parked_.end();) {
            ListenWrap* l = *it;
            CommWrap* w = l->next.get();
            const tcpx_ncclResult_t rc = table_->accept(l->comm, &w->comm, &w->dev_ptr);
            const bool ok = nccl_call_ok(rc);
            if (ok && w->comm == nullptr) {
                ++it;
                continue;
            }
            // The accept ended: a connection nobody wants, or an error (which may come with the
            // comm made, as accept() takes it: closed either way).
            if (w->comm != nullptr) (void)table_->close_recv(w->comm);
            w->comm = nullptr;
            done.push_back(l);
            it = parked_.erase(it);
            parked_count_.store(parked_.size(), std::memory_order_relaxed);
        }
    }
    for (ListenWrap* l : done) {
        const std::vector<std::pair<int, ino_t>> shut = std::move(l->shut);
        Status st = close_listen_now(l);
        if (!st.ok()) TCPX_DEBUG("%s", st.to_string().c_str());
        // What the ended accept left open of the sockets shut down for it: still the same socket
        // (its inode), so no descriptor reused since is touched.
        for (const auto& [fd, ino] : shut) {
            struct stat st_now {};
            if (::fstat(fd, &st_now) == 0 && S_ISSOCK(st_now.st_mode) && st_now.st_ino == ino) {
                ::close(fd);
            }
        }
    }
}

namespace {

int64_t steady_ns() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
}

// A socket of the process bound to one of the addresses asked for, and which.
struct BoundSocket {
    int fd;
    ino_t ino;
    size_t which;  // index into `bound`
};

// The sockets of the process bound to one of `bound` that are listening or connected (a socket
// shut down earlier, whose port another may have taken since, is neither); none whose inode is
// in `skip`.
std::vector<BoundSocket> sockets_bound_to(const std::vector<SocketAddress>& bound,
                                          const std::unordered_set<ino_t>& skip) {
    std::vector<BoundSocket> found;
    DIR* dir = ::opendir("/proc/self/fd");
    if (dir == nullptr) return found;
    while (const dirent* e = ::readdir(dir)) {
        char* end = nullptr;
        const long parsed = std::strtol(e->d_name, &end, 10);
        if (end == e->d_name || *end != '\0' || parsed == ::dirfd(dir)) continue;
        const int fd = static_cast<int>(parsed);
        struct stat st {};
        if (::fstat(fd, &st) != 0 || !S_ISSOCK(st.st_mode) || skip.count(st.st_ino) != 0) continue;
        auto local = local_address(fd);
        if (!local.ok()) continue;
        const auto match = std::find_if(bound.begin(), bound.end(), [&](const SocketAddress& b) {
            return local->port() == b.port() && local->same_host(b);
        });
        if (match == bound.end()) continue;
        int listening = 0;
        socklen_t len = sizeof(listening);
        const bool listens =
            ::getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &len) == 0 && listening != 0;
        if (!listens && !peer_address(fd).ok()) continue;
        found.push_back(BoundSocket{fd, st.st_ino, static_cast<size_t>(match - bound.begin())});
    }
    ::closedir(dir);
    return found;
}

}  // namespace

void V7Net::end_parked_accepts_locked() {
    // Google's accept runs in a thread of its own that blocks in accept() and recv() on the
    // listener's sockets: a peer that never connects (a stranger that sent a HELLO and went)
    // keeps it, its listen comm and its sockets for good. Shutting down every socket bound to
    // the listener's addresses (the listening ones and those it accepted; its ports are its own:
    // it binds port 0 and no other socket can take them while it listens) makes those calls
    // fail, so the thread ends with an error that reap_parked() collects. Only for listeners
    // that never handed out a comm: one that did would have that comm's sockets on the same
    // ports. One scan of the process's descriptors serves every listener parked meanwhile, at
    // most once a second: each costs a few system calls per descriptor, and strangers can park
    // listeners as fast as they send HELLOs.
    if (!end_parked_accepts_) return;
    std::vector<SocketAddress> bound;  // of the listeners to end, each address with its owner
    std::vector<ListenWrap*> owner;
    for (ListenWrap* l : parked_) {
        if (!l->to_end) continue;
        bound.insert(bound.end(), l->bound.begin(), l->bound.end());
        owner.insert(owner.end(), l->bound.size(), l);
    }
    if (bound.empty()) return;
    const int64_t now = steady_ns();
    if (now < next_end_ns_) return;
    next_end_ns_ = now + 1'000'000'000;
    std::unordered_set<ino_t> skip;  // other parked listeners' sockets, shut down already
    for (const ListenWrap* l : parked_) {
        for (const auto& [fd, ino] : l->shut) skip.insert(ino);
    }
    // Collected first, then shut down; again until nothing new turns up (a connection a plugin
    // thread accepted while the first pass ran): once the listening sockets are shut down
    // nothing more can be accepted. Each is kept by its listener, to be closed after its accept
    // ends.
    size_t count = 0;
    for (int pass = 0; pass < 4; ++pass) {
        const auto found = sockets_bound_to(bound, skip);
        if (found.empty()) break;
        for (const BoundSocket& b : found) {
            ::shutdown(b.fd, SHUT_RDWR);
            skip.insert(b.ino);
            owner[b.which]->shut.emplace_back(b.fd, b.ino);
            ++count;
        }
    }
    for (ListenWrap* l : owner) l->to_end = false;
    TCPX_DEBUG("%s: ended parked accepts: %zu sockets of their listeners shut down", name_.c_str(),
               count);
}

bool V7Net::progress() {
    if (parked_count_.load(std::memory_order_relaxed) == 0) return false;
    const int64_t now = steady_ns();
    int64_t next = next_reap_ns_.load(std::memory_order_relaxed);
    if (now < next || !next_reap_ns_.compare_exchange_strong(next, now + 100'000'000)) {
        return false;
    }
    reap_parked();
    return false;  // (housekeeping: no request of the caller's moved)
}

size_t V7Net::parked_listeners() const {
    std::lock_guard<std::mutex> lock(mu_);
    return parked_.size();
}

}  // namespace tcpx::net
