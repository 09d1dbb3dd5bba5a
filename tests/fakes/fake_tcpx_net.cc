// An emulation of Google's GPUDirect-TCPX ncclNet plugin (libnccl-net-tcpx.so), built as
// libnccl-net-faketcpx.so and loaded exactly as a user would load the real one
// (TCPX_P2P_NET_PLUGIN). It reproduces what a caller outside NCCL must get right with the real
// plugin (shared/reference/tcpx-plugin.md), refusing — with an error, where the real plugin would
// crash or hang — what it does not allow:
//
//   - a v7 table named GPUDirectTCPX*, device type UNPACK version 7, maxRecvs 1;
//   - init fails unless NCCL_DYNAMIC_CHUNK_SIZE is set (the real plugin then never completes a
//     receive);
//   - at most 16 requests per comm; receives must be given back with irecvConsumed(), every one,
//     oldest first, after test() reported them;
//   - test() only on the comm's oldest request, and it never writes sizes;
//   - irecv with n != 1 is an error; isend/irecv need a memory handle from regMr whose
//     registration holds the buffer;
//   - regMr of CUDA memory needs a 4 KiB-aligned pointer;
//   - the listen handle has Google's layout (tcpx_layout.h) and connect() keeps its progress in
//     it as Google's does, as a pointer in connect_args that later calls follow (a caller must
//     never pass a peer's connect_args through: V7Net::check_peer_handle resets it);
//   - connect() completes on a later call than the first, with the same handle buffer;
//   - accept() needs a device-handle pointer to fill in;
//   - iflush() must not be called;
//   - (cuda mode) a receive comm belongs to the GPU current when it was made: the real plugin
//     records the current GPU at listen (its flow-steering requests name it) and allocates the
//     comm's bounce buffer on it at accept. So accept() must run with the listen's GPU current,
//     and regMr() of CUDA memory of another GPU on a receive comm is refused (stricter than the
//     real plugin, so that a caller whose GPU was not current at listen and accept is caught).
//
// Receives into CUDA memory are delivered as devmem-TCP delivers them: the bytes land in randomly
// chosen 4 KiB pages of the receive comm's bounce buffer, as whole pages or random pieces at random
// offsets within a page, described by loadMeta entries in the comm's unpack queue (device handle
// UNPACK v7 -> {meta, bounce_buf, head}); the request starts with Google's request layout, whose
// unpack slot says which queue entry describes it; the entry count is written by test() when it
// reports the receive done (garbage before); at most 4 MiB and 2048 entries per receive. The pages
// stay taken until irecvConsumed(), then are poisoned, so a caller that gives a receive back
// before it has gathered it reads garbage.
//
// Modes (environment, read by init and by listen):
//   FAKETCPX_MEMORY=host|cuda (default: cuda when a GPU is usable). In host mode "CUDA" memory is
//     addressable from the CPU (the tests' device emulation) and bounce buffer and queue live in
//     host memory; in cuda mode they are GPU memory and mapped pinned memory, as in the real
//     plugin.
//   FAKETCPX_NO_WIRE=1 (read by listen): the comms of that listener move data inside the process
//     with no socket at all, the bounce pages written by a scatter kernel, so that a caller's own
//     ceiling can be measured. Both ends must be in one process. As a NIC's would, the scatter
//     costs the host nothing: it is enqueued on the receive comm's stream, and the receive and
//     the send whose buffer it reads are reported done by test() once it has run.
//   FAKETCPX_POISON=0: pages given back are not poisoned (for measuring a caller's ceiling,
//     where the poisoning kernel would be counted against it).
//   FAKETCPX_POOL_MB: bounce buffer per receive comm (default 64 in cuda mode, 16 in host mode);
//     a receive waits while no pages are free.
//   FAKETCPX_WARN_HOST_RECV=1: every completed host receive logs a WARN line, as the real
//     plugin's do (for the log rate limit's tests).
//   FAKETCPX_MISBEHAVE=slot|count|dst|src|cross|overlap|elsewhere|otherqueue (read by
//     accept): every CUDA receive of that comm is reported done with a broken description, as
//     a plugin with a bug might: an unpack slot index outside the queue, an entry count past
//     kUnpackMaxEntries, a first entry whose place is past the end of the receive, a first
//     entry read from past the end of any bounce buffer (src) or across the end of its page
//     (cross), a second entry placed over the first (overlap: the lengths add up, a gap is left), a
//     description that is whole but lies outside the comm's unpack queue (elsewhere: the slot's
//     pointers name a copy of its entries and count in other memory, as a plugin whose request
//     layout drifted would hand over), or every receive but the comm's first described whole
//     in the same slot of another queue (otherqueue). For the tests of what a caller does with
//     a plugin's garbage.
//     handle|bounce (at accept, cuda mode): the device handle points at host memory, or the
//     unpack handle it points at names a host bounce buffer.
//   FAKETCPX_LINEAR=<k> (read by accept): of every CUDA receive of that comm, the first of each k
//     pieces is not listed but copied straight to its place in the receive's buffer, as the real
//     plugin does with data the NIC left in host memory (SCM_DEVMEM_HEADER: no header split, or
//     a packet steered to a host queue): the entries leave gaps that the buffer already holds.
//   FAKETCPX_ACCEPT_FAILS=1 (read by accept): accept makes the receive comm, hands it out and
//     then fails, as the real plugin's does when setting up the device handle fails after its
//     connection setup gave it a comm.
//   FAKETCPX_FULL_SENDS=1: isend takes no request, ever (success, no request: "full").
//   FAKETCPX_NULL_LISTEN=1: listen succeeds without a listen comm. FAKETCPX_SAME_COMM=1 (read by
//     accept): accept hands out the comm it accepted last, again.
//   FAKETCPX_THROW=regMr|closeSend: that call throws a C++ exception (a plugin with a bug).
//   FAKETCPX_MR_FD=1 (read by regMr): every CUDA registration holds a descriptor (an eventfd)
//     until deregistered, as the real plugin's each holds a dma-buf fd.
// For tests, faketcpx_open_comms() and faketcpx_open_mrs() (exported) count the comms made and
// not yet closed, and the registrations made and not yet deregistered (a close releases none,
// as in the real plugin); faketcpx_open_cuda_mrs() and faketcpx_peak_cuda_mrs() the CUDA ones
// now and at most at once; faketcpx_busy_deregs() the deregMr calls refused because a request
// posted with the registration was not reported done yet (the real plugin's pages and
// descriptor would go from under it);
// faketcpx_cuda_regs_made() the CUDA registrations made so far.
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "common/params.h"
#include "common/splitmix.h"
#include "cuda/unpack.h"
#include "cuda/unpack_defs.h"
#include "net/ncclnet_v7.h"
#include "net/plugin/tcpx_layout.h"
#include "net/socket/socket_net.h"
#include "net/socket/wire.h"

#if TCPX_P2P_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace {

using tcpx::Status;
namespace net = tcpx::net;
namespace cu = tcpx::cuda;
namespace gt = tcpx::net::google_tcpx;

constexpr int kMaxRequests = 16;
constexpr size_t kMaxCudaRecv = 4 << 20;
constexpr uint32_t kPage = cu::kUnpackPageSize;
constexpr uint32_t kCommMagic = 0x46545843;  // "FTXC"
constexpr uint32_t kReqMagic = 0x46545852;   // "FTXR"
constexpr uint32_t kMrMagic = 0x4654584d;    // "FTXM"
constexpr uint8_t kPoison = 0xdb;
constexpr uint64_t kGarbageCount = 0xdeadbeefdeadbeefULL;
constexpr uint32_t kConnectMagic = 0x46545841;  // "FTXA"
// A no-wire listener's handle: this mark in port_start / port_count (a wire listener's hold the
// socket transport's listener nonce there), its id as connect_addr's port.
constexpr uint64_t kNoWireMark = 0x464158574952454eULL;  // "FAXWIREN"
constexpr uint64_t kMaxNoWireId = 65535;

tcpx_ncclDebugLogger_t g_log = nullptr;
std::mutex g_mu;
std::unique_ptr<net::SocketNet> g_net;
bool g_cuda = false;  // cuda mode

// Each line names its own source line, as the real plugin's WARN/INFO macros do (the caller's
// rate limit is per source line).
#define FAKE_WARN(...) log_line(TCPX_NCCL_LOG_WARN, __FILE__, __LINE__, __VA_ARGS__)
void log_line(int level, const char* file, int line, const char* fmt, ...)
    __attribute__((format(printf, 4, 5)));
void log_line(int level, const char* file, int line, const char* fmt, ...) {
    char buf[512];
    va_list args;
    va_start(args, fmt);
    std::vsnprintf(buf, sizeof(buf), fmt, args);
    va_end(args);
    if (g_log != nullptr) g_log(level, TCPX_NCCL_NET_FLAG, file, line, "FakeTCPX: %s", buf);
}

