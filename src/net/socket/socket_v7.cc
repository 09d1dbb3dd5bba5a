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

// Every comm, registration and request this table has handed out and not yet taken back. The
// caller never sees the transport's pointers: each handle is a token of its own, never given
// out twice, looked up here before anything is dereferenced. A stale handle (a request tested
// again after it completed, a comm closed twice) is therefore an error for the caller even once
// the transport has reused the memory behind it for a new request or comm, and a foreign or
// garbage pointer is never read. A comm's registrations and requests leave with it (closing
// frees them in the transport).
class Live {
 public:
    enum class Kind { kListen, kSend, kRecv };

    void* add_comm(void* c, Kind k) {
        std::lock_guard<std::mutex> lock(mu_);
        void* t = next_token();
        comms_[t] = CommInfo{c, k};
        return t;
    }
    // The comm behind token `t` when it is a live comm of kind `k`, else null.
    void* comm(void* t, Kind k) const {
        std::lock_guard<std::mutex> lock(mu_);
        auto it = comms_.find(t);
        return it != comms_.end() && it->second.kind == k ? it->second.ptr : nullptr;
    }
    // A send or receive comm: registrations belong to either.
    void* data_comm(void* t) const {
        std::lock_guard<std::mutex> lock(mu_);
        auto it = comms_.find(t);
        return it != comms_.end() && it->second.kind != Kind::kListen ? it->second.ptr : nullptr;
    }
    // Takes the comm back (null when `t` is not a live comm of kind `k`), with its
    // registrations and requests.
    void* remove_comm(void* t, Kind k) {
        std::lock_guard<std::mutex> lock(mu_);
        auto it = comms_.find(t);
        if (it == comms_.end() || it->second.kind != k) return nullptr;
        void* c = it->second.ptr;
        comms_.erase(it);
        std::erase_if(mrs_, [t](const auto& e) { return e.second.comm == t; });
        std::erase_if(reqs_, [t](const auto& e) { return e.second.comm == t; });
        return c;
    }

    void* add_mr(void* mh, void* comm) {
        std::lock_guard<std::mutex> lock(mu_);
        void* t = next_token();
        mrs_[t] = MrInfo{mh, comm};
        return t;
    }
    // Takes registration `t` of comm `comm` back: its transport handle, or null.
    void* remove_mr(void* t, void* comm) {
        std::lock_guard<std::mutex> lock(mu_);
        auto it = mrs_.find(t);
        if (it == mrs_.end() || it->second.comm != comm) return nullptr;
        void* mh = it->second.ptr;
        mrs_.erase(it);
        return mh;
    }
    // What a posting checks and resolves, under one lock: "comm" when `comm` is not a live comm
    // of kind `k`, "registration" when one of the n handles is neither null (the transport needs
    // none) nor a live registration of `comm`; null when all is well, the transport's comm in
    // *comm_out and its registrations in mhs_out[0, n).
    const char* resolve_post(void* comm, Kind k, void* const* mhs, int n, void** comm_out,
                             void** mhs_out) const {
        std::lock_guard<std::mutex> lock(mu_);
        auto c = comms_.find(comm);
        if (c == comms_.end() || c->second.kind != k) return "comm";
        *comm_out = c->second.ptr;
        for (int i = 0; i < n; ++i) {
            mhs_out[i] = nullptr;
            if (mhs == nullptr || mhs[i] == nullptr) continue;
            auto it = mrs_.find(mhs[i]);
            if (it == mrs_.end() || it->second.comm != comm) return "registration";
            mhs_out[i] = it->second.ptr;
        }
        return nullptr;
    }

    void* add_req(void* r, void* comm, int n) {
        std::lock_guard<std::mutex> lock(mu_);
        void* t = next_token();
        reqs_[t] = ReqInfo{r, comm, n, false};
        return t;
    }
    // A live request as test() takes it: the transport's request and how many sizes it reports
    // (1 for a send; 0: not live, or being tested by another thread, which would have the
    // transport release it twice). end_test() gives it back.
    struct Claim {
        void* req = nullptr;
        int n = 0;
    };
    Claim claim_req(void* t) {
        std::lock_guard<std::mutex> lock(mu_);
        auto it = reqs_.find(t);
        if (it == reqs_.end() || it->second.testing) return Claim{};
        it->second.testing = true;
        return Claim{it->second.ptr, it->second.n};
    }
    // Ends a claim: the request is forgotten once the transport released it (finished or
    // failed), else it may be tested again.
    void end_test(void* t, bool released) {
        std::lock_guard<std::mutex> lock(mu_);
        auto it = reqs_.find(t);
        if (it == reqs_.end()) return;  // (its comm was closed meanwhile)
        if (released) {
            reqs_.erase(it);
        } else {
            it->second.testing = false;
        }
    }

