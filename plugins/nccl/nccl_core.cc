// The v7 core under every exported table: the socket transport's v7 table, and with
// TCPX_P2P_NCCL_CUDA=on, GPU buffers staged through host memory here.
//
// Staging. A registration of GPU memory gets a mirror: host memory of the same size (as much as
// NCCL would have allocated itself for a host-only network), registered with the socket
// transport. The mirror is not pinned and no CUDA allocation is made here: pinning and device
// allocations may wait for the GPU's running kernels (implicit synchronization), and NCCL's
// kernels wait on this plugin (a first try with pinned mirrors hung under all_reduce). A send
// copies its bytes from the GPU to the same offset of the mirror, then posts the mirror's bytes; a
// receive lands in the mirror and is copied to the GPU when the socket transport reports it done,
// before test() says so. The copies are synchronous, on NCCL's proxy thread: the wire of earlier
// requests goes on meanwhile in the transport's I/O threads. They run on a non-blocking stream
// (copy_independent): NCCL's kernels wait on the plugin, and a copy ordered after the application's
// default stream, which may wait on those kernels, would never start. Received data is in GPU
// memory once test() reports it, so iflush has nothing to do.
//
// With staging on, every memory handle and request handed to NCCL is this file's (Mr, Req):
// unknown ones are refused, never dereferenced, and a comm's requests that were never tested
// to completion are freed when it closes.
#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <unordered_set>

#include "common/log.h"
#include "common/params.h"
#include "common/status_util.h"
#include "common/strings.h"
#include "cuda/device.h"
#include "nccl_plugin.h"
#include "net/socket/socket_v7.h"
#include "net/v7_common.h"

namespace tcpx::nccl_plugin {
namespace {

constexpr int kMaxRecvs = 8;

const tcpx_ncclNet_v7_t& socket() { return *net::socket_net_v7(); }

// A registration as NCCL holds it: the transport's handle, and for GPU memory its mirror.
struct Mr {
    void* comm = nullptr;
    void* inner = nullptr;   // the socket transport's handle (of the mirror, for GPU memory)
    uint8_t* gpu = nullptr;  // null: host memory, passed through
    size_t size = 0;
    int device = -1;
    // Plain (pageable) host memory: pinning it (cudaHostAlloc, cudaHostRegister) may wait for
    // the GPU's running kernels, and NCCL's kernels may be waiting on this very plugin.
    std::unique_ptr<uint8_t, decltype(&std::free)> mirror{nullptr, &std::free};