// FAKETCPX_TRACE=1: one line per receive event on stderr, with microseconds since start (to
// see where a caller's time goes).
double trace_us() {
    static const auto t0 = std::chrono::steady_clock::now();
    return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
}
bool tracing() {
    static const bool on = [] {
        const char* v = std::getenv("FAKETCPX_TRACE");
        return v != nullptr && std::strcmp(v, "1") == 0;
    }();
    return on;
}
#define FAKE_TRACE(...)                                           \
    do {                                                          \
        if (tracing()) {                                          \
            std::fprintf(stderr, "faketcpx %12.1f ", trace_us()); \
            std::fprintf(stderr, __VA_ARGS__);                    \
            std::fputc('\n', stderr);                             \
        }                                                         \
    } while (0)

tcpx_ncclResult_t fail(const Status& st, const char* what) {
    FAKE_WARN("%s: %s", what, st.to_string().c_str());
    return tcpx_ncclInternalError;  // the real plugin reports nearly everything this way
}
tcpx_ncclResult_t fail(const char* what) {
    FAKE_WARN("%s", what);
    return tcpx_ncclInternalError;
}

// --- memory: GPU (cuda mode) or host (host mode) ---------------------------------------------

#if TCPX_P2P_HAVE_CUDA
bool cuda_ok(cudaError_t e, const char* what) {
    if (e == cudaSuccess) return true;
    FAKE_WARN("%s: %s", what, cudaGetErrorString(e));
    return false;
}
#endif

bool gpu_usable() {
#if TCPX_P2P_HAVE_CUDA
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError();
        return false;
    }
    return n > 0;
#else
    return false;
#endif
}

// The calling thread's current GPU in cuda mode, else -1 (nothing to check).
int current_gpu() {
#if TCPX_P2P_HAVE_CUDA
    int d = -1;
    if (g_cuda && cudaGetDevice(&d) == cudaSuccess) return d;
#endif
    return -1;
}

// The GPU CUDA memory at `p` lives on, or -1 where it is not known (host mode, host memory).
int gpu_of(const void* p) {
#if TCPX_P2P_HAVE_CUDA
    cudaPointerAttributes a{};
    if (g_cuda && cudaPointerGetAttributes(&a, p) == cudaSuccess && a.type == cudaMemoryTypeDevice)
        return a.device;
    cudaGetLastError();
#else
    (void)p;
#endif
    return -1;
}

// Device memory (cuda mode) or host memory.
void* mem_alloc(size_t len) {
#if TCPX_P2P_HAVE_CUDA
    if (g_cuda) {
        void* p = nullptr;
        return cuda_ok(cudaMalloc(&p, len), "cudaMalloc") ? p : nullptr;
    }
#endif
    return std::malloc(len);
}
// A copy between any two of host and (in cuda mode) device memory, finished when it returns
// (cudaMemcpy alone may return before a copy to the device has landed).
bool mem_copy(void* dst, const void* src, size_t len) {
    if (len == 0) return true;
#if TCPX_P2P_HAVE_CUDA
    if (g_cuda) {
        return cuda_ok(cudaMemcpyAsync(dst, src, len, cudaMemcpyDefault, cudaStreamPerThread),
                       "cudaMemcpyAsync") &&
               cuda_ok(cudaStreamSynchronize(cudaStreamPerThread), "cudaStreamSynchronize");
    }
#endif
    std::memcpy(dst, src, len);
    return true;
}

// --- comms and requests ------------------------------------------------------------------------

struct FakeComm;

std::atomic<int> g_open_mrs{0};
std::atomic<int> g_open_cuda_mrs{0};
std::atomic<int> g_peak_cuda_mrs{0};
std::atomic<int> g_busy_deregs{0};
std::atomic<int> g_cuda_regs_made{0};

struct FakeMr {
    FakeMr() { ++g_open_mrs; }
    ~FakeMr() {
        --g_open_mrs;
        if (type == TCPX_NCCL_PTR_CUDA) --g_open_cuda_mrs;
        if (fd >= 0) ::close(fd);
    }
    FakeMr(const FakeMr&) = delete;
    FakeMr& operator=(const FakeMr&) = delete;
    uint32_t magic = kMrMagic;
    // Registered with it; null once it closed. As in Google's plugin, a close releases none of
    // its registrations (each CUDA one holds a dma-buf fd there) and deregMr reads only the
    // handle: one left at a close stays, counted (faketcpx_open_mrs), until deregistered.
    FakeComm* comm = nullptr;
    int type = 0;
    uintptr_t base = 0;  // what was registered
    size_t size = 0;
    int fd = -1;                // FAKETCPX_MR_FD
    std::atomic<int> users{0};  // requests posted with it that test() has not reported done
};
// Registrations whose comm closed (kept reachable: a caller's leak shows in the count, not as
// the process's).
std::mutex g_orphan_mu;
std::unordered_set<FakeMr*>& g_orphan_mrs = *new std::unordered_set<FakeMr*>;

bool valid_mr(void* mh) { return mh != nullptr && static_cast<FakeMr*>(mh)->magic == kMrMagic; }
// The real plugin finds a buffer's pages through its registration: a buffer outside it would
// send or receive memory it never mapped.
bool mr_holds(void* mh, const void* data, size_t size) {
    const auto* mr = static_cast<FakeMr*>(mh);
    const auto p = reinterpret_cast<uintptr_t>(data);
    return p >= mr->base && p - mr->base <= mr->size && size <= mr->size - (p - mr->base);
}
bool is_cuda_mr(void* mh) { return static_cast<FakeMr*>(mh)->type == TCPX_NCCL_PTR_CUDA; }

struct Link;

struct FakeReq {
    // First, as in Google's plugin: a caller reads the unpack slot from it.
    net::google_tcpx::Request g{};
    uint32_t magic = kReqMagic;
    FakeComm* comm = nullptr;
    bool recv = false;
    bool cuda = false;                // the caller's buffer is CUDA memory
    FakeMr* mr = nullptr;             // its registration, a user of it until reported done
    void* data = nullptr;             // the caller's buffer
    size_t size = 0;                  // posted size (receives) or size sent
    std::atomic<bool> landed{false};  // the bytes are where the caller will find them
    size_t received = 0;              // receives: bytes that came
    bool done = false;                // test() reported it
    uint64_t entries = 0;             // CUDA receives: loadMeta entries written to the queue slot
    std::vector<uint32_t> pages;      // bounce pages it holds
    std::vector<uint8_t> staging;     // host copy of the bytes (wire mode, CUDA memory)
    std::vector<uint8_t> elsewhere;   // FAKETCPX_MISBEHAVE=elsewhere: the description moved
    net::Request* inner = nullptr;    // the socket transport's request (wire mode)
    // Cuda mode: a scatter kernel moves the bytes (of a receive, or of the send it was matched
    // with, whose buffer it reads); they are landed once this event, recorded after it, has
    // completed. `bad` is the kernel's verdict on a receive's list.
    bool scattering = false;
    void* event = nullptr;  // from the event pool of GPU event_device
    int event_device = -1;
    const uint32_t* bad = nullptr;

    FakeReq() = default;
    FakeReq(const FakeReq&) = delete;
    FakeReq& operator=(const FakeReq&) = delete;
    ~FakeReq();
};

// A posted request uses its registration until test() reports it done (the bytes are where
// they go: a receive's unpack reads the comm's pages, not the registration) or fails.
void use_mr(FakeReq* r) {
    if (r->mr != nullptr) ++r->mr->users;
}
void done_with_mr(FakeReq* r) {
    if (r->mr != nullptr) --r->mr->users;
    r->mr = nullptr;
}

// The in-process pipe between a no-wire send comm and its receive comm.
struct Link {
    std::mutex mu;
    std::deque<FakeReq*> sends;  // posted, not yet matched
    std::deque<FakeReq*> recvs;
    bool send_closed = false;
    bool recv_closed = false;
};

// The random choices of pages and pieces. A NIC's landing costs its host nothing, but this
// emulation makes them in the caller's thread (the one that posts or tests), so they must be
// cheap: with std::mt19937_64 and a division per choice they and the landing took 30 % of the
// CPU of an engine benchmark at 50-60 GB/s, in its progress threads. splitmix64, and a multiply
// for a bounded choice.
struct PageRng {
    uint64_t state = 0x7c9a11;
    uint64_t next() {
        const uint64_t r = tcpx::splitmix64(state);
        state += tcpx::kSplitmixGamma;
        return r;
    }
    // Uniform enough in [0, n) for n > 0 (the high half of a 64 x 64-bit product).
    static uint64_t below(uint64_t r, uint64_t n) {
        return static_cast<uint64_t>((static_cast<unsigned __int128>(r) * n) >> 64);
    }
};