 private:
    struct CommInfo {
        void* ptr;
        Kind kind;
    };
    struct MrInfo {
        void* ptr;
        void* comm;  // its comm's token
    };
    struct ReqInfo {
        void* ptr;
        void* comm;  // its comm's token
        int n;
        bool testing;
    };
    // Never null, never reused (2^64 of them).
    void* next_token() { return reinterpret_cast<void*>(static_cast<uintptr_t>(++last_token_)); }
    uint64_t last_token_ = 0x7c9a000000000000ull;  // (far from small integers and the heap)
    mutable std::mutex mu_;
    std::unordered_map<void*, CommInfo> comms_;
    std::unordered_map<void*, MrInfo> mrs_;
    std::unordered_map<void*, ReqInfo> reqs_;
};

Live& live() {
    static Live* l = new Live;  // never destroyed, as global()
    return *l;
}

// Records what the transport just made (`track`: its handle into *out) in the live set. When
// that fails (out of memory; the entry point's guard reports it), `undo` releases it again and
// the caller's handle is cleared: NCCL gets an error and no handle.
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
    ListenComm* l = nullptr;
    *listen_comm = nullptr;
    Status st = net()->listen(dev, h, &l);
    if (st.ok() && l != nullptr) {
        track_or_undo([&] { *listen_comm = live().add_comm(l, Live::Kind::kListen); },
                      [&] { (void)net()->close_listen(l); }, listen_comm);
    }
    return to_nccl_result(st, "listen");
}

tcpx_ncclResult_t v7_connect(int dev, void* handle, void** send_comm,
                             tcpx_ncclNetDeviceHandle_v7_t** /*send_dev_comm*/) {
    if (!net()) return not_initialized("connect");
    if (handle == nullptr || send_comm == nullptr) {
        return to_nccl_result(invalid_argument("null handle or comm"), "connect");
    }
    SendComm* c = nullptr;
    *send_comm = nullptr;
    Status st = net()->connect(dev, static_cast<Handle*>(handle), &c, nullptr);
    if (st.ok() && c != nullptr) {
        track_or_undo([&] { *send_comm = live().add_comm(c, Live::Kind::kSend); },
                      [&] { (void)net()->close_send(c); }, send_comm);
    }
    return to_nccl_result(st, "connect");
}