    uint8_t* host_of(const void* p) const {
        return mirror.get() + (static_cast<const uint8_t*>(p) - gpu);
    }
    bool covers(const void* p, size_t len) const {
        const auto* b = static_cast<const uint8_t*>(p);
        return b >= gpu && len <= size && static_cast<size_t>(b - gpu) <= size - len;
    }
};

struct Req {
    void* comm = nullptr;
    void* inner = nullptr;
    int n = 0;  // receives: buffers; 0 for a send
    // Receives into GPU memory: where each buffer lands (mirror) and goes (GPU); null: host.
    uint8_t* gpu[kMaxRecvs] = {};
    uint8_t* host[kMaxRecvs] = {};
    int device[kMaxRecvs] = {};
};

struct State {
    std::mutex mu;
    bool decided = false;
    bool staging = false;  // TCPX_P2P_NCCL_CUDA=on
    bool gpus = false;     // and a GPU is usable: NCCL_PTR_CUDA is offered
    std::unordered_set<Mr*> mrs;
    std::unordered_map<Req*, void*> reqs;  // live requests, by the comm they were posted on
};

State& state() {
    static auto* s = new State;  // never destroyed: NCCL may call in during exit
    return *s;
}

bool staging() {
    State& s = state();
    std::lock_guard<std::mutex> lock(s.mu);
    return s.staging;
}

tcpx_ncclResult_t fail(const Status& st, const char* what) { return net::to_nccl_result(st, what); }

Mr* find_mr(void* mhandle) {
    State& s = state();
    std::lock_guard<std::mutex> lock(s.mu);
    auto* m = static_cast<Mr*>(mhandle);
    return s.mrs.count(m) != 0 ? m : nullptr;
}

// Takes `r` out of the live set; false if it is not a live request of ours.
bool take_req(Req* r) {
    State& s = state();
    std::lock_guard<std::mutex> lock(s.mu);
    return s.reqs.erase(r) != 0;
}

tcpx_ncclResult_t hand_out(void* comm, void* inner, std::unique_ptr<Req> r, void** request) {
    if (inner == nullptr) {  // the transport says: try again later
        *request = nullptr;
        return tcpx_ncclSuccess;
    }
    r->comm = comm;
    r->inner = inner;
    State& s = state();
    std::lock_guard<std::mutex> lock(s.mu);
    s.reqs.emplace(r.get(), comm);
    *request = r.release();
    return tcpx_ncclSuccess;
}

// Frees what `comm` leaves behind when it closes: requests never tested to completion and
// registrations never deregistered (the transport forgets its own handles for them).
void forget_comm(void* comm) {
    State& s = state();
    std::lock_guard<std::mutex> lock(s.mu);
    for (auto it = s.reqs.begin(); it != s.reqs.end();) {
        if (it->second == comm) {
            delete it->first;
            it = s.reqs.erase(it);
        } else {
            ++it;
        }
    }
    for (auto it = s.mrs.begin(); it != s.mrs.end();) {
        if ((*it)->comm == comm) {
            delete *it;
            it = s.mrs.erase(it);
        } else {
            ++it;
        }
    }
}

// --- the table -----------------------------------------------------------------------------------

tcpx_ncclResult_t init(tcpx_ncclDebugLogger_t logger) {
    const tcpx_ncclResult_t rc = socket().init(logger);
    if (rc != tcpx_ncclSuccess) return rc;
    State& s = state();
    std::lock_guard<std::mutex> lock(s.mu);
    if (!s.decided) {
        auto settings = Settings::from_env();  // valid: the transport's init read it
        s.staging = settings.ok() && settings->nccl_cuda == "on";
        s.gpus = s.staging && cuda::device_count() > 0;
        s.decided = true;
        if (s.staging && !s.gpus) {
            TCPX_WARN("TCPX_P2P_NCCL_CUDA=on, but no GPU is usable here: host memory only");
        } else if (s.gpus) {
            TCPX_INFO("NCCL plugin: GPU buffers (NCCL_PTR_CUDA) staged through host memory");
        }
    }
    return tcpx_ncclSuccess;
}

tcpx_ncclResult_t get_properties(int dev, tcpx_ncclNetProperties_v7_t* props) {
    const tcpx_ncclResult_t rc = socket().getProperties(dev, props);
    if (rc != tcpx_ncclSuccess) return rc;
    State& s = state();
    std::lock_guard<std::mutex> lock(s.mu);
    if (s.gpus) props->ptrSupport |= TCPX_NCCL_PTR_CUDA;
    return tcpx_ncclSuccess;
}

tcpx_ncclResult_t reg_mr_sized(void* comm, void* data, size_t size, int type, void** mhandle) {
    if (!staging()) return net::socket_v7_reg_mr_sized(comm, data, size, type, mhandle);
    if (mhandle == nullptr) return fail(invalid_argument("null mhandle"), "regMr");
    *mhandle = nullptr;
    auto m = std::make_unique<Mr>();
    m->comm = comm;
    if (type == TCPX_NCCL_PTR_CUDA) {
        if (size > static_cast<size_t>(INT_MAX)) {
            return fail(invalid_argument(strformat("a size of %zu bytes exceeds INT_MAX", size)),
                        "regMr");
        }
        const cuda::PointerInfo info = cuda::classify(data);
        if (info.kind != MemKind::kCuda || !state().gpus) {
            return fail(invalid_argument("regMr: NCCL_PTR_CUDA memory that is not GPU memory"),
                        "regMr");
        }
        constexpr size_t kPage = 4096;
        m->mirror.reset(static_cast<uint8_t*>(
            std::aligned_alloc(kPage, (std::max<size_t>(size, 1) + kPage - 1) / kPage * kPage)));
        if (m->mirror == nullptr) {
            return fail(resource_exhausted(strformat(
                            "regMr: no host memory for the %zu-byte mirror of GPU memory", size)),
                        "regMr");
        }
        m->gpu = static_cast<uint8_t*>(data);
        m->size = size;
        m->device = info.device;
        const tcpx_ncclResult_t rc =
            net::socket_v7_reg_mr_sized(comm, m->mirror.get(), size, TCPX_NCCL_PTR_HOST, &m->inner);
        if (rc != tcpx_ncclSuccess) return rc;
    } else {
        const tcpx_ncclResult_t rc = net::socket_v7_reg_mr_sized(comm, data, size, type, &m->inner);
        if (rc != tcpx_ncclSuccess) return rc;
    }
    TCPX_DEBUG("NCCL plugin: regMr %p (%zu bytes, %s)", data, size,
               m->gpu != nullptr ? "GPU, staged" : "host");
    State& s = state();
    std::lock_guard<std::mutex> lock(s.mu);
    s.mrs.insert(m.get());
    *mhandle = m.release();
    return tcpx_ncclSuccess;
}

tcpx_ncclResult_t reg_mr(void* comm, void* data, int size, int type, void** mhandle) {
    if (size < 0) return fail(invalid_argument("negative size"), "regMr");
    return reg_mr_sized(comm, data, static_cast<size_t>(size), type, mhandle);
}

tcpx_ncclResult_t dereg_mr(void* comm, void* mhandle) {
    if (!staging()) return socket().deregMr(comm, mhandle);
    Mr* m = nullptr;
    {
        State& s = state();
        std::lock_guard<std::mutex> lock(s.mu);
        auto* p = static_cast<Mr*>(mhandle);
        if (s.mrs.erase(p) == 0) {
            return fail(invalid_argument("deregMr: not a registration of this plugin"), "deregMr");
        }
        m = p;
    }
    std::unique_ptr<Mr> owned(m);
    return socket().deregMr(comm, m->inner);
}

tcpx_ncclResult_t isend_sized(void* comm, void* data, size_t size, int tag, void* mhandle,
                              void** request) {
    if (!staging()) return net::socket_v7_isend_sized(comm, data, size, tag, mhandle, request);
    if (request == nullptr) return fail(invalid_argument("null request"), "isend");
    *request = nullptr;
    Mr* m = find_mr(mhandle);
    if (m == nullptr) return fail(invalid_argument("isend: unknown memory handle"), "isend");
    void* src = data;
    if (m->gpu != nullptr) {
        if (!m->covers(data, size)) {
            return fail(invalid_argument("isend: buffer outside its registration"), "isend");
        }
        src = m->host_of(data);
        if (size > 0) {
            Status st = cuda::device().select(m->device);
            if (st.ok()) st = cuda::device().copy_independent(src, data, size);
            if (!st.ok()) return fail(st, "isend: staging GPU memory");
        }
    }
    void* inner = nullptr;
    const tcpx_ncclResult_t rc = net::socket_v7_isend_sized(comm, src, size, tag, m->inner, &inner);
    if (rc != tcpx_ncclSuccess) return rc;
    return hand_out(comm, inner, std::make_unique<Req>(), request);
}

tcpx_ncclResult_t isend(void* comm, void* data, int size, int tag, void* mhandle, void** request) {
    if (size < 0) return fail(invalid_argument("negative size"), "isend");
    return isend_sized(comm, data, static_cast<size_t>(size), tag, mhandle, request);
}

tcpx_ncclResult_t irecv_sized(void* comm, int n, void** data, size_t* sizes, int* tags,
                              void** mhandles, void** request) {
    if (!staging()) {
        return net::socket_v7_irecv_sized(comm, n, data, sizes, tags, mhandles, request);
    }
    if (request == nullptr) return fail(invalid_argument("null request"), "irecv");
    *request = nullptr;
    if (n < 1 || n > kMaxRecvs || data == nullptr || sizes == nullptr || mhandles == nullptr) {
        return fail(invalid_argument("n outside [1, 8] or a null array"), "irecv");
    }
    auto r = std::make_unique<Req>();
    r->n = n;
    void* dst[kMaxRecvs];
    void* inner_mh[kMaxRecvs];
    for (int i = 0; i < n; ++i) {
        Mr* m = find_mr(mhandles[i]);
        if (m == nullptr) return fail(invalid_argument("irecv: unknown memory handle"), "irecv");
        inner_mh[i] = m->inner;
        dst[i] = data[i];
        if (m->gpu != nullptr) {
            if (!m->covers(data[i], sizes[i])) {
                return fail(invalid_argument("irecv: buffer outside its registration"), "irecv");
            }
            r->gpu[i] = static_cast<uint8_t*>(data[i]);
            r->host[i] = m->host_of(data[i]);
            r->device[i] = m->device;
            dst[i] = r->host[i];
        }
    }
    void* inner = nullptr;
    const tcpx_ncclResult_t rc =
        net::socket_v7_irecv_sized(comm, n, dst, sizes, tags, inner_mh, &inner);
    TCPX_TRACE("NCCL plugin: irecv n %d %p %zu bytes tag %d%s: %d %p", n, data[0], sizes[0],
               tags != nullptr ? tags[0] : -1, r->gpu[0] != nullptr ? " staged" : "",
               static_cast<int>(rc), inner);
    if (rc != tcpx_ncclSuccess) return rc;
    return hand_out(comm, inner, std::move(r), request);
}

tcpx_ncclResult_t irecv(void* comm, int n, void** data, int* sizes, int* tags, void** mhandles,
                        void** request) {
    if (n < 1 || n > kMaxRecvs || sizes == nullptr) {
        return fail(invalid_argument("n outside [1, 8] or null sizes"), "irecv");
    }
    size_t sz[kMaxRecvs];
    for (int i = 0; i < n; ++i) {
        if (sizes[i] < 0) return fail(invalid_argument("negative size"), "irecv");
        sz[i] = static_cast<size_t>(sizes[i]);
    }
    return irecv_sized(comm, n, data, sz, tags, mhandles, request);
}

tcpx_ncclResult_t iflush(void* comm, int n, void** data, int* sizes, void** mhandles,
                         void** request) {
    if (!staging()) return socket().iflush(comm, n, data, sizes, mhandles, request);
    // Staged GPU data was copied before test() reported it: nothing is left to flush. A null
    // request is a flush already done.
    if (request != nullptr) *request = nullptr;
    return tcpx_ncclSuccess;
}

tcpx_ncclResult_t test(void* request, int* done, int* sizes) {
    if (!staging()) return socket().test(request, done, sizes);
    if (done == nullptr) return fail(invalid_argument("null done"), "test");
    auto* r = static_cast<Req*>(request);
    {
        State& s = state();
        std::lock_guard<std::mutex> lock(s.mu);
        if (s.reqs.count(r) == 0) {
            return fail(invalid_argument("test: not a live request of this plugin"), "test");
        }
    }
    int sz[kMaxRecvs] = {};
    *done = 0;
    const tcpx_ncclResult_t rc = socket().test(r->inner, done, sz);
    if (rc != tcpx_ncclSuccess || *done == 0) {
        // A failed request is over as well: the transport has released it.
        if (rc != tcpx_ncclSuccess && take_req(r)) delete r;
        return rc;
    }
    std::unique_ptr<Req> owned(take_req(r) ? r : nullptr);
    TCPX_TRACE("NCCL plugin: test %p done, %d bytes", r->inner, sz[0]);
    for (int i = 0; i < r->n; ++i) {
        if (r->gpu[i] == nullptr || sz[i] <= 0) continue;
        Status st = cuda::device().select(r->device[i]);
        if (st.ok())
            st = cuda::device().copy_independent(r->gpu[i], r->host[i], static_cast<size_t>(sz[i]));
        if (!st.ok()) return fail(st, "test: a received buffer to GPU memory");
    }
    if (sizes != nullptr) {
        for (int i = 0; i < (r->n == 0 ? 1 : r->n); ++i) sizes[i] = sz[i];
    }
    return tcpx_ncclSuccess;
}

tcpx_ncclResult_t close_send(void* comm) {
    const tcpx_ncclResult_t rc = socket().closeSend(comm);
    if (rc == tcpx_ncclSuccess) forget_comm(comm);
    return rc;
}

tcpx_ncclResult_t close_recv(void* comm) {
    const tcpx_ncclResult_t rc = socket().closeRecv(comm);
    if (rc == tcpx_ncclSuccess) forget_comm(comm);
    return rc;
}

tcpx_ncclResult_t get_device_mr(void* comm, void* mhandle, void** dptr_mhandle) {
    if (!staging()) return socket().getDeviceMr(comm, mhandle, dptr_mhandle);
    if (dptr_mhandle != nullptr) *dptr_mhandle = nullptr;
    return tcpx_ncclSuccess;
}

tcpx_ncclResult_t irecv_consumed(void* comm, int n, void* request) {
    if (!staging()) return socket().irecvConsumed(comm, n, request);
    // Host pages and staged GPU copies: nothing to give back (no devmem-TCP pages here).
    return tcpx_ncclSuccess;
}

tcpx_ncclNet_v7_t make_core() {
    tcpx_ncclNet_v7_t t = socket();
    t.name = kName;
    t.init = init;
    t.getProperties = get_properties;
    t.regMr = reg_mr;
    t.deregMr = dereg_mr;
    t.isend = isend;
    t.irecv = irecv;
    t.iflush = iflush;
    t.test = test;
    t.closeSend = close_send;
    t.closeRecv = close_recv;
    t.getDeviceMr = get_device_mr;
    t.irecvConsumed = irecv_consumed;
    return t;
}

}  // namespace

const tcpx_ncclNet_v7_t& core() {
    static const tcpx_ncclNet_v7_t t = make_core();
    return t;
}

tcpx_ncclResult_t core_reg_mr_sized(void* comm, void* data, size_t size, int type, void** mhandle) {
    return reg_mr_sized(comm, data, size, type, mhandle);
}

tcpx_ncclResult_t core_isend_sized(void* comm, void* data, size_t size, int tag, void* mhandle,
                                   void** request) {
    return isend_sized(comm, data, size, tag, mhandle, request);
}

tcpx_ncclResult_t core_irecv_sized(void* comm, int n, void** data, size_t* sizes, int* tags,
                                   void** mhandles, void** request) {
    return irecv_sized(comm, n, data, sizes, tags, mhandles, request);
}

}  // namespace tcpx::nccl_plugin