// A receive comm's devmem-TCP state: the bounce buffer and the unpack queue.
struct UnpackState {
    uint8_t* bounce = nullptr;
    size_t pages = 0;
    std::vector<uint32_t> free_pages;
    cu::UnpackMeta* meta = nullptr;      // host view
    cu::UnpackMeta* meta_dev = nullptr;  // what the device handle says
    cu::UnpackHandle* handle = nullptr;  // device memory in cuda mode
    int next_slot = 0;                   // slots go round, as receives are consumed in order
    PageRng rng;
    // Cuda mode: the scatter kernel's list per unpack slot (pinned, and its device copy) and
    // bad flag per slot (mapped), so that scatters run asynchronously, a device copy of
    // host-memory sources, and the stream it all runs on.
    struct ScatterList {
        uint64_t count;
        uint64_t pad;
        cu::LoadMeta entries[cu::kUnpackMaxEntries];
    };
    ScatterList* scatter_host = nullptr;
    ScatterList* scatter_dev = nullptr;
    uint32_t* bad_host = nullptr;
    uint32_t* bad_dev = nullptr;
    uint8_t* bounce_src = nullptr;
    // Cuda mode: a page of poison and the list that copies it over pages given back (one
    // kernel per receive; a memset per page would cost more than everything else).
    uint8_t* poison_page = nullptr;
    cu::LoadMeta* poison_list = nullptr;
    void* stream = nullptr;
    int device = 0;
};

#if TCPX_P2P_HAVE_CUDA
// Makes the comm's GPU current for the scope: its stream belongs to it, and the caller may be
// the thread of an endpoint on another GPU (no-wire sends land in the receiver's pages).
class OnDevice {
 public:
    explicit OnDevice(int device) {
        cudaGetDevice(&previous_);
        if (previous_ != device) cudaSetDevice(device);
        device_ = device;
    }
    ~OnDevice() {
        if (previous_ != device_) cudaSetDevice(previous_);
    }
    OnDevice(const OnDevice&) = delete;
    OnDevice& operator=(const OnDevice&) = delete;

 private:
    int previous_ = 0;
    int device_ = 0;
};
#endif

bool poison_enabled() {
    const char* v = std::getenv("FAKETCPX_POISON");
    return v == nullptr || std::strcmp(v, "0") != 0;
}

// Poisons pages given back (unless FAKETCPX_POISON=0), on the comm's stream: ordered before the
// next scatter into them.
void poison_pages(UnpackState* u, const std::vector<uint32_t>& pages) {
    if (pages.empty() || !poison_enabled()) return;
#if TCPX_P2P_HAVE_CUDA
    if (g_cuda) {
        OnDevice on(u->device);
        auto stream = static_cast<cudaStream_t>(u->stream);
        // The stream orders these uploads after the previous kernel that read the list.
        std::vector<cu::LoadMeta> list(pages.size());
        for (size_t k = 0; k < pages.size(); ++k)
            list[k] = cu::LoadMeta{0, kPage, uint64_t{pages[k]} * kPage};
        const uint64_t count = pages.size();
        auto* cnt = reinterpret_cast<uint64_t*>(u->poison_list + cu::kUnpackMaxEntries);
        if (cuda_ok(
                cudaMemcpyAsync(u->poison_list, list.data(), pages.size() * sizeof(cu::LoadMeta),
                                cudaMemcpyHostToDevice, stream),
                "cudaMemcpyAsync") &&
            cuda_ok(cudaMemcpyAsync(cnt, &count, sizeof(count), cudaMemcpyHostToDevice, stream),
                    "cudaMemcpyAsync")) {
            (void)cu::launch_unpack(u->poison_list, cnt, u->poison_page, u->bounce,
                                    u->pages * kPage, nullptr, stream);
        }
        return;
    }
#endif
    for (uint32_t page : pages)
        std::memset(u->bounce + static_cast<size_t>(page) * kPage, kPoison, kPage);
}

std::atomic<int> g_open_comms{0};

struct FakeComm {
    FakeComm() { ++g_open_comms; }
    ~FakeComm() { --g_open_comms; }
    FakeComm(const FakeComm&) = delete;
    FakeComm& operator=(const FakeComm&) = delete;
    uint32_t magic = kCommMagic;
    bool recv = false;
    net::SendComm* send_comm = nullptr;  // wire mode
    net::RecvComm* recv_comm = nullptr;
    std::shared_ptr<Link> link;  // no-wire mode
    // Requests in posting order: not yet reported by test(), then (receives) reported but not
    // yet consumed. At most kMaxRequests.
    std::deque<FakeReq*> queue;
    std::unique_ptr<UnpackState> unpack;  // receive comms
    int gpu = -1;                         // cuda mode: the GPU current when it was made
    // Registrations not yet deregistered: close releases them, as a transport's close does (the
    // engine closes a comm whose requests outlived their grace with its registrations).
    std::unordered_set<FakeMr*> mrs;
    std::string misbehave;  // FAKETCPX_MISBEHAVE at accept (receive comms)
    uint64_t linear = 0;    // FAKETCPX_LINEAR at accept (receive comms)
    // FAKETCPX_MISBEHAVE=otherqueue: CUDA receives reported so far, and the second queue the
    // later ones are described in.
    uint64_t cuda_recvs_reported = 0;
    std::unique_ptr<cu::UnpackMeta> other_meta;
    std::mutex mu;
};

FakeComm* as_comm(void* c) {
    auto* comm = static_cast<FakeComm*>(c);
    return comm != nullptr && comm->magic == kCommMagic ? comm : nullptr;
}

// No-wire listeners by id, with the links connected to each and not yet accepted.
struct NoWireListen {
    uint64_t mark = kNoWireMark;  // also tells a listen comm of this kind from the transport's
    uint64_t id = 0;
    std::deque<std::shared_ptr<Link>> pending;
};
std::unordered_map<uint64_t, NoWireListen*> g_listens;
uint64_t g_next_listen = 1;
// Cuda mode: each open listen comm's GPU, current at listen (under g_mu).
std::unordered_map<void*, int> g_listen_gpu;

void remember_listen_gpu(void* listen_comm) {
    const int gpu = current_gpu();
    if (gpu < 0) return;
    std::lock_guard<std::mutex> lock(g_mu);
    g_listen_gpu[listen_comm] = gpu;
}

size_t pool_bytes() {
    const char* mb = std::getenv("FAKETCPX_POOL_MB");
    long v = mb != nullptr ? std::atol(mb) : 0;
    if (v <= 0) v = g_cuda ? 64 : 16;
    return static_cast<size_t>(v) << 20;
}

void free_unpack(UnpackState* u) {
    if (u == nullptr) return;
#if TCPX_P2P_HAVE_CUDA
    if (g_cuda) {
        OnDevice on(u->device);
        if (u->stream != nullptr) {
            cudaStreamSynchronize(static_cast<cudaStream_t>(u->stream));
            cudaStreamDestroy(static_cast<cudaStream_t>(u->stream));
        }
        cudaFreeHost(u->meta);
        cudaFreeHost(u->scatter_host);
        cudaFreeHost(u->bad_host);
        cudaFree(u->scatter_dev);
        cudaFree(u->poison_list);
        cudaFree(u->poison_page);
        cudaFree(u->bounce_src);
        cudaFree(u->handle);
        cudaFree(u->bounce);
        return;
    }
#endif
    std::free(u->meta);
    std::free(u->handle);
    std::free(u->bounce);
}

// Accept's allocation of the bounce buffer and the unpack queue (the real plugin does this in
// accept too), on the caller's current GPU.
std::unique_ptr<UnpackState> make_unpack() {
    auto u = std::make_unique<UnpackState>();
    const size_t bytes = pool_bytes();
    u->pages = bytes / kPage;
    u->bounce = static_cast<uint8_t*>(mem_alloc(bytes));
    bool ok = u->bounce != nullptr;
#if TCPX_P2P_HAVE_CUDA
    if (g_cuda && ok) {
        cudaGetDevice(&u->device);
        void* meta = nullptr;
        void* dev = nullptr;
        cudaStream_t s = nullptr;
        ok =
            cuda_ok(cudaHostAlloc(&meta, sizeof(cu::UnpackMeta), cudaHostAllocMapped),
                    "cudaHostAlloc") &&
            cuda_ok(cudaHostGetDevicePointer(&dev, meta, 0), "cudaHostGetDevicePointer") &&
            cuda_ok(cudaMalloc(reinterpret_cast<void**>(&u->handle), sizeof(cu::UnpackHandle)),
                    "cudaMalloc") &&
            cuda_ok(cudaHostAlloc(reinterpret_cast<void**>(&u->scatter_host),
                                  sizeof(UnpackState::ScatterList) * cu::kUnpackQueueDepth,
                                  cudaHostAllocDefault),
                    "cudaHostAlloc") &&
            cuda_ok(cudaMalloc(reinterpret_cast<void**>(&u->scatter_dev),
                               sizeof(UnpackState::ScatterList) * cu::kUnpackQueueDepth),
                    "cudaMalloc") &&
            cuda_ok(cudaHostAlloc(reinterpret_cast<void**>(&u->bad_host),
                                  sizeof(uint32_t) * cu::kUnpackQueueDepth, cudaHostAllocMapped),
                    "cudaHostAlloc") &&
            cuda_ok(cudaHostGetDevicePointer(reinterpret_cast<void**>(&u->bad_dev), u->bad_host, 0),
                    "cudaHostGetDevicePointer") &&
            cuda_ok(cudaMalloc(reinterpret_cast<void**>(&u->bounce_src), kMaxCudaRecv),
                    "cudaMalloc") &&
            cuda_ok(cudaMalloc(reinterpret_cast<void**>(&u->poison_list),
                               sizeof(cu::LoadMeta) * (cu::kUnpackMaxEntries + 1)),
                    "cudaMalloc") &&
            cuda_ok(cudaMalloc(reinterpret_cast<void**>(&u->poison_page), kPage), "cudaMalloc") &&
            cuda_ok(cudaMemset(u->poison_page, kPoison, kPage), "cudaMemset") &&
            cuda_ok(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate");
        u->meta = static_cast<cu::UnpackMeta*>(meta);
        u->meta_dev = static_cast<cu::UnpackMeta*>(dev);
        u->stream = s;
    }
#endif
    if (!g_cuda && ok) {
        u->meta = static_cast<cu::UnpackMeta*>(std::malloc(sizeof(cu::UnpackMeta)));
        u->meta_dev = u->meta;
        u->handle = static_cast<cu::UnpackHandle*>(std::malloc(sizeof(cu::UnpackHandle)));
        ok = u->meta != nullptr && u->handle != nullptr;
    }
    if (ok) {
        std::memset(u->meta, kPoison, sizeof(cu::UnpackMeta));
        const cu::UnpackHandle h{u->meta_dev, u->bounce, ~uint64_t{0}};
        ok = mem_copy(u->handle, &h, sizeof(h));
    }
    if (!ok) {
        free_unpack(u.get());
        return nullptr;
    }
    u->free_pages.resize(u->pages);
    for (size_t i = 0; i < u->pages; ++i) u->free_pages[i] = static_cast<uint32_t>(i);
    return u;
}

// Events for scatters, pooled per GPU: requests come and go at every chunk, and creating and
// destroying two events for each would be counted against the caller being measured.
std::mutex g_event_mu;
std::unordered_map<int, std::vector<void*>> g_events;

#if TCPX_P2P_HAVE_CUDA
// An event of the current GPU (which is `device`), or null on failure.
void* get_event(int device) {
    {
        std::lock_guard<std::mutex> lock(g_event_mu);
        auto& pool = g_events[device];
        if (!pool.empty()) {
            void* ev = pool.back();
            pool.pop_back();
            return ev;
        }
    }
    cudaEvent_t ev = nullptr;
    if (cuda_ok(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming), "cudaEventCreate")) {
        return ev;
    }
    return nullptr;
}
#endif