tcpx_ncclResult_t v7_accept(void* listen_comm, void** recv_comm,
                            tcpx_ncclNetDeviceHandle_v7_t** /*recv_dev_comm*/) {
    if (!net()) return not_initialized("accept");
    if (recv_comm == nullptr) return to_nccl_result(invalid_argument("null comm"), "accept");
    *recv_comm = nullptr;
    auto* l = static_cast<ListenComm*>(live().comm(listen_comm, Live::Kind::kListen));
    if (l == nullptr) return bad_handle("accept", "listen comm");
    RecvComm* c = nullptr;
    Status st = net()->accept(l, &c, nullptr);
    if (st.ok() && c != nullptr) {
        track_or_undo([&] { *recv_comm = live().add_comm(c, Live::Kind::kRecv); },
                      [&] { (void)net()->close_recv(c); }, recv_comm);
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
    if (mhandle == nullptr) return to_nccl_result(invalid_argument("null mhandle"), "regMr");
    *mhandle = nullptr;
    void* c = live().data_comm(comm);
    if (c == nullptr) return bad_handle("regMr", "send or recv comm");
    MemHandle* mh = nullptr;
    Status st = net()->reg_mr(c, data, size, static_cast<MemType>(type), &mh);
    if (st.ok()) {
        track_or_undo([&] { *mhandle = live().add_mr(mh, comm); },
                      [&] { (void)net()->dereg_mr(c, mh); }, mhandle);
    }
    return to_nccl_result(st, "regMr");
}

tcpx_ncclResult_t isend_sized(void* send_comm, void* data, size_t size, int tag, void* mhandle,
                              void** request) {
    if (!net()) return not_initialized("isend");
    if (Status st = check_size(size); !st.ok()) return to_nccl_result(st, "isend");
    if (request == nullptr) return to_nccl_result(invalid_argument("null request"), "isend");
    *request = nullptr;
    void* c = nullptr;
    void* mh = nullptr;
    if (const char* bad = live().resolve_post(send_comm, Live::Kind::kSend, &mhandle, 1, &c, &mh)) {
        return bad_handle("isend", std::strcmp(bad, "comm") == 0 ? "send comm" : bad);
    }
    Request* r = nullptr;
    Status st =
        net()->isend(static_cast<SendComm*>(c), data, size, tag, static_cast<MemHandle*>(mh), &r);
    if (st.ok() && r != nullptr) {
        // No undo for a posted send: it goes out. NCCL ends the comm on the error anyway.
        track_or_undo([&] { *request = live().add_req(r, send_comm, 1); }, [] {}, request);
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
    if (request == nullptr) return to_nccl_result(invalid_argument("null request"), "irecv");
    *request = nullptr;
    void* c = nullptr;
    void* mhs[kMaxRecvs];
    if (const char* bad = live().resolve_post(recv_comm, Live::Kind::kRecv, mhandles, n, &c, mhs)) {
        return bad_handle("irecv", std::strcmp(bad, "comm") == 0 ? "recv comm" : bad);
    }
    Request* r = nullptr;
    Status st = net()->irecv(static_cast<RecvComm*>(c), n, data, sizes, tags,
                             reinterpret_cast<MemHandle* const*>(mhs), &r);
    if (st.ok() && r != nullptr) {
        track_or_undo([&] { *request = live().add_req(r, recv_comm, n); }, [] {}, request);
    }
    return to_nccl_result(st, "irecv");
}

tcpx_ncclResult_t v7_reg_mr(void* comm, void* data, int size, int type, void** mhandle) {
    if (size < 0) return to_nccl_result(invalid_argument("negative size"), "regMr");
    return reg_mr_sized(comm, data, static_cast<size_t>(size), type, mhandle);
}

tcpx_ncclResult_t v7_dereg_mr(void* comm, void* mhandle) {
    if (!net()) return not_initialized("deregMr");
    void* c = live().data_comm(comm);
    if (c == nullptr) return bad_handle("deregMr", "send or recv comm");
    void* mh = live().remove_mr(mhandle, comm);
    if (mh == nullptr) return bad_handle("deregMr", "registration");
    return to_nccl_result(net()->dereg_mr_failing_pending(c, static_cast<MemHandle*>(mh)),
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
    const Live::Claim claim = live().claim_req(request);
    const int count = claim.n;
    if (count == 0) {
        *done = 0;
        return bad_handle("test", "request");
    }
    bool finished = false;
    size_t sz[kMaxRecvs] = {};
    Status st = net()->test(static_cast<Request*>(claim.req), &finished, sz);
    *done = finished ? 1 : 0;
    // Done (or failed): the transport has released it.
    live().end_test(request, finished || !st.ok());
    if (finished && sizes != nullptr) {
        // Sizes fit in int: every buffer was posted with an int size.
        for (int i = 0; i < count && i < kMaxRecvs; ++i) sizes[i] = static_cast<int>(sz[i]);
    }
    return to_nccl_result(st, "test");
}

tcpx_ncclResult_t v7_close_send(void* comm) {
    if (!net()) return not_initialized("closeSend");
    if (comm == nullptr) return tcpx_ncclSuccess;
    void* c = live().remove_comm(comm, Live::Kind::kSend);
    if (c == nullptr) return bad_handle("closeSend", "send comm");
    return to_nccl_result(net()->close_send(static_cast<SendComm*>(c)), "closeSend");
}

tcpx_ncclResult_t v7_close_recv(void* comm) {
    if (!net()) return not_initialized("closeRecv");
    if (comm == nullptr) return tcpx_ncclSuccess;
    void* c = live().remove_comm(comm, Live::Kind::kRecv);
    if (c == nullptr) return bad_handle("closeRecv", "recv comm");
    return to_nccl_result(net()->close_recv(static_cast<RecvComm*>(c)), "closeRecv");
}

tcpx_ncclResult_t v7_close_listen(void* comm) {
    if (!net()) return not_initialized("closeListen");
    if (comm == nullptr) return tcpx_ncclSuccess;
    void* c = live().remove_comm(comm, Live::Kind::kListen);
    if (c == nullptr) return bad_handle("closeListen", "listen comm");
    return to_nccl_result(net()->close_listen(static_cast<ListenComm*>(c)), "closeListen");
}

tcpx_ncclResult_t v7_get_device_mr(void*, void*, void** dptr_mhandle) {
    if (dptr_mhandle != nullptr) *dptr_mhandle = nullptr;
    return tcpx_ncclSuccess;
}

tcpx_ncclResult_t v7_irecv_consumed(void* recv_comm, int n, void* request) {
    if (!net()) return not_initialized("irecvConsumed");
    void* c = live().comm(recv_comm, Live::Kind::kRecv);
    if (c == nullptr) return bad_handle("irecvConsumed", "recv comm");
    // (The request is done and forgotten by now; the socket transport needs nothing of it.)
    return to_nccl_result(net()->irecv_consumed(static_cast<RecvComm*>(c), n, nullptr),
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
