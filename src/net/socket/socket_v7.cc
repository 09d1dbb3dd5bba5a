#include "net/socket/socket_v7.h"

#include <climits>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/params.h"
#include "common/status_util.h"
#include "common/strings.h"
#include "net/socket/socket_comm.h"
#include "net/socket/socket_net.h"
#include "net/v7_common.h"

namespace tcpx::net {
namespace {

constexpr int kMaxRecvs = socket_internal::kMaxRecvs;

struct Global {
    std::mutex mu;
    std::unique_ptr<SocketNet> net;
    // Property strings handed to the caller by pointer, per device; they live as long as the
    // process (NCCL keeps the pointers), made once however often getProperties is called.
    std::map<int, std::pair<std::string, std::string>> strings;
};

Global& global() {
    static Global* g = new Global;  // never destroyed: NCCL may call in during exit
    return *g;
}

SocketNet* net() { return global().net.get(); }

// Every comm, registration and request this table has handed out and not yet taken back. A
// handle the caller passes in is looked up here before anything dereferences it: a stale,
// foreign or garbage pointer (a request tested again after it completed, a handle of another
// plugin) is an error for the caller, never a read of memory that is not ours. A comm's
// registrations and requests leave with it (closing frees them in the transport).
class Live {
 public:
    enum class Kind { kListen, kSend, kRecv };

    void add_comm(void* c, Kind k) {
        std::lock_guard<std::mutex> lock(mu_);
        comms_[c] = k;
    }
    bool has_comm(void* c, Kind k) const {
        std::lock_guard<std::mutex> lock(mu_);
        auto it = comms_.find(c);
        return it != comms_.end() && it->second == k;
    }
    // A send or receive comm: registrations belong to either.
    bool has_data_comm(void* c) const {
        std::lock_guard<std::mutex> lock(mu_);
        auto it = comms_.find(c);
        return it != comms_.end() && it->second != Kind::kListen;
    }
    bool remove_comm(void* c, Kind k) {
        std::lock_guard<std::mutex> lock(mu_);
        auto it = comms_.find(c);
        if (it == comms_.end() || it->second != k) return false;
        comms_.erase(it);
        std::erase_if(mrs_, [c](const auto& e) { return e.second == c; });
        std::erase_if(reqs_, [c](const auto& e) { return e.second.comm == c; });
        return true;
    }

    void add_mr(void* mh, void* comm) {
        std::lock_guard<std::mutex> lock(mu_);
        mrs_[mh] = comm;
    }
    // What a posting checks, under one lock: "comm" when `comm` is not a live comm of kind `k`,
    // "registration" when one of the n handles is neither null (the transport needs none) nor a
    // live registration of `comm`; null when all is well.
    const char* post_problem(void* comm, Kind k, void* const* mhs, int n) const {
        std::lock_guard<std::mutex> lock(mu_);
        auto c = comms_.find(comm);
        if (c == comms_.end() || c->second != k) return "comm";
        for (int i = 0; mhs != nullptr && i < n; ++i) {
            if (mhs[i] == nullptr) continue;
            auto it = mrs_.find(mhs[i]);
            if (it == mrs_.end() || it->second != comm) return "registration";
        }
        return nullptr;
    }
    bool remove_mr(void* mh, void* comm) {
        std::lock_guard<std::mutex> lock(mu_);
        auto it = mrs_.find(mh);
        if (it == mrs_.end() || it->second != comm) return false;
        mrs_.erase(it);
        return true;
    }

    void add_req(void* r, void* comm, int n) {
        std::lock_guard<std::mutex> lock(mu_);
        reqs_[r] = ReqInfo{comm, n, ++next_gen_};
    }
    // A live request as test() sees it: how many sizes it reports (1 for a send; 0: not live)
    // and which posting it is.
    struct Lookup {
        int n = 0;
        uint64_t gen = 0;
    };
    Lookup find_req(void* r) const {
        std::lock_guard<std::mutex> lock(mu_);
        auto it = reqs_.find(r);
        return it == reqs_.end() ? Lookup{} : Lookup{it->second.n, it->second.gen};
    }
    // Forgets the request of posting `gen`. The transport recycles a request's memory the moment
    // test() reports it done, so another thread may already have posted a new request at the same
    // address: that one (a newer gen) stays.
    void remove_req(void* r, uint64_t gen) {
        std::lock_guard<std::mutex> lock(mu_);
        auto it = reqs_.find(r);
        if (it != reqs_.end() && it->second.gen == gen) reqs_.erase(it);
    }