void put_event(int device, void* ev) {
    std::lock_guard<std::mutex> lock(g_event_mu);
    g_events[device].push_back(ev);
}

// The scatter a NIC does: src[0, n) -> `entries` (dst_off = offset in src) in the bounce buffer,
// for receive `r` in unpack slot `slot`. In cuda mode it is only enqueued (a NIC costs its host
// nothing): `r`, and `sender` when the source is a matched send's buffer, land when the scatter
// has run (settle()). `src_on_device` says where src is (cuda mode).
bool scatter(UnpackState* u, size_t slot, const cu::LoadMeta* entries, uint64_t count,
             const uint8_t* src, bool src_on_device, size_t n, FakeReq* r, FakeReq* sender) {
    if (!g_cuda) {
        for (uint64_t k = 0; k < count; ++k) {
            std::memcpy(u->bounce + entries[k].src_off, src + entries[k].dst_off, entries[k].len);
        }
        return true;
    }
#if TCPX_P2P_HAVE_CUDA
    OnDevice on(u->device);
    auto stream = static_cast<cudaStream_t>(u->stream);
    // The kernel runs on the bounce buffer's GPU: a source in host memory or on another GPU is
    // brought there first (cudaMemcpyDefault goes peer-to-peer or through the host); the stream
    // keeps the next copy into bounce_src behind this scatter.
    int src_device = u->device;
    if (src_on_device) {
        cudaPointerAttributes attr{};
        if (cudaPointerGetAttributes(&attr, src) == cudaSuccess) src_device = attr.device;
        cudaGetLastError();
    }
    if (count > 0 && (!src_on_device || src_device != u->device)) {
        if (!cuda_ok(cudaMemcpyAsync(u->bounce_src, src, n, cudaMemcpyDefault, stream),
                     "cudaMemcpyAsync")) {
            return false;
        }
        src = u->bounce_src;
    }
    // The unpack kernel run backwards: the source is the "bounce" side, the pages the
    // destination. The slot's list and flag are free: its previous receive was consumed after
    // its scatter had run.
    UnpackState::ScatterList* list = u->scatter_host + slot;
    list->count = count;
    for (uint64_t k = 0; k < count; ++k) {
        list->entries[k] = cu::LoadMeta{static_cast<uint32_t>(entries[k].dst_off), entries[k].len,
                                        entries[k].src_off};
    }
    u->bad_host[slot] = 0;
    UnpackState::ScatterList* dev = u->scatter_dev + slot;
    bool ok = cuda_ok(cudaMemcpyAsync(dev, list, 16 + count * sizeof(cu::LoadMeta),
                                      cudaMemcpyHostToDevice, stream),
                      "cudaMemcpyAsync") &&
              cu::launch_unpack(dev->entries, &dev->count, src, u->bounce, u->pages * kPage,
                                u->bad_dev + slot, stream, count)
                  .ok();
    for (FakeReq* q : {r, sender}) {
        if (q == nullptr || !ok) continue;
        if (q->event == nullptr) {
            q->event = get_event(u->device);
            q->event_device = u->device;
            ok = q->event != nullptr;
        }
        ok = ok && cuda_ok(cudaEventRecord(static_cast<cudaEvent_t>(q->event), stream),
                           "cudaEventRecord");
        q->scattering = ok;
    }
    r->bad = u->bad_host + slot;
    return ok;
#else
    (void)slot;
    (void)src_on_device;
    (void)n;
    (void)r;
    (void)sender;
    return false;
#endif
}

// Whether a request's bytes have landed; in cuda mode, once its scatter has run. Sets *error
// when it failed.
bool settle(FakeReq* r, bool* error) {
    if (r->landed) return true;
    if (!r->scattering) return false;
#if TCPX_P2P_HAVE_CUDA
    const cudaError_t e = cudaEventQuery(static_cast<cudaEvent_t>(r->event));
    if (e == cudaErrorNotReady) {
        cudaGetLastError();
        return false;
    }
    if (!cuda_ok(e, "the scatter kernel")) {
        *error = true;
        return false;
    }
    if (r->bad != nullptr && *r->bad != 0) {
        FAKE_WARN("scatter kernel refused its list");
        *error = true;
        return false;
    }
#endif
    r->scattering = false;
    r->landed = true;
    return true;
}

FakeReq::~FakeReq() {
    if (event != nullptr) put_event(event_device, event);
}

// Lands `n` bytes at `src` for a receive into CUDA memory: random free pages of the bounce
// buffer, whole or in pieces, and the entries saying where each piece belongs. False (nothing
// taken) while too few pages are free; sets *error on failure.
bool land_cuda(FakeComm* rc, FakeReq* r, const uint8_t* src, bool src_on_device, size_t n,
               FakeReq* sender, bool* error) {
    UnpackState* u = rc->unpack.get();
    if (u->free_pages.size() < (n + kPage - 1) / kPage) return false;
    const size_t slot = r->g.unpack_slot.idx;
    cu::LoadMeta* entries = u->meta->mem[slot];
    uint64_t count = 0;
    size_t off = 0;
    r->pages.reserve(r->pages.size() + (n + kPage - 1) / kPage);
    while (off < n) {
        const size_t left = n - off;
        const size_t left_pages = (left + kPage - 1) / kPage;
        const uint64_t budget = cu::kUnpackMaxEntries - count;
        // A piece of a page now and then, while the entries and pages left can still carry
        // the rest.
        // One draw picks the page (its high bits) and whether to cut a piece (its low two).
        const uint64_t draw = u->rng.next();
        const bool piece =
            (draw & 3) == 0 && left_pages < budget && u->free_pages.size() > left_pages;
        const size_t pick = PageRng::below(draw, u->free_pages.size());
        const uint32_t page = u->free_pages[pick];
        u->free_pages[pick] = u->free_pages.back();
        u->free_pages.pop_back();
        r->pages.push_back(page);
        uint32_t len = kPage;
        uint32_t in_page = 0;
        if (piece) {
            const uint64_t cut = u->rng.next();
            len = 1 + static_cast<uint32_t>(PageRng::below(cut, kPage));
            in_page = static_cast<uint32_t>(PageRng::below(cut << 16, kPage - len + 1));
        }
        len = static_cast<uint32_t>(std::min<size_t>(len, left));
        if (in_page + len > kPage) in_page = kPage - len;
        entries[count++] = cu::LoadMeta{page * kPage + in_page, len, off};
        off += len;
    }
    if (rc->linear > 0) {
        // (A piece's page stays the receive's, unused: given back with the rest.)
        uint64_t listed = 0;
        for (uint64_t k = 0; k < count; ++k) {
            if (k % rc->linear != 0) {
                entries[listed++] = entries[k];
            } else if (!mem_copy(static_cast<uint8_t*>(r->data) + entries[k].dst_off,
                                 src + entries[k].dst_off, entries[k].len)) {
                *error = true;
                return false;
            }
        }
        count = listed;
    }
    FAKE_TRACE("land %p slot %zu: %zu bytes, %llu entries", static_cast<void*>(r), slot, n,
               static_cast<unsigned long long>(count));
    const bool scattered = scatter(u, slot, entries, count, src, src_on_device, n, r, sender);
    FAKE_TRACE("scattering %p", static_cast<void*>(r));
    if (!scattered) {
        *error = true;
        return false;
    }
    r->entries = count;
    r->received = n;
    if (!r->scattering) r->landed = true;  // host mode: already in place
    return true;
}

