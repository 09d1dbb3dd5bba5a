#include "net/socket/socket_v7.h"

#include <climits>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
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
    return to_nccl_result(net()->listen(dev, h, reinterpret_cast<ListenComm**>(listen_comm)),
                          "listen");
}

tcpx_ncclResult_t v7_connect(int dev, void* handle, void** send_comm,
                             tcpx_ncclNetDeviceHandle_v7_t** /*send_dev_comm*/) {
    if (!net()) return not_initialized("connect");
    if (handle == nullptr || send_comm == nullptr) {
        return to_nccl_result(invalid_argument("null handle or comm"), "connect");
    }
    return to_nccl_result(net()->connect(dev, static_cast<Handle*>(handle),
                                         reinterpret_cast<SendComm**>(send_comm), nullptr),
                          "connect");
}

tcpx_ncclResult_t v7_accept(void* listen_comm, void** recv_comm,
                            tcpx_ncclNetDeviceHandle_v7_t** /*recv_dev_comm*/) {
    if (!net()) return not_initialized("accept");
    if (recv_comm == nullptr) return to_nccl_result(invalid_argument("null comm"), "accept");
    return to_nccl_result(net()->accept(static_cast<ListenComm*>(listen_comm),
                                        reinterpret_cast<RecvComm**>(recv_comm), nullptr),
                          "accept");
}

// Every version's sizes come through here: v7's ints (checked for sign first) and the size_t
// ones of newer tables, which are refused past INT_MAX (test() reports sizes as ints).
Status check_size(size_t size) {
    if (size > static_cast<size_t>(INT_MAX)) {
        return invalid_argument(strformat("a size of %zu bytes exceeds INT_MAX", size));
    }
    return Status();
}

tcpx_ncclResult_t v7_reg_mr(void* comm, void* data, int size, int type, void** mhandle) {
    if (size < 0) return to_nccl_result(invalid_argument("negative size"), "regMr");
    return socket_v7_reg_mr_sized(comm, data, static_cast<size_t>(size), type, mhandle);
}

tcpx_ncclResult_t v7_dereg_mr(void* comm, void* mhandle) {
    if (!net()) return not_initialized("deregMr");
    return to_nccl_result(net()->dereg_mr(comm, static_cast<MemHandle*>(mhandle)), "deregMr");
}

tcpx_ncclResult_t v7_isend(void* send_comm, void* data, int size, int tag, void* mhandle,
                           void** request) {
    if (size < 0) return to_nccl_result(invalid_argument("negative size"), "isend");
    return socket_v7_isend_sized(send_comm, data, static_cast<size_t>(size), tag, mhandle, request);
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
    return socket_v7_irecv_sized(recv_comm, n, data, sz, tags, mhandles, request);
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
    // A send reports one size, a receive of n buffers n of them: read n before test() releases
    // the request. The caller's sizes array has exactly that many entries.
    int count = 1;
    const auto* base = static_cast<const socket_internal::ReqBase*>(request);
    if (base->kind == socket_internal::ReqBase::kRecv) {
        count = static_cast<const socket_internal::RecvReq*>(base)->n;
    }
    bool finished = false;
    size_t sz[kMaxRecvs] = {};
    Status st = net()->test(static_cast<Request*>(request), &finished, sz);
    *done = finished ? 1 : 0;
    if (finished && sizes != nullptr) {
        // Sizes fit in int: every buffer was posted with an int size.
        for (int i = 0; i < count && i < kMaxRecvs; ++i) sizes[i] = static_cast<int>(sz[i]);
    }
    return to_nccl_result(st, "test");
}

tcpx_ncclResult_t v7_close_send(void* comm) {
    if (!net()) return not_initialized("closeSend");
    return to_nccl_result(net()->close_send(static_cast<SendComm*>(comm)), "closeSend");
}

tcpx_ncclResult_t v7_close_recv(void* comm) {
    if (!net()) return not_initialized("closeRecv");
    return to_nccl_result(net()->close_recv(static_cast<RecvComm*>(comm)), "closeRecv");
}

tcpx_ncclResult_t v7_close_listen(void* comm) {
    if (!net()) return not_initialized("closeListen");
    return to_nccl_result(net()->close_listen(static_cast<ListenComm*>(comm)), "closeListen");
}

tcpx_ncclResult_t v7_get_device_mr(void*, void*, void** dptr_mhandle) {
    if (dptr_mhandle != nullptr) *dptr_mhandle = nullptr;
    return tcpx_ncclSuccess;
}

tcpx_ncclResult_t v7_irecv_consumed(void* recv_comm, int n, void* request) {
    if (!net()) return not_initialized("irecvConsumed");
    return to_nccl_result(
        net()->irecv_consumed(static_cast<RecvComm*>(recv_comm), n, static_cast<Request*>(request)),
        "irecvConsumed");
}

const tcpx_ncclNet_v7_t kTable = {
    kSocketTableName, v7_init,       v7_devices,      v7_get_properties, v7_listen,
    v7_connect,       v7_accept,     v7_reg_mr,
    nullptr,  // regMrDmaBuf: host memory only
    v7_dereg_mr,      v7_isend,      v7_irecv,        v7_iflush,         v7_test,
    v7_close_send,    v7_close_recv, v7_close_listen, v7_get_device_mr,  v7_irecv_consumed,
};

}  // namespace

const tcpx_ncclNet_v7_t* socket_net_v7() { return &kTable; }

tcpx_ncclResult_t socket_v7_reg_mr_sized(void* comm, void* data, size_t size, int type,
                                         void** mhandle) {
    if (!net()) return not_initialized("regMr");
    if (Status st = check_size(size); !st.ok()) return to_nccl_result(st, "regMr");
    return to_nccl_result(net()->reg_mr(comm, data, size, static_cast<MemType>(type),
                                        reinterpret_cast<MemHandle**>(mhandle)),
                          "regMr");
}

tcpx_ncclResult_t socket_v7_isend_sized(void* send_comm, void* data, size_t size, int tag,
                                        void* mhandle, void** request) {
    if (!net()) return not_initialized("isend");
    if (Status st = check_size(size); !st.ok()) return to_nccl_result(st, "isend");
    return to_nccl_result(
        net()->isend(static_cast<SendComm*>(send_comm), data, size, tag,
                     static_cast<MemHandle*>(mhandle), reinterpret_cast<Request**>(request)),
        "isend");
}

tcpx_ncclResult_t socket_v7_irecv_sized(void* recv_comm, int n, void** data, size_t* sizes,
                                        int* tags, void** mhandles, void** request) {
    if (!net()) return not_initialized("irecv");
    if (n < 1 || n > kMaxRecvs || sizes == nullptr) {
        return to_nccl_result(invalid_argument("n outside [1, 8] or null sizes"), "irecv");
    }
    for (int i = 0; i < n; ++i) {
        if (Status st = check_size(sizes[i]); !st.ok()) return to_nccl_result(st, "irecv");
    }
    return to_nccl_result(net()->irecv(static_cast<RecvComm*>(recv_comm), n, data, sizes, tags,
                                       reinterpret_cast<MemHandle* const*>(mhandles),
                                       reinterpret_cast<Request**>(request)),
                          "irecv");
}

}  // namespace tcpx::net
