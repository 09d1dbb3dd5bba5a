// An emulation of Google's GPUDirect-TCPX ncclNet plugin (libnccl-net-tcpx.so), built as
// libnccl-net-faketcpx.so and loaded exactly as a user would load the real one
// (TCPX_P2P_NET_PLUGIN). It moves data with tcpx-p2p's own socket transport and reproduces what a
// caller outside NCCL must get right with the real plugin (shared/reference/tcpx-plugin.md),
// refusing — with an error, where the real plugin would crash or hang — what it does not allow:
//
//   - a v7 table named GPUDirectTCPX*, device type UNPACK version 7, maxRecvs 1;
//   - init fails unless NCCL_DYNAMIC_CHUNK_SIZE is set (the real plugin then never completes a
//     receive);
//   - at most 16 requests per comm; a receive holds its unpack slot until irecvConsumed(), which
//     must come for every completed receive, oldest first (16 slots per comm);
//   - test() only on the comm's oldest request, and it never writes sizes;
//   - irecv with n != 1 is an error; isend/irecv need a memory handle from regMr;
//   - regMr of CUDA memory needs a 4 KiB-aligned pointer;
//   - connect() completes on a later call than the first, with the same handle buffer;
//   - accept() needs a device-handle pointer to fill in;
//   - iflush() must not be called.
//
// Host memory only so far; CUDA receives into scattered bounce-buffer pages come with the CUDA
// layer.
#include <algorithm>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <string>

#include "common/params.h"
#include "net/ncclnet_v7.h"
#include "net/socket/socket_net.h"