// Lands a receive's bytes, from memory of the given kind (a matched send's buffer when `sender`
// is given); see land_cuda().
bool land(FakeReq* r, const uint8_t* src, bool src_on_device, size_t n, FakeReq* sender,
          bool* error) {
    if (n > r->size) {
        FAKE_WARN("a message of %zu bytes for a receive of %zu", n, r->size);
        *error = true;
        return false;
    }
    if (r->cuda) return land_cuda(r->comm, r, src, src_on_device, n, sender, error);
    if (!mem_copy(r->data, src, n)) {
        *error = true;
        return false;
    }
    r->received = n;
    r->landed = true;
    return true;
}

// No-wire: pairs posted sends with posted receives, in order. Called with link->mu held.
bool match(Link* link) {
    while (!link->sends.empty() && !link->recvs.empty()) {
        FakeReq* s = link->sends.front();
        FakeReq* r = link->recvs.front();
        bool error = false;
        std::lock_guard<std::mutex> lock(r->comm->mu);
        if (!land(r, static_cast<const uint8_t*>(s->data), s->cuda && g_cuda, s->size, s, &error)) {
            if (error) return false;
            break;  // no bounce pages free until the caller consumes some
        }
        if (!s->scattering) s->landed = true;  // else once the scatter has read its buffer
        link->sends.pop_front();
        link->recvs.pop_front();
    }
    return true;
}