 private:
    struct ReqInfo {
        void* comm;
        int n;
        uint64_t gen;
    };
    uint64_t next_gen_ = 0;
    mutable std::mutex mu_;
    std::unordered_map<void*, Kind> comms_;
    std::unordered_map<void*, void*> mrs_;  // registration -> its comm
    std::unordered_map<void*, ReqInfo> reqs_;
};

Live& live() {
    static Live* l = new Live;  // never destroyed, as global()
    return *l;
}

// Records what the transport just made (`track`) in the live set. When that fails (out of
// memory; the entry point's guard reports it), `undo` releases it again and the caller's pointer
// is cleared: NCCL gets an error and no handle.
template <typename Track, typename Undo>
void track_or_undo(Track track, Undo undo, void** out) {
    try {
        track();
    } catch (...) {
        undo();
        *out = nullptr;
        throw;
    }
}

tcpx_ncclResult_t bad_handle(const char* what, const char* kind) {
    return to_nccl_result(
        invalid_argument(strformat("%s: not a live %s of this plugin", what, kind)), what);
}

tcpx_ncclResult_t not_initialized(const char* what) {
    return to_nccl_result(failed_precondition("init() was not called"), what);
}

tcpx_ncclResult_t v7_init(tcpx_ncclDebugLogger_t logger) {
    Global& g = global();
    std::lock_guard<std::mutex> lock(g.mu);
    // Our own bridge comes back here when the table is wrapped in-process (V7Net): forwarding to
    // it would loop.
    if (logger != nullptr && logger != nccl_logger_into_tcpx_log()) forward_log_to_nccl(logger);
    if (g.net) return tcpx_ncclSuccess;
    auto settings = Settings::from_env();
    if (!settings.ok()) return to_nccl_result(settings.status(), "tcpx-p2p socket init");
    auto created = SocketNet::create(*settings);
    if (!created.ok()) return to_nccl_result(created.status(), "tcpx-p2p socket init");
    g.net = std::move(created).value();
    return tcpx_ncclSuccess;
}

tcpx_ncclResult_t v7_devices(int* ndev) {
    if (!net()) return not_initialized("devices");
    if (ndev == nullptr) return to_nccl_result(invalid_argument("null ndev"), "devices");
    *ndev = net()->device_count();
    return tcpx_ncclSuccess;
}

tcpx_ncclResult_t v7_get_properties(int dev, tcpx_ncclNetProperties_v7_t* out) {
    if (!net()) return not_initialized("getProperties");
    if (out == nullptr) return to_nccl_result(invalid_argument("null props"), "getProperties");
    Properties p;
    Status st = net()->get_properties(dev, &p);
    if (!st.ok()) return to_nccl_result(st, "getProperties");
    Global& g = global();
    std::lock_guard<std::mutex> lock(g.mu);
    // std::map never moves its nodes, so the c_str() pointers stay valid.
    const auto& names = g.strings.try_emplace(dev, p.name, p.pci_path).first->second;
    to_v7(p, names.first.c_str(), names.second.empty() ? nullptr : names.second.c_str(), out);
    return tcpx_ncclSuccess;
}

tcpx_ncclResult_t v7_listen(int dev, void* handle, void** listen_comm) {
    if (!net()) return not_initialized("listen");
    if (handle == nullptr || listen_comm == nullptr) {
        return to_nccl_result(invalid_argument("null handle or comm"), "listen");
    }
    // The caller's handle is TCPX_NCCL_NET_HANDLE_MAXSIZE bytes; Handle is exactly that.
    auto* h = static_cast<Handle*>(handle);
    Status st = net()->listen(dev, h, reinterpret_cast<ListenComm**>(listen_comm));
    if (st.ok() && *listen_comm != nullptr) {
        track_or_undo([&] { live().add_comm(*listen_comm, Live::Kind::kListen); },
                      [&] { (void)net()->close_listen(static_cast<ListenComm*>(*listen_comm)); },
                      listen_comm);
    }
    return to_nccl_result(st, "listen");
}

tcpx_ncclResult_t v7_connect(int dev, void* handle, void** send_comm,
                             tcpx_ncclNetDeviceHandle_v7_t** /*send_dev_comm*/) {
    if (!net()) return not_initialized("connect");
    if (handle == nullptr || send_comm == nullptr) {
        return to_nccl_result(invalid_argument("null handle or comm"), "connect");
    }
    Status st = net()->connect(dev, static_cast<Handle*>(handle),
                               reinterpret_cast<SendComm**>(send_comm), nullptr);
    if (st.ok() && *send_comm != nullptr) {
        track_or_undo([&] { live().add_comm(*send_comm, Live::Kind::kSend); },
                      [&] { (void)net()->close_send(static_cast<SendComm*>(*send_comm)); },
                      send_comm);
    }
    return to_nccl_result(st, "connect");
}

tcpx_ncclResult_t v7_accept(void* listen_comm, void** recv_comm,
                            tcpx_ncclNetDeviceHandle_v7_t** /*recv_dev_comm*/) {
    if (!net()) return not_initialized("accept");
    if (recv_comm == nullptr) return to_nccl_result(invalid_argument("null comm"), "accept");
    if (!live().has_comm(listen_comm, Live::Kind::kListen)) {
        *recv_comm = nullptr;
        return bad_handle("accept", "listen comm");
    }
    Status st = net()->accept(static_cast<ListenComm*>(listen_comm),
                              reinterpret_cast<RecvComm**>(recv_comm), nullptr);
    if (st.ok() && *recv_comm != nullptr) {
        track_or_undo([&] { live().add_comm(*recv_comm, Live::Kind::kRecv); },
                      [&] { (void)net()->close_recv(static_cast<RecvComm*>(*recv_comm)); },
                      recv_comm);
    }
    return to_nccl_result(st, "accept");
}

// Every version's sizes come through here: v7's ints (checked for sign first) and the size_t
// ones of newer tables, which are refused past INT_MAX (test() reports sizes as ints).
Status check_size(size_t size) {
    if (size > static_cast<size_t>(INT_MAX)) {
        return invalid_argument(strformat("a size of %zu bytes exceeds INT_MAX", size));
    }
    return Status();
}

tcpx_ncclResult_t reg_mr_sized(void* comm, void* data, size_t size, int type, void** mhandle) {
    if (!net()) return not_initialized("regMr");
    if (Status st = check_size(size); !st.ok()) return to_nccl_result(st, "regMr");
    if (mhandle != nullptr) *mhandle = nullptr;
    if (!live().has_data_comm(comm)) return bad_handle("regMr", "send or recv comm");
    Status st = net()->reg_mr(comm, data, size, static_cast<MemType>(type),
                              reinterpret_cast<MemHandle**>(mhandle));
    if (st.ok()) {
        track_or_undo([&] { live().add_mr(*mhandle, comm); },
                      [&] { (void)net()->dereg_mr(comm, static_cast<MemHandle*>(*mhandle)); },
                      mhandle);
    }
    return to_nccl_result(st, "regMr");
}

tcpx_ncclResult_t isend_sized(void* send_comm, void* data, size_t size, int tag, void* mhandle,
                              void** request) {
    if (!net()) return not_initialized("isend");
    if (Status st = check_size(size); !st.ok()) return to_nccl_result(st, "isend");
    if (request != nullptr) *request = nullptr;
    if (const char* bad = live().post_problem(send_comm, Live::Kind::kSend, &mhandle, 1)) {
        return bad_handle("isend", std::strcmp(bad, "comm") == 0 ? "send comm" : bad);
    }
    Status st =
        net()->isend(static_cast<SendComm*>(send_comm), data, size, tag,
                     static_cast<MemHandle*>(mhandle), reinterpret_cast<Request**>(request));
    if (st.ok() && *request != nullptr) {
        // No undo for a posted send: it goes out. NCCL ends the comm on the error anyway.
        track_or_undo([&] { live().add_req(*request, send_comm, 1); }, [] {}, request);
    }
    return to_nccl_result(st, "isend");
}

tcpx_ncclResult_t irecv_sized(void* recv_comm, int n, void** data, size_t* sizes, int* tags,
                              void** mhandles, void** request) {
    if (!net()) return not_initialized("irecv");
    if (n < 1 || n > kMaxRecvs || sizes == nullptr) {
        return to_nccl_result(invalid_argument("n outside [1, 8] or null sizes"), "irecv");
    }
    for (int i = 0; i < n; ++i) {
        if (Status st = check_size(sizes[i]); !st.ok()) return to_nccl_result(st, "irecv");
    }
    if (request != nullptr) *request = nullptr;
    if (const char* bad = live().post_problem(recv_comm, Live::Kind::kRecv, mhandles, n)) {
        return bad_handle("irecv", std::strcmp(bad, "comm") == 0 ? "recv comm" : bad);
    }
    Status st = net()->irecv(static_cast<RecvComm*>(recv_comm), n, data, sizes, tags,
                             reinterpret_cast<MemHandle* const*>(mhandles),
                             reinterpret_cast<Request**>(request));
    if (st.ok() && *request != nullptr) {
        track_or_undo([&] { live().add_req(*request, recv_comm, n); }, [] {}, request);
    }
    return to_nccl_result(st, "irecv");
}

tcpx_ncclResult_t v7_reg_mr(void* comm, void* data, int size, int type, void** mhandle) {
    if (size < 0) return to_nccl_result(invalid_argument("negative size"), "regMr");
    return reg_mr_sized(comm, data, static_cast<size_t>(size), type, mhandle);
}

tcpx_ncclResult_t v7_dereg_mr(void* comm, void* mhandle) {
    if (!net()) return not_initialized("deregMr");
    if (!live().remove_mr(mhandle, comm)) return bad_handle("deregMr", "registration");
    return to_nccl_result(net()->dereg_mr_failing_pending(comm, static_cast<MemHandle*>(mhandle)),
                          "deregMr");
}

tcpx_ncclResult_t v7_isend(void* send_comm, void* data, int size, int tag, void* mhandle,
                           void** request) {
    if (size < 0) return to_nccl_result(invalid_argument("negative size"), "isend");
    return isend_sized(send_comm, data, static_cast<size_t>(size), tag, mhandle, request);
}

tcpx_ncclResult_t v7_irecv(void* recv_comm, int n, void** data, int* sizes, int* tags,
                           void** mhandles, void** request) {
    if (n < 1 || n > kMaxRecvs || sizes == nullptr) {
        return to_nccl_result(invalid_argument("n outside [1, 8] or null sizes"), "irecv");
    }
    size_t sz[kMaxRecvs];
    for (int i = 0; i < n; ++i) {
        if (sizes[i] < 0) return to_nccl_result(invalid_argument("negative size"), "irecv");
        sz[i] = static_cast<size_t>(sizes[i]);
    }
    return irecv_sized(recv_comm, n, data, sz, tags, mhandles, request);
}

tcpx_ncclResult_t v7_iflush(void*, int, void**, int*, void**, void** request) {
    // Host memory only: NCCL never flushes for a net without CUDA pointer support.
    if (request != nullptr) *request = nullptr;
    return to_nccl_result(unimplemented("the socket transport has nothing to flush"), "iflush");
}

tcpx_ncclResult_t v7_test(void* request, int* done, int* sizes) {
    if (!net()) return not_initialized("test");
    if (done == nullptr) return to_nccl_result(invalid_argument("null done"), "test");
    if (request == nullptr) return to_nccl_result(invalid_argument("null request"), "test");
    // A send reports one size, a receive of n buffers n of them (the caller's sizes array has
    // exactly that many entries): known from when it was posted, so nothing of the request is
    // read before it is known to be live.
    const Live::Lookup found = live().find_req(request);
    const int count = found.n;
    if (count == 0) {
        *done = 0;
        return bad_handle("test", "request");
    }
    bool finished = false;
    size_t sz[kMaxRecvs] = {};
    Status st = net()->test(static_cast<Request*>(request), &finished, sz);
    *done = finished ? 1 : 0;
    // Done (or failed): the transport has released it.
    if (finished || !st.ok()) live().remove_req(request, found.gen);
    if (finished && sizes != nullptr) {
        // Sizes fit in int: every buffer was posted with an int size.
        for (int i = 0; i < count && i < kMaxRecvs; ++i) sizes[i] = static_cast<int>(sz[i]);
    }
    return to_nccl_result(st, "test");
}

tcpx_ncclResult_t v7_close_send(void* comm) {
    if (!net()) return not_initialized("closeSend");
    if (comm == nullptr) return tcpx_ncclSuccess;
    if (!live().remove_comm(comm, Live::Kind::kSend)) return bad_handle("closeSend", "send comm");
    return to_nccl_result(net()->close_send(static_cast<SendComm*>(comm)), "closeSend");
}

tcpx_ncclResult_t v7_close_recv(void* comm) {
    if (!net()) return not_initialized("closeRecv");
    if (comm == nullptr) return tcpx_ncclSuccess;
    if (!live().remove_comm(comm, Live::Kind::kRecv)) return bad_handle("closeRecv", "recv comm");
    return to_nccl_result(net()->close_recv(static_cast<RecvComm*>(comm)), "closeRecv");
}

tcpx_ncclResult_t v7_close_listen(void* comm) {
    if (!net()) return not_initialized("closeListen");
    if (comm == nullptr) return tcpx_ncclSuccess;
    if (!live().remove_comm(comm, Live::Kind::kListen)) {
        return bad_handle("closeListen", "listen comm");
    }
    return to_nccl_result(net()->close_listen(static_cast<ListenComm*>(comm)), "closeListen");
}

tcpx_ncclResult_t v7_get_device_mr(void*, void*, void** dptr_mhandle) {
    if (dptr_mhandle != nullptr) *dptr_mhandle = nullptr;
    return tcpx_ncclSuccess;
}

tcpx_ncclResult_t v7_irecv_consumed(void* recv_comm, int n, void* request) {
    if (!net()) return not_initialized("irecvConsumed");
    if (!live().has_comm(recv_comm, Live::Kind::kRecv))
        return bad_handle("irecvConsumed", "recv comm");
    return to_nccl_result(
        net()->irecv_consumed(static_cast<RecvComm*>(recv_comm), n, static_cast<Request*>(request)),
        "irecvConsumed");
}

// Every entry point guarded: no exception (out of memory) reaches NCCL.
const tcpx_ncclNet_v7_t kTable = {
    kSocketTableName,
    guarded<v7_init>,
    guarded<v7_devices>,
    guarded<v7_get_properties>,
    guarded<v7_listen>,
    guarded<v7_connect>,
    guarded<v7_accept>,
    guarded<v7_reg_mr>,
    nullptr,  // regMrDmaBuf: host memory only
    guarded<v7_dereg_mr>,
    guarded<v7_isend>,
    guarded<v7_irecv>,
    guarded<v7_iflush>,
    guarded<v7_test>,
    guarded<v7_close_send>,
    guarded<v7_close_recv>,
    guarded<v7_close_listen>,
    guarded<v7_get_device_mr>,
    guarded<v7_irecv_consumed>,
};
}  // namespace

const tcpx_ncclNet_v7_t* socket_net_v7() { return &kTable; }

tcpx_ncclResult_t socket_v7_reg_mr_sized(void* comm, void* data, size_t size, int type,
                                         void** mhandle) {
    return guarded<reg_mr_sized>(comm, data, size, type, mhandle);
}

tcpx_ncclResult_t socket_v7_isend_sized(void* send_comm, void* data, size_t size, int tag,
                                        void* mhandle, void** request) {
    return guarded<isend_sized>(send_comm, data, size, tag, mhandle, request);
}

tcpx_ncclResult_t socket_v7_irecv_sized(void* recv_comm, int n, void** data, size_t* sizes,
                                        int* tags, void** mhandles, void** request) {
    return guarded<irecv_sized>(recv_comm, n, data, sizes, tags, mhandles, request);
}

}  // namespace tcpx::net