namespace {

using tcpx::Status;
namespace net = tcpx::net;

constexpr int kMaxRequests = 16;
constexpr uint32_t kCommMagic = 0x46545843;  // "FTXC"
constexpr uint32_t kReqMagic = 0x46545852;   // "FTXR"
constexpr uint32_t kMrMagic = 0x4654584d;    // "FTXM"
// connect()'s progress lives in the caller's handle, after the socket transport's 48 bytes.
constexpr size_t kConnectMarkOffset = 120;
constexpr uint64_t kConnectMark = 0x464158434f4e4e31ULL;  // "FAXCONN1"

tcpx_ncclDebugLogger_t g_log = nullptr;
std::mutex g_mu;
std::unique_ptr<net::SocketNet> g_net;

#define FAKE_WARN(...) log_line(TCPX_NCCL_LOG_WARN, __VA_ARGS__)
void log_line(int level, const char* fmt, ...) __attribute__((format(printf, 2, 3)));
void log_line(int level, const char* fmt, ...) {
    char buf[512];
    va_list args;
    va_start(args, fmt);
    std::vsnprintf(buf, sizeof(buf), fmt, args);
    va_end(args);
    if (g_log != nullptr) g_log(level, TCPX_NCCL_NET_FLAG, __FILE__, __LINE__, "FakeTCPX: %s", buf);
}

tcpx_ncclResult_t fail(const Status& st, const char* what) {
    FAKE_WARN("%s: %s", what, st.to_string().c_str());
    return tcpx_ncclInternalError;  // the real plugin reports nearly everything this way
}

struct FakeMr {
    uint32_t magic = kMrMagic;
    int type = 0;
};

struct FakeComm;

struct FakeReq {
    uint32_t magic = kReqMagic;
    FakeComm* comm = nullptr;
    net::Request* inner = nullptr;
    bool recv = false;
    bool done = false;  // test() reported it
};

struct FakeComm {
    uint32_t magic = kCommMagic;
    bool recv = false;
    net::SendComm* send_comm = nullptr;
    net::RecvComm* recv_comm = nullptr;
    // Requests in posting order: not yet reported by test(), then (receives) reported but not
    // yet consumed. At most kMaxRequests.
    std::deque<FakeReq*> queue;
    std::mutex mu;
};

bool valid_mr(void* mh) { return mh != nullptr && static_cast<FakeMr*>(mh)->magic == kMrMagic; }

FakeComm* as_comm(void* c) {
    auto* comm = static_cast<FakeComm*>(c);
    return comm != nullptr && comm->magic == kCommMagic ? comm : nullptr;
}

// --- the table ---------------------------------------------------------------------------------

tcpx_ncclResult_t fake_init(tcpx_ncclDebugLogger_t logger) {
    std::lock_guard<std::mutex> lock(g_mu);
    g_log = logger;
    const char* chunk = std::getenv("NCCL_DYNAMIC_CHUNK_SIZE");
    if (chunk == nullptr || std::atol(chunk) <= 0) {
        FAKE_WARN("NCCL_DYNAMIC_CHUNK_SIZE is unset or 0: receives would never complete");
        return tcpx_ncclInvalidUsage;
    }
    if (g_net) return tcpx_ncclSuccess;
    auto settings = tcpx::Settings::from_env();
    if (!settings.ok()) return fail(settings.status(), "init");
    auto created = net::SocketNet::create(*settings);
    if (!created.ok()) return fail(created.status(), "init");
    g_net = std::move(created).value();
    return tcpx_ncclSuccess;
}

tcpx_ncclResult_t fake_devices(int* ndev) {
    *ndev = g_net ? g_net->device_count() : 0;
    return tcpx_ncclSuccess;
}

tcpx_ncclResult_t fake_get_properties(int dev, tcpx_ncclNetProperties_v7_t* props) {
    net::Properties p;
    Status st = g_net->get_properties(dev, &p);
    if (!st.ok()) return fail(st, "getProperties");
    static std::string name;  // the real plugin hands out pointers into its own tables too
    static std::mutex mu;
    std::lock_guard<std::mutex> lock(mu);
    name = p.name;
    *props = tcpx_ncclNetProperties_v7_t{};
    props->name = name.data();
    props->pciPath = nullptr;
    props->guid = static_cast<uint64_t>(dev);
    props->ptrSupport = TCPX_NCCL_PTR_HOST | TCPX_NCCL_PTR_CUDA;
    props->speed = p.speed_mbps;
    props->maxComms = 65536;
    props->maxRecvs = 1;
    props->netDeviceType = TCPX_NCCL_NET_DEVICE_UNPACK;
    props->netDeviceVersion = 7;
    return tcpx_ncclSuccess;
}

tcpx_ncclResult_t fake_listen(int dev, void* handle, void** listen_comm) {
    return g_net->listen(dev, static_cast<net::Handle*>(handle),
                         reinterpret_cast<net::ListenComm**>(listen_comm))
                   .ok()
               ? tcpx_ncclSuccess
               : tcpx_ncclInternalError;
}

tcpx_ncclResult_t fake_connect(int dev, void* handle, void** send_comm,
                               tcpx_ncclNetDeviceHandle_v7_t** /*send_dev_comm*/) {
    *send_comm = nullptr;
    // Like the real plugin (whose connect runs in a thread), the first call only starts: it
    // marks the caller's handle, and a later call with the same handle completes.
    auto* bytes = static_cast<uint8_t*>(handle);
    uint64_t mark = 0;
    std::memcpy(&mark, bytes + kConnectMarkOffset, sizeof(mark));
    if (mark != kConnectMark) {
        std::memcpy(bytes + kConnectMarkOffset, &kConnectMark, sizeof(kConnectMark));
        return tcpx_ncclSuccess;
    }
    net::SendComm* inner = nullptr;
    Status st = g_net->connect(dev, static_cast<net::Handle*>(handle), &inner, nullptr);
    if (!st.ok()) return fail(st, "connect");
    if (inner == nullptr) return tcpx_ncclSuccess;
    auto* comm = new FakeComm;
    comm->send_comm = inner;
    *send_comm = comm;
    return tcpx_ncclSuccess;
}

tcpx_ncclResult_t fake_accept(void* listen_comm, void** recv_comm,
                              tcpx_ncclNetDeviceHandle_v7_t** recv_dev_comm) {
    *recv_comm = nullptr;
    if (recv_dev_comm == nullptr || *recv_dev_comm == nullptr) {
        FAKE_WARN(
            "accept without a device-handle pointer (the real plugin crashes on the first "
            "receive)");
        return tcpx_ncclInternalError;
    }
    net::RecvComm* inner = nullptr;
    Status st = g_net->accept(static_cast<net::ListenComm*>(listen_comm), &inner, nullptr);
    if (!st.ok()) return fail(st, "accept");
    if (inner == nullptr) return tcpx_ncclSuccess;
    auto* comm = new FakeComm;
    comm->recv = true;
    comm->recv_comm = inner;
    **recv_dev_comm = tcpx_ncclNetDeviceHandle_v7_t{TCPX_NCCL_NET_DEVICE_UNPACK, 7, nullptr, 24, 0};
    *recv_comm = comm;
    return tcpx_ncclSuccess;
}

tcpx_ncclResult_t fake_reg_mr(void* comm, void* data, int size, int type, void** mhandle) {
    if (as_comm(comm) == nullptr) return tcpx_ncclInternalError;
    if (type == TCPX_NCCL_PTR_CUDA && reinterpret_cast<uintptr_t>(data) % 4096 != 0) {
        FAKE_WARN("regMr: CUDA pointer %p is not 4 KiB-aligned", data);
        return tcpx_ncclInternalError;
    }
    if (type != TCPX_NCCL_PTR_HOST && type != TCPX_NCCL_PTR_CUDA) return tcpx_ncclInternalError;
    auto* mr = new FakeMr;
    mr->type = type;
    *mhandle = mr;
    return tcpx_ncclSuccess;
}

tcpx_ncclResult_t fake_dereg_mr(void* comm, void* mhandle) {
    if (!valid_mr(mhandle)) return tcpx_ncclInternalError;
    static_cast<FakeMr*>(mhandle)->magic = 0;
    delete static_cast<FakeMr*>(mhandle);
    return tcpx_ncclSuccess;
}

tcpx_ncclResult_t fake_isend(void* send_comm, void* data, int size, int tag, void* mhandle,
                             void** request) {
    *request = nullptr;
    FakeComm* comm = as_comm(send_comm);
    if (comm == nullptr || comm->recv) return tcpx_ncclInternalError;
    if (!valid_mr(mhandle)) {
        FAKE_WARN("isend without a memory handle (the real plugin dereferences it)");
        return tcpx_ncclInternalError;
    }
    if (static_cast<FakeMr*>(mhandle)->type != TCPX_NCCL_PTR_HOST) {
        FAKE_WARN("isend: CUDA memory is not emulated yet");
        return tcpx_ncclInternalError;
    }
    std::lock_guard<std::mutex> lock(comm->mu);
    if (comm->queue.size() >= kMaxRequests) return tcpx_ncclSuccess;  // full: try later
    net::Request* inner = nullptr;
    Status st =
        g_net->isend(comm->send_comm, data, static_cast<size_t>(size), tag, nullptr, &inner);
    if (!st.ok()) return fail(st, "isend");
    if (inner == nullptr) return tcpx_ncclSuccess;
    auto* r = new FakeReq;
    r->comm = comm;
    r->inner = inner;
    comm->queue.push_back(r);
    *request = r;
    return tcpx_ncclSuccess;
}

tcpx_ncclResult_t fake_irecv(void* recv_comm, int n, void** data, int* sizes, int* tags,
                             void** mhandles, void** request) {
    *request = nullptr;
    FakeComm* comm = as_comm(recv_comm);
    if (comm == nullptr || !comm->recv) return tcpx_ncclInternalError;
    if (n != 1) {
        FAKE_WARN("irecv with n = %d: only 1 is supported", n);
        return tcpx_ncclInternalError;
    }
    if (mhandles == nullptr || !valid_mr(mhandles[0])) {
        FAKE_WARN("irecv without a memory handle (the real plugin dereferences it)");
        return tcpx_ncclInternalError;
    }
    if (static_cast<FakeMr*>(mhandles[0])->type != TCPX_NCCL_PTR_HOST) {
        FAKE_WARN("irecv: CUDA memory is not emulated yet");
        return tcpx_ncclInternalError;
    }
    std::lock_guard<std::mutex> lock(comm->mu);
    // Every receive holds an unpack slot until irecvConsumed(): 16 per comm.
    if (comm->queue.size() >= kMaxRequests) return tcpx_ncclSuccess;
    net::Request* inner = nullptr;
    size_t size = static_cast<size_t>(sizes[0]);
    Status st = g_net->irecv(comm->recv_comm, 1, data, &size, tags, nullptr, &inner);
    if (!st.ok()) return fail(st, "irecv");
    if (inner == nullptr) return tcpx_ncclSuccess;
    auto* r = new FakeReq;
    r->comm = comm;
    r->inner = inner;
    r->recv = true;
    comm->queue.push_back(r);
    *request = r;
    return tcpx_ncclSuccess;
}

tcpx_ncclResult_t fake_iflush(void*, int, void**, int*, void**, void** request) {
    FAKE_WARN("iflush called: the real plugin's iflush reads its request argument as input");
    if (request != nullptr) *request = nullptr;
    return tcpx_ncclInternalError;
}

tcpx_ncclResult_t fake_test(void* request, int* done, int* /*sizes: never written*/) {
    *done = 0;
    auto* r = static_cast<FakeReq*>(request);
    if (r == nullptr || r->magic != kReqMagic) return tcpx_ncclInternalError;
    FakeComm* comm = r->comm;
    std::lock_guard<std::mutex> lock(comm->mu);
    // Only the oldest request not yet reported may be tested.
    FakeReq* oldest = nullptr;
    for (FakeReq* q : comm->queue) {
        if (!q->done) {
            oldest = q;
            break;
        }
    }
    if (r != oldest) {
        FAKE_WARN("test called with a request %p that is not the oldest of its comm (%p)", r,
                  oldest);
        return tcpx_ncclInternalError;
    }
    bool finished = false;
    Status st = g_net->test(r->inner, &finished, nullptr);
    if (!st.ok()) return fail(st, "test");
    if (!finished) return tcpx_ncclSuccess;
    *done = 1;
    r->done = true;
    if (!r->recv) {  // a send is gone once reported; a receive waits for irecvConsumed()
        comm->queue.erase(std::find(comm->queue.begin(), comm->queue.end(), r));
        r->magic = 0;
        delete r;
    }
    return tcpx_ncclSuccess;
}

tcpx_ncclResult_t fake_irecv_consumed(void* recv_comm, int n, void* request) {
    FakeComm* comm = as_comm(recv_comm);
    auto* r = static_cast<FakeReq*>(request);
    if (comm == nullptr || n != 1 || r == nullptr || r->magic != kReqMagic) {
        return tcpx_ncclInternalError;
    }
    std::lock_guard<std::mutex> lock(comm->mu);
    if (comm->queue.empty() || comm->queue.front() != r || !r->done) {
        FAKE_WARN("irecvConsumed out of order or before test reported the receive");
        return tcpx_ncclInternalError;
    }
    comm->queue.pop_front();
    r->magic = 0;
    delete r;
    return tcpx_ncclSuccess;
}

tcpx_ncclResult_t close_comm(void* c) {
    FakeComm* comm = as_comm(c);
    if (comm == nullptr) return tcpx_ncclInternalError;
    Status st =
        comm->recv ? g_net->close_recv(comm->recv_comm) : g_net->close_send(comm->send_comm);
    for (FakeReq* r : comm->queue) delete r;
    comm->magic = 0;
    delete comm;
    return st.ok() ? tcpx_ncclSuccess : tcpx_ncclInternalError;
}

tcpx_ncclResult_t fake_close_listen(void* listen_comm) {
    return g_net->close_listen(static_cast<net::ListenComm*>(listen_comm)).ok()
               ? tcpx_ncclSuccess
               : tcpx_ncclInternalError;
}

tcpx_ncclResult_t fake_get_device_mr(void*, void*, void** dptr) {
    if (dptr != nullptr) *dptr = nullptr;
    return tcpx_ncclSuccess;
}

}  // namespace

extern "C" __attribute__((visibility("default"))) const tcpx_ncclNet_v7_t ncclNetPlugin_v7 = {
    "GPUDirectTCPX_v7_emulated",
    fake_init,
    fake_devices,
    fake_get_properties,
    fake_listen,
    fake_connect,
    fake_accept,
    fake_reg_mr,
    nullptr,  // regMrDmaBuf, as the real plugin
    fake_dereg_mr,
    fake_isend,
    fake_irecv,
    fake_iflush,
    fake_test,
    close_comm,
    close_comm,
    fake_close_listen,
    fake_get_device_mr,
    fake_irecv_consumed,
};