// No-wire: queues a posted request on its comm (under `lock`, the comm's) and on the link, then
// pairs what can be paired.
tcpx_ncclResult_t post_in_process(FakeComm* comm, std::unique_ptr<FakeReq> r,
                                  std::unique_lock<std::mutex> lock, void** request) {
    FakeReq* raw = r.release();
    use_mr(raw);
    comm->queue.push_back(raw);
    lock.unlock();
    std::lock_guard<std::mutex> link_lock(comm->link->mu);
    (raw->recv ? comm->link->recvs : comm->link->sends).push_back(raw);
    if (!match(comm->link.get())) return fail("delivering in-process");
    *request = raw;
    return tcpx_ncclSuccess;
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
    const char* mode = std::getenv("FAKETCPX_MEMORY");
    const std::string m = mode != nullptr ? mode : "";
    if (m == "cuda") {
        if (!gpu_usable()) {
            FAKE_WARN("FAKETCPX_MEMORY=cuda but no GPU is usable");
            return tcpx_ncclSystemError;
        }
        g_cuda = true;
    } else if (m == "host") {
        g_cuda = false;
    } else if (m.empty() || m == "auto") {
        g_cuda = gpu_usable();
    } else {
        FAKE_WARN("FAKETCPX_MEMORY=%s: expected host, cuda or auto", m.c_str());
        return tcpx_ncclInvalidUsage;
    }
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

bool no_wire_requested() {
    const char* v = std::getenv("FAKETCPX_NO_WIRE");
    return v != nullptr && std::strcmp(v, "1") == 0;
}

// One address of a handle in Google's union socketAddress.
void put_address(const tcpx::SocketAddress& addr, gt::SocketAddress* out) {
    std::memset(out, 0, sizeof(*out));
    std::memcpy(out, addr.get(), std::min<size_t>(addr.size(), sizeof(*out)));
}

void put_handle(const gt::Handle& h, void* handle) {
    std::memset(handle, 0, TCPX_NCCL_NET_HANDLE_MAXSIZE);
    std::memcpy(handle, &h, sizeof(h));
}

tcpx_ncclResult_t fake_listen(int dev, void* handle, void** listen_comm) {
    if (const char* v = std::getenv("FAKETCPX_NULL_LISTEN"); v != nullptr && v[0] == '1') {
        *listen_comm = nullptr;  // "success", and no comm
        return tcpx_ncclSuccess;
    }
    gt::Handle h{};
    h.num_threads = 1;
    h.redirect_ctrl = false;
    h.connect_args = nullptr;
    if (no_wire_requested()) {
        if (dev < 0 || dev >= g_net->device_count()) return fail("listen: no such device");
        auto* l = new NoWireListen;
        {
            std::lock_guard<std::mutex> lock(g_mu);
            if (g_next_listen > kMaxNoWireId) {
                delete l;
                return fail("listen: too many no-wire listeners in this process");
            }
            l->id = g_next_listen++;
            g_listens[l->id] = l;
        }
        tcpx::SocketAddress addr = g_net->interfaces()[static_cast<size_t>(dev)].address;
        addr.set_port(static_cast<uint16_t>(l->id));
        put_address(addr, &h.connect_addr);
        h.ctrl_addr = h.connect_addr;
        std::memcpy(&h.port_start, &kNoWireMark, 4);
        std::memcpy(&h.port_count, reinterpret_cast<const uint8_t*>(&kNoWireMark) + 4, 4);
        h.num_socks = 1;
        put_handle(h, handle);
        *listen_comm = l;
        remember_listen_gpu(l);
        return tcpx_ncclSuccess;
    }
    // The socket transport listens; its handle is translated into Google's layout, which has
    // room for all of it: the listener nonce goes to the unused port_start / port_count.
    net::Handle inner;
    Status st = g_net->listen(dev, &inner, reinterpret_cast<net::ListenComm**>(listen_comm));
    if (!st.ok()) return fail(st, "listen");
    net::wire::HandleBlob blob;
    std::memcpy(&blob, inner.bytes.data(), sizeof(blob));
    if (blob.nsocks > gt::kMaxSockets) {
        (void)g_net->close_listen(static_cast<net::ListenComm*>(*listen_comm));
        *listen_comm = nullptr;
        FAKE_WARN("listen: %u data sockets per comm; the real plugin opens at most %d", blob.nsocks,
                  gt::kMaxSockets);
        return tcpx_ncclInvalidUsage;
    }
    if (blob.family == AF_INET) {
        h.connect_addr.sin.sin_family = AF_INET;
        std::memcpy(&h.connect_addr.sin.sin_addr, blob.addr, 4);
        h.connect_addr.sin.sin_port = htons(blob.port);
    } else {
        h.connect_addr.sin6.sin6_family = AF_INET6;
        std::memcpy(&h.connect_addr.sin6.sin6_addr, blob.addr, 16);
        h.connect_addr.sin6.sin6_scope_id = blob.scope_id;
        h.connect_addr.sin6.sin6_port = htons(blob.port);
    }
    h.ctrl_addr = h.connect_addr;
    std::memcpy(&h.port_start, &blob.listen_nonce, 4);
    std::memcpy(&h.port_count, reinterpret_cast<const uint8_t*>(&blob.listen_nonce) + 4, 4);
    h.num_socks = blob.nsocks;
    put_handle(h, handle);
    remember_listen_gpu(*listen_comm);
    return tcpx_ncclSuccess;
}

NoWireListen* as_no_wire_listen(void* listen_comm) {
    std::lock_guard<std::mutex> lock(g_mu);
    for (auto& [id, l] : g_listens) {
        if (l == listen_comm) return l;
    }
    return nullptr;
}

// connect()'s progress, pointed to by the handle's connect_args between calls.
struct ConnectArgs {
    uint32_t magic = kConnectMagic;
    bool no_wire = false;
    uint64_t listen_id = 0;
    net::Handle inner;  // the socket transport's handle, with its own connect progress
};

// The socket transport's handle that a wire listener's Google-layout handle stands for.
bool socket_handle_of(const gt::Handle& h, net::Handle* out) {
    net::wire::HandleBlob blob{};
    blob.magic = net::wire::kHandleMagic;
    blob.version = net::wire::kVersion;
    if (h.connect_addr.sa.sa_family == AF_INET) {
        blob.family = AF_INET;
        std::memcpy(blob.addr, &h.connect_addr.sin.sin_addr, 4);
        blob.port = ntohs(h.connect_addr.sin.sin_port);
    } else if (h.connect_addr.sa.sa_family == AF_INET6) {
        blob.family = AF_INET6;
        std::memcpy(blob.addr, &h.connect_addr.sin6.sin6_addr, 16);
        blob.scope_id = h.connect_addr.sin6.sin6_scope_id;
        blob.port = ntohs(h.connect_addr.sin6.sin6_port);
    } else {
        return false;
    }
    blob.nsocks = static_cast<uint16_t>(h.num_socks);
    std::memcpy(&blob.listen_nonce, &h.port_start, 4);
    std::memcpy(reinterpret_cast<uint8_t*>(&blob.listen_nonce) + 4, &h.port_count, 4);
    blob.connect_key = 0;
    out->bytes.fill(0);
    std::memcpy(out->bytes.data(), &blob, sizeof(blob));
    return true;
}

tcpx_ncclResult_t fake_connect(int dev, void* handle, void** send_comm,
                               tcpx_ncclNetDeviceHandle_v7_t** /*send_dev_comm*/) {
    *send_comm = nullptr;
    auto* h = static_cast<gt::Handle*>(handle);
    // Like the real plugin (whose connect runs in a thread), the first call only starts: it
    // allocates its state and leaves a pointer to it in the caller's handle, and a later call
    // with the same handle follows that pointer, unchecked, as the real one does.
    if (h->connect_args == nullptr) {
        auto args = std::make_unique<ConnectArgs>();
        uint64_t mark = 0;
        std::memcpy(&mark, &h->port_start, 4);
        std::memcpy(reinterpret_cast<uint8_t*>(&mark) + 4, &h->port_count, 4);
        if (mark == kNoWireMark) {
            args->no_wire = true;
            args->listen_id = h->connect_addr.sa.sa_family == AF_INET6
                                  ? ntohs(h->connect_addr.sin6.sin6_port)
                                  : ntohs(h->connect_addr.sin.sin_port);
        } else if (!socket_handle_of(*h, &args->inner)) {
            return fail("connect: the handle's address family is neither IPv4 nor IPv6");
        }
        h->connect_args = args.release();
        return tcpx_ncclSuccess;
    }
    auto* args = static_cast<ConnectArgs*>(h->connect_args);
    if (args->magic != kConnectMagic) return fail("connect: connect_args is not ours");
    auto finish = [&] {
        args->magic = 0;
        delete args;
        h->connect_args = nullptr;
    };
    if (args->no_wire) {
        std::lock_guard<std::mutex> lock(g_mu);
        auto it = g_listens.find(args->listen_id);
        if (it == g_listens.end()) {
            finish();
            return fail("connect: no such no-wire listener in this process");
        }
        auto* comm = new FakeComm;
        comm->gpu = current_gpu();
        comm->link = std::make_shared<Link>();
        it->second->pending.push_back(comm->link);
        *send_comm = comm;
        finish();
        return tcpx_ncclSuccess;
    }
    net::SendComm* inner = nullptr;
    Status st = g_net->connect(dev, &args->inner, &inner, nullptr);
    if (!st.ok()) {
        finish();
        return fail(st, "connect");
    }
    if (inner == nullptr) return tcpx_ncclSuccess;
    auto* comm = new FakeComm;
    comm->gpu = current_gpu();
    comm->send_comm = inner;
    *send_comm = comm;
    finish();
    return tcpx_ncclSuccess;
}

// Listeners with an accept in progress. The real plugin's first accept() starts a thread that
// uses the listen comm until a connection is accepted or fails, and returns null; closeListen
// frees the listen comm under it. The emulation's first accept() only starts likewise, and its
// closeListen refuses a listener whose accept has not ended. A listen comm whose accept never
// ends is never closed (the engine cannot close it safely): the real plugin's thread holds it
// until the process ends, and so does this set, which is never destroyed (LeakSanitizer, run
// after static destructors, sees the comm still held, as it is).
std::mutex g_accept_mu;
std::unordered_set<void*>& g_accepting = *new std::unordered_set<void*>;

tcpx_ncclResult_t close_comm(void* c);
tcpx_ncclResult_t accept_now(void* listen_comm, void** recv_comm,
                             tcpx_ncclNetDeviceHandle_v7_t** recv_dev_comm);

bool start_accept(void* listen_comm) {
    std::lock_guard<std::mutex> lock(g_accept_mu);
    return g_accepting.insert(listen_comm).second;
}

void end_accept(void* listen_comm) {
    std::lock_guard<std::mutex> lock(g_accept_mu);
    g_accepting.erase(listen_comm);
}

bool accepting(void* listen_comm) {
    std::lock_guard<std::mutex> lock(g_accept_mu);
    return g_accepting.count(listen_comm) != 0;
}

tcpx_ncclResult_t fake_accept(void* listen_comm, void** recv_comm,
                              tcpx_ncclNetDeviceHandle_v7_t** recv_dev_comm) {
    *recv_comm = nullptr;
    if (recv_dev_comm == nullptr || *recv_dev_comm == nullptr) {
        return fail(
            "accept without a device-handle pointer (the real plugin crashes on the first "
            "receive)");
    }
    const int gpu = current_gpu();
    if (gpu >= 0) {
        std::lock_guard<std::mutex> lock(g_mu);
        auto it = g_listen_gpu.find(listen_comm);
        if (it != g_listen_gpu.end() && it->second != gpu) {
            FAKE_WARN(
                "accept with GPU %d current on a listen made with GPU %d current: the real "
                "plugin's flow steering would name one GPU and its bounce buffer sit on the other",
                gpu, it->second);
            return tcpx_ncclInvalidUsage;
        }
    }
    if (start_accept(listen_comm)) return tcpx_ncclSuccess;  // the "thread" starts
    tcpx_ncclResult_t rc = accept_now(listen_comm, recv_comm, recv_dev_comm);
    if (rc != tcpx_ncclSuccess || *recv_comm != nullptr) end_accept(listen_comm);
    return rc;
}

tcpx_ncclResult_t accept_now(void* listen_comm, void** recv_comm,
                             tcpx_ncclNetDeviceHandle_v7_t** recv_dev_comm) {
    std::shared_ptr<Link> link;
    net::RecvComm* inner = nullptr;
    if (NoWireListen* l = as_no_wire_listen(listen_comm)) {
        std::lock_guard<std::mutex> lock(g_mu);
        if (l->pending.empty()) return tcpx_ncclSuccess;
        link = l->pending.front();
        l->pending.pop_front();
    } else {
        Status st = g_net->accept(static_cast<net::ListenComm*>(listen_comm), &inner, nullptr);
        if (!st.ok()) return fail(st, "accept");
        if (inner == nullptr) return tcpx_ncclSuccess;
    }
    auto comm = std::make_unique<FakeComm>();
    comm->recv = true;
    comm->recv_comm = inner;
    comm->gpu = current_gpu();
    comm->link = std::move(link);
    comm->unpack = make_unpack();
    if (const char* m = std::getenv("FAKETCPX_MISBEHAVE")) comm->misbehave = m;
    if (const char* k = std::getenv("FAKETCPX_LINEAR"))
        comm->linear = std::strtoull(k, nullptr, 10);
    if (!comm->unpack) {
        if (inner != nullptr) (void)g_net->close_recv(inner);
        return fail("accept: allocating the bounce buffer and unpack queue");
    }
    void* handle = comm->unpack->handle;
    if (comm->misbehave == "handle") {
        // The device handle in host memory CUDA does not know (a copy from it crashes).
        static uint64_t host_handle[8] = {};
        handle = host_handle;
    } else if (comm->misbehave == "bounce") {
        // The unpack handle names a bounce buffer in host memory (the kernel would fault).
        static uint8_t host_bounce[4096];
        const cu::UnpackHandle h{comm->unpack->meta_dev, host_bounce, ~uint64_t{0}};
        if (!mem_copy(comm->unpack->handle, &h, sizeof(h))) return fail("accept: misbehaving");
    }
    **recv_dev_comm = tcpx_ncclNetDeviceHandle_v7_t{TCPX_NCCL_NET_DEVICE_UNPACK, cu::kUnpackVersion,
                                                    handle, sizeof(cu::UnpackHandle), 0};
    *recv_comm = comm.release();
    // (accepts run on every endpoint's progress thread)
    static std::atomic<void*> last_accepted{nullptr};
    void* const before = last_accepted.load();
    if (const char* v = std::getenv("FAKETCPX_SAME_COMM");
        v != nullptr && v[0] == '1' && before != nullptr) {
        // The comm accepted before, handed out again (this one closed).
        (void)close_comm(*recv_comm);
        *recv_comm = before;
        return tcpx_ncclSuccess;
    }
    last_accepted.store(*recv_comm);
    if (const char* f = std::getenv("FAKETCPX_ACCEPT_FAILS"); f != nullptr && f[0] == '1') {
        return fail("accept: setting up the device handle (FAKETCPX_ACCEPT_FAILS)");
    }
    return tcpx_ncclSuccess;
}

tcpx_ncclResult_t fake_reg_mr(void* comm, void* data, int size, int type, void** mhandle) {
    if (as_comm(comm) == nullptr || size < 0) return tcpx_ncclInternalError;
    if (type == TCPX_NCCL_PTR_CUDA && reinterpret_cast<uintptr_t>(data) % 4096 != 0) {
        FAKE_WARN("regMr: CUDA pointer %p is not 4 KiB-aligned", data);
        return tcpx_ncclInternalError;
    }
    if (type != TCPX_NCCL_PTR_HOST && type != TCPX_NCCL_PTR_CUDA) return tcpx_ncclInternalError;
    if (type == TCPX_NCCL_PTR_CUDA && as_comm(comm)->recv && as_comm(comm)->gpu >= 0) {
        const int gpu = gpu_of(data);
        if (gpu >= 0 && gpu != as_comm(comm)->gpu) {
            FAKE_WARN(
                "regMr: CUDA memory %p of GPU %d on a receive comm accepted with GPU %d current "
                "(its bounce buffer is there)",
                data, gpu, as_comm(comm)->gpu);
            return tcpx_ncclInvalidUsage;
        }
    }
    if (type == TCPX_NCCL_PTR_CUDA) {
        // The real plugin takes the memory's GPU from the caller's current one (cudaGetDevice)
        // and exports the memory through it.
        const int gpu = gpu_of(data);
        const int current = current_gpu();
        if (gpu >= 0 && current >= 0 && gpu != current) {
            FAKE_WARN("regMr: CUDA memory %p of GPU %d registered with GPU %d current", data, gpu,
                      current);
            return tcpx_ncclInvalidUsage;
        }
    }
    auto* mr = new FakeMr;
    mr->comm = as_comm(comm);
    mr->type = type;
    if (type == TCPX_NCCL_PTR_CUDA) {
        ++g_cuda_regs_made;
        const int open = ++g_open_cuda_mrs;
        int peak = g_peak_cuda_mrs.load();
        while (open > peak && !g_peak_cuda_mrs.compare_exchange_weak(peak, open)) {
        }
        if (const char* v = std::getenv("FAKETCPX_MR_FD"); v != nullptr && v[0] == '1') {
            mr->fd = ::eventfd(0, EFD_CLOEXEC);
            if (mr->fd < 0) {
                const int err = errno;
                delete mr;
                FAKE_WARN("regMr: no descriptor for the registration: %s", std::strerror(err));
                return tcpx_ncclSystemError;
            }
        }
    }
    mr->base = reinterpret_cast<uintptr_t>(data);
    mr->size = static_cast<size_t>(size);
    {
        std::lock_guard<std::mutex> lock(mr->comm->mu);
        mr->comm->mrs.insert(mr);
    }
    *mhandle = mr;
    return tcpx_ncclSuccess;
}

tcpx_ncclResult_t fake_dereg_mr(void* /*comm*/, void* mhandle) {
    if (!valid_mr(mhandle)) return tcpx_ncclInternalError;
    auto* mr = static_cast<FakeMr*>(mhandle);
    if (mr->users.load() > 0) {
        ++g_busy_deregs;
        FAKE_WARN("deregMr of a registration %d requests posted with are not done",
                  mr->users.load());
        return tcpx_ncclInternalError;
    }
    if (mr->comm != nullptr) {
        std::lock_guard<std::mutex> lock(mr->comm->mu);
        mr->comm->mrs.erase(mr);
    } else {
        std::lock_guard<std::mutex> lock(g_orphan_mu);
        g_orphan_mrs.erase(mr);
    }
    mr->magic = 0;
    delete mr;
    return tcpx_ncclSuccess;
}

tcpx_ncclResult_t fake_isend(void* send_comm, void* data, int size, int tag, void* mhandle,
                             void** request) {
    *request = nullptr;
    FakeComm* comm = as_comm(send_comm);
    if (comm == nullptr || comm->recv || size < 0) return tcpx_ncclInternalError;
    if (!valid_mr(mhandle)) return fail("isend without a memory handle (the real plugin crashes)");
    if (const char* v = std::getenv("FAKETCPX_FULL_SENDS"); v != nullptr && v[0] == '1') {
        return tcpx_ncclSuccess;  // "full", for ever
    }
    if (!mr_holds(mhandle, data, static_cast<size_t>(size))) {
        return fail("isend of a buffer outside its memory handle's registration");
    }
    std::unique_lock<std::mutex> lock(comm->mu);
    if (comm->queue.size() >= kMaxRequests) return tcpx_ncclSuccess;  // full: try later
    auto r = std::make_unique<FakeReq>();
    r->comm = comm;
    r->cuda = is_cuda_mr(mhandle);
    r->mr = static_cast<FakeMr*>(mhandle);
    r->data = data;
    r->size = static_cast<size_t>(size);
    r->g.comm = comm;
    r->g.data = data;
    r->g.size = size;
    if (comm->link) return post_in_process(comm, std::move(r), std::move(lock), request);
    const void* from = data;
    if (r->cuda && g_cuda) {
        // The real plugin sends from GPU memory (MSG_ZEROCOPY over dma-buf); through the
        // socket transport that means a host copy.
        r->staging.resize(r->size);
        if (!mem_copy(r->staging.data(), data, r->size)) return fail("isend: copying GPU memory");
        from = r->staging.data();
    }
    Status st =
        g_net->isend(comm->send_comm, const_cast<void*>(from), r->size, tag, nullptr, &r->inner);
    if (!st.ok()) return fail(st, "isend");
    if (r->inner == nullptr) return tcpx_ncclSuccess;
    *request = r.get();
    use_mr(r.get());
    comm->queue.push_back(r.release());
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
        return fail("irecv without a memory handle (the real plugin crashes)");
    }
    if (sizes[0] < 0) return tcpx_ncclInternalError;
    if (!mr_holds(mhandles[0], data[0], static_cast<size_t>(sizes[0]))) {
        return fail("irecv into a buffer outside its memory handle's registration");
    }
    auto r = std::make_unique<FakeReq>();
    r->comm = comm;
    r->recv = true;
    r->cuda = is_cuda_mr(mhandles[0]);
    r->mr = static_cast<FakeMr*>(mhandles[0]);
    r->data = data[0];
    r->size = static_cast<size_t>(sizes[0]);
    r->g.comm = comm;
    r->g.data = data[0];
    r->g.size = sizes[0];
    if (r->cuda && r->size > kMaxCudaRecv) {
        FAKE_WARN("irecv of %zu bytes into CUDA memory: at most 4 MiB per receive", r->size);
        return tcpx_ncclInternalError;
    }
    std::unique_lock<std::mutex> lock(comm->mu);
    // Every receive holds a place in the comm's queue until irecvConsumed(): 16 per comm.
    if (comm->queue.size() >= kMaxRequests) return tcpx_ncclSuccess;
    FAKE_TRACE("irecv %p: %zu bytes%s", static_cast<void*>(r.get()), r->size,
               r->cuda ? ", cuda" : "");
    if (r->cuda) {
        UnpackState* u = comm->unpack.get();
        auto& slot = r->g.unpack_slot;
        slot.active = true;
        slot.idx = static_cast<uint64_t>(u->next_slot);
        slot.mem = u->meta->mem[u->next_slot];
        slot.cnt = &u->meta->cnt[u->next_slot];
        *slot.cnt = kGarbageCount;  // written by test() when the receive is done
        u->next_slot = (u->next_slot + 1) % cu::kUnpackQueueDepth;
    }
    if (comm->link) return post_in_process(comm, std::move(r), std::move(lock), request);
    void* into = r->data;
    if (r->cuda) {  // into host memory first, then scattered over bounce pages
        r->staging.resize(r->size);
        into = r->staging.data();
    }
    size_t size = r->size;
    Status st = g_net->irecv(comm->recv_comm, 1, &into, &size, tags, nullptr, &r->inner);
    if (!st.ok()) return fail(st, "irecv");
    if (r->inner == nullptr) {
        if (r->cuda) {  // not taken after all
            auto* u = comm->unpack.get();
            u->next_slot = (u->next_slot + cu::kUnpackQueueDepth - 1) % cu::kUnpackQueueDepth;
        }
        return tcpx_ncclSuccess;
    }
    *request = r.get();
    use_mr(r.get());
    comm->queue.push_back(r.release());
    return tcpx_ncclSuccess;
}

tcpx_ncclResult_t fake_iflush(void*, int, void**, int*, void**, void** request) {
    if (request != nullptr) *request = nullptr;
    return fail("iflush called: the real plugin's iflush reads its request argument as input");
}

// Wire mode: whether the socket transport finished the request; lands a CUDA receive's bytes.
tcpx_ncclResult_t progress_wire(FakeReq* r) {
    if (r->inner != nullptr) {
        bool finished = false;
        size_t got = 0;
        Status st = g_net->test(r->inner, &finished, &got);
        if (!st.ok()) return fail(st, "test");
        if (!finished) return tcpx_ncclSuccess;
        r->inner = nullptr;
        r->received = got;
        if (!r->recv || !r->cuda) {
            r->landed = true;
            return tcpx_ncclSuccess;
        }
    }
    if (r->recv && r->cuda && !r->landed && !r->scattering) {
        bool error = false;
        if (!land(r, r->staging.data(), false, r->received, nullptr, &error) && error) {
            return fail("test: landing a receive in the bounce buffer");
        }
    }
    return tcpx_ncclSuccess;
}

// Read on every host receive, so a test can turn it on after others ran in the process.
bool warn_host_recv() {
    const char* v = std::getenv("FAKETCPX_WARN_HOST_RECV");
    return v != nullptr && std::strcmp(v, "1") == 0;
}

// FAKETCPX_MISBEHAVE: breaks the description of a completed CUDA receive `r`.
void misbehave(const std::string& how, FakeReq* r) {
    auto& slot = r->g.unpack_slot;
    if (how == "slot") {
        slot.idx += cu::kUnpackQueueDepth;
    } else if (how == "count") {
        *slot.cnt = cu::kUnpackMaxEntries + 1;
    } else if (how == "dst") {
        static_cast<cu::LoadMeta*>(slot.mem)[0].dst_off = r->size + (uint64_t{1} << 32);
    } else if (how == "src" && *slot.cnt > 0) {
        static_cast<cu::LoadMeta*>(slot.mem)[0].src_off = 0xfffff000u;  // past any pool here
    } else if (how == "cross") {
        auto* m = static_cast<cu::LoadMeta*>(slot.mem);
        for (uint64_t i = 0; i < *slot.cnt; ++i) {
            if (m[i].len < 2) continue;
            m[i].src_off = (m[i].src_off & ~(kPage - 1)) + kPage - 1;  // on into the next page
            break;
        }
    } else if (how == "elsewhere") {
        // (one copy per request, freed with it; its entries valid, its place not the queue's)
        const uint64_t n = *slot.cnt;
        r->elsewhere.resize((n + 1) * sizeof(cu::LoadMeta));
        std::memcpy(r->elsewhere.data(), slot.mem, n * sizeof(cu::LoadMeta));
        auto* cnt = reinterpret_cast<uint64_t*>(r->elsewhere.data() + n * sizeof(cu::LoadMeta));
        *cnt = n;
        slot.mem = r->elsewhere.data();
        slot.cnt = cnt;
    } else if (how == "otherqueue") {
        // The comm's first receive as it is; every later one whole, in the same slot of another
        // queue (as a plugin that described receives in a queue its handle does not name).
        FakeComm* comm = r->comm;
        if (comm->cuda_recvs_reported++ == 0) return;
        if (!comm->other_meta) comm->other_meta = std::make_unique<cu::UnpackMeta>();
        const uint64_t n = *slot.cnt;
        std::memcpy(comm->other_meta->mem[slot.idx], slot.mem, n * sizeof(cu::LoadMeta));
        comm->other_meta->cnt[slot.idx] = n;
        slot.mem = comm->other_meta->mem[slot.idx];
        slot.cnt = &comm->other_meta->cnt[slot.idx];
    } else if (how == "overlap" && *slot.cnt > 1) {
        auto* m = static_cast<cu::LoadMeta*>(slot.mem);
        m[1].dst_off = m[0].dst_off;  // the lengths still add up; a gap is left
    }
}

tcpx_ncclResult_t test_request(FakeReq* r, int* done);

tcpx_ncclResult_t fake_test(void* request, int* done, int* /*sizes: never written*/) {
    *done = 0;
    auto* r = static_cast<FakeReq*>(request);
    if (r == nullptr || r->magic != kReqMagic) return tcpx_ncclInternalError;
    const tcpx_ncclResult_t res = test_request(r, done);
    // A request whose test failed is over for its caller (its comm is broken): its
    // registration may go.
    if (res != tcpx_ncclSuccess) done_with_mr(r);
    return res;
}

tcpx_ncclResult_t test_request(FakeReq* r, int* done) {
    FakeComm* comm = r->comm;
    if (comm->link) {
        std::lock_guard<std::mutex> link_lock(comm->link->mu);
        if (!match(comm->link.get())) return fail("test: delivering in-process");
        if (!r->landed && !r->scattering && (comm->link->send_closed || comm->link->recv_closed)) {
            return fail("test: the other end of the in-process connection was closed");
        }
    }
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
    if (!comm->link) {
        tcpx_ncclResult_t res = progress_wire(r);
        if (res != tcpx_ncclSuccess) return res;
    }
    bool error = false;
    if (!settle(r, &error)) return error ? fail("test: landing the bytes") : tcpx_ncclSuccess;
    *done = 1;
    FAKE_TRACE("test done %p (%s)", static_cast<void*>(r), r->recv ? "recv" : "send");
    if (r->recv && !r->cuda && warn_host_recv()) {
        FAKE_WARN("host receive %p of %zu bytes completed", static_cast<void*>(r), r->size);
    }
    r->done = true;
    done_with_mr(r);
    if (r->recv && r->cuda) {
        *r->g.unpack_slot.cnt = r->entries;
        misbehave(comm->misbehave, r);
    }
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
        return fail("irecvConsumed out of order or before test reported the receive");
    }
    comm->queue.pop_front();
    FAKE_TRACE("consumed %p", static_cast<void*>(r));
    if (r->g.unpack_slot.active) {
        // The pages go back to the pool, and whatever still reads them or the slot gets garbage.
        UnpackState* u = comm->unpack.get();
        poison_pages(u, r->pages);
        u->free_pages.insert(u->free_pages.end(), r->pages.begin(), r->pages.end());
        *r->g.unpack_slot.cnt = kGarbageCount;
    }
    r->magic = 0;
    delete r;
    return tcpx_ncclSuccess;
}

tcpx_ncclResult_t close_comm(void* c) {
    FakeComm* comm = as_comm(c);
    if (comm == nullptr) return tcpx_ncclInternalError;
    Status st;
    if (comm->link) {
        std::lock_guard<std::mutex> link_lock(comm->link->mu);
        auto& mine = comm->recv ? comm->link->recvs : comm->link->sends;
        mine.clear();
        (comm->recv ? comm->link->recv_closed : comm->link->send_closed) = true;
    } else {
        st = comm->recv ? g_net->close_recv(comm->recv_comm) : g_net->close_send(comm->send_comm);
    }
    for (FakeReq* r : comm->queue) {
        done_with_mr(r);
        delete r;
    }
    {
        std::lock_guard<std::mutex> lock(g_orphan_mu);
        for (FakeMr* mr : comm->mrs) {
            mr->comm = nullptr;
            g_orphan_mrs.insert(mr);
        }
    }
    free_unpack(comm->unpack.get());
    comm->magic = 0;
    delete comm;
    return st.ok() ? tcpx_ncclSuccess : tcpx_ncclInternalError;
}

tcpx_ncclResult_t fake_close_listen(void* listen_comm) {
    if (accepting(listen_comm)) {
        // The real plugin frees the listen comm its accept thread is using.
        return fail("closeListen while an accept is in progress on the listener");
    }
    {
        std::lock_guard<std::mutex> lock(g_mu);
        g_listen_gpu.erase(listen_comm);
    }
    if (NoWireListen* l = as_no_wire_listen(listen_comm)) {
        std::lock_guard<std::mutex> lock(g_mu);
        g_listens.erase(l->id);
        delete l;
        return tcpx_ncclSuccess;
    }
    return g_net->close_listen(static_cast<net::ListenComm*>(listen_comm)).ok()
               ? tcpx_ncclSuccess
               : tcpx_ncclInternalError;
}

tcpx_ncclResult_t fake_get_device_mr(void*, void*, void** dptr) {
    if (dptr != nullptr) *dptr = nullptr;
    return tcpx_ncclSuccess;
}

// FAKETCPX_THROW=<call> (regMr or closeSend): that call lets a C++ exception out (a C++ plugin
// with a bug), after doing its work (a closeSend's comm is closed).
void throw_if(const char* call) {
    const char* v = std::getenv("FAKETCPX_THROW");
    if (v != nullptr && std::strcmp(v, call) == 0) throw std::runtime_error(call);
}

tcpx_ncclResult_t throwing_reg_mr(void* comm, void* data, int size, int type, void** mhandle) {
    throw_if("regMr");
    return fake_reg_mr(comm, data, size, type, mhandle);
}

tcpx_ncclResult_t throwing_close_send(void* comm) {
    const tcpx_ncclResult_t rc = close_comm(comm);
    throw_if("closeSend");
    return rc;
}

}  // namespace

extern "C" __attribute__((visibility("default"))) int faketcpx_open_comms() {
    return g_open_comms.load();
}

extern "C" __attribute__((visibility("default"))) int faketcpx_open_mrs() {
    return g_open_mrs.load();
}

extern "C" __attribute__((visibility("default"))) int faketcpx_open_cuda_mrs() {
    return g_open_cuda_mrs.load();
}

extern "C" __attribute__((visibility("default"))) int faketcpx_peak_cuda_mrs() {
    return g_peak_cuda_mrs.load();
}

extern "C" __attribute__((visibility("default"))) void faketcpx_reset_peak_cuda_mrs() {
    g_peak_cuda_mrs.store(g_open_cuda_mrs.load());
}

extern "C" __attribute__((visibility("default"))) int faketcpx_cuda_regs_made() {
    return g_cuda_regs_made.load();
}

extern "C" __attribute__((visibility("default"))) int faketcpx_busy_deregs() {
    return g_busy_deregs.load();
}

extern "C" __attribute__((visibility("default"))) const tcpx_ncclNet_v7_t ncclNetPlugin_v7 = {
    "GPUDirectTCPX_v7_emulated",
    fake_init,
    fake_devices,
    fake_get_properties,
    fake_listen,
    fake_connect,
    fake_accept,
    throwing_reg_mr,
    nullptr,  // regMrDmaBuf, as the real plugin
    fake_dereg_mr,
    fake_isend,
    fake_irecv,
    fake_iflush,
    fake_test,
    throwing_close_send,
    close_comm,
    fake_close_listen,
    fake_get_device_mr,
    fake_irecv_consumed,
};
