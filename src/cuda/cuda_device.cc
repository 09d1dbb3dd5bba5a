// The device layer over the CUDA runtime.
#include <cuda.h>  // types only: the driver's two context calls come through the runtime
#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <mutex>
#include <utility>
#include <vector>

#include "common/status_util.h"
#include "common/strings.h"
#include "cuda/copy_segments.h"
#include "cuda/device.h"
#include "cuda/unpack.h"
#include "cuda/unpack_kernel.h"

namespace tcpx::cuda {
namespace {

Status cuda_status(cudaError_t err, const char* what) {
    if (err == cudaSuccess) return Status();
    cudaGetLastError();  // keep a non-sticky error from surfacing in a later call
    return Status(StatusCode::kCuda, strformat("%s: %s", what, cudaGetErrorString(err)));
}

// The driver's current-context calls, reached through the runtime (the build links the runtime
// only); null where the driver does not give them.
struct ContextCalls {
    CUresult (*get)(CUcontext*) = nullptr;
    CUresult (*set)(CUcontext) = nullptr;
};

const ContextCalls& context_calls() {
    static const ContextCalls calls = [] {
        ContextCalls c;
        void* get = nullptr;
        void* set = nullptr;
        cudaDriverEntryPointQueryResult q1{}, q2{};
        if (cudaGetDriverEntryPointByVersion("cuCtxGetCurrent", &get, 12000, cudaEnableDefault,
                                             &q1) == cudaSuccess &&
            cudaGetDriverEntryPointByVersion("cuCtxSetCurrent", &set, 12000, cudaEnableDefault,
                                             &q2) == cudaSuccess &&
            q1 == cudaDriverEntryPointSuccess && q2 == cudaDriverEntryPointSuccess) {
            c.get = reinterpret_cast<CUresult (*)(CUcontext*)>(get);
            c.set = reinterpret_cast<CUresult (*)(CUcontext)>(set);
        }
        cudaGetLastError();
        return c;
    }();
    return calls;
}

// The driver's cuMemGetAddressRange (the allocation a device pointer lies in), or null where the
// driver does not give it.
using AddressRangeCall = CUresult (*)(CUdeviceptr*, size_t*, CUdeviceptr);
AddressRangeCall address_range_call() {
    static const AddressRangeCall call = [] {
        void* fn = nullptr;
        cudaDriverEntryPointQueryResult q{};
        AddressRangeCall c = nullptr;
        if (cudaGetDriverEntryPointByVersion("cuMemGetAddressRange", &fn, 12000, cudaEnableDefault,
                                             &q) == cudaSuccess &&
            q == cudaDriverEntryPointSuccess) {
            c = reinterpret_cast<AddressRangeCall>(fn);
        }
        cudaGetLastError();
        return c;
    }();
    return call;
}

// What is current in the calling thread, for put_back(): its context (exactly, one the
// application made itself included), or without the driver's calls the runtime's device + 1; 0
// where nothing is.
uintptr_t what_is_current() {
    const ContextCalls& c = context_calls();
    if (c.get != nullptr) {
        CUcontext ctx = nullptr;
        return c.get(&ctx) == CUDA_SUCCESS ? reinterpret_cast<uintptr_t>(ctx) : 0;
    }
    int d = -1;
    if (cudaGetDevice(&d) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    return static_cast<uintptr_t>(d) + 1;
}

// Makes `device` current; `*previous` is what was current before where put_back() has anything
// to do, else 0 (nothing was current, or it already was this device's).
Status switch_to(int device, uintptr_t* previous) {
    const uintptr_t before = what_is_current();
    *previous = 0;
    TCPX_RETURN_IF_ERROR(cuda_status(cudaSetDevice(device), "cudaSetDevice"));
    if (before != 0 && what_is_current() != before) *previous = before;
    return Status();
}

void put_back(uintptr_t previous) {
    if (previous == 0) return;
    const ContextCalls& c = context_calls();
    if (c.set != nullptr) {
        c.set(reinterpret_cast<CUcontext>(previous));  // (a driver call: no runtime error)
    } else if (cudaSetDevice(static_cast<int>(previous - 1)) != cudaSuccess) {
        cudaGetLastError();  // ours: not to be left for the caller
    }
    // Nothing else cleared: an error the caller left pending is the caller's (gpu.md).
}

// The ring's calls run in the application's threads too (API calls make progress): each makes
// the ring's GPU current for its scope and puts back the caller's after (cuda::ScopedGpu's rule).
class OnGpu {
 public:
    explicit OnGpu(int device) : status_(switch_to(device, &previous_)) {}
    ~OnGpu() { put_back(previous_); }
    OnGpu(const OnGpu&) = delete;
    OnGpu& operator=(const OnGpu&) = delete;
    const Status& status() const { return status_; }

 private:
    uintptr_t previous_ = 0;
    Status status_;
};

// Slots on two streams: each slot's completion is an event recorded after its last work; a pinned
// staging buffer when slot_bytes > 0; a mapped flag per slot for unpacks the kernel found bad.
class CudaCopyRing final : public CopyRing {
 public:
    static StatusOr<std::unique_ptr<CopyRing>> create(int device, size_t slot_bytes, int slots,
                                                      int records) {
        if (slots < 1) return invalid_argument("copy ring: no slots");
        if (records < 1) records = slots;
        OnGpu on(device);
        TCPX_RETURN_IF_ERROR(on.status());
        // Streams and events first, pinned memory last: a failure then frees nothing that waits
        // for the device (cudaFreeHost and cudaFree wait for every kernel on it), which would
        // happen with the engine's lock held.
        Handles handles;
        TCPX_RETURN_IF_ERROR(handles.make(records));
        void* base = nullptr;
        if (slot_bytes > 0) {
            TCPX_RETURN_IF_ERROR(
                cuda_status(cudaHostAlloc(&base, slot_bytes * static_cast<size_t>(slots),
                                          cudaHostAllocPortable),
                            strformat("allocating %zu bytes of pinned staging memory",
                                      slot_bytes * static_cast<size_t>(slots))
                                .c_str()));
        }
        return std::unique_ptr<CopyRing>(new CudaCopyRing(
            device, slot_bytes, slots, records, static_cast<uint8_t*>(base), std::move(handles)));
    }

    ~CudaCopyRing() override {
        OnGpu on(device());
        for (cudaStream_t st : handles_.streams) {
            if (st != nullptr) cudaStreamSynchronize(st);
        }
        if (flags_ != nullptr) cudaFreeHost(flags_);
        if (host_copies_ != nullptr) cudaFreeHost(host_copies_);
        if (device_copies_ != nullptr) cudaFree(device_copies_);
        if (device_slots_raw_ != nullptr) cudaFree(device_slots_raw_);
        if (host_lists_ != nullptr) cudaFreeHost(host_lists_);
        if (device_lists_ != nullptr) cudaFree(device_lists_);
        if (base() != nullptr) cudaFreeHost(base());
    }

    Status copy_in(int i, const void* src, size_t len) override {
        OnGpu on(device());
        TCPX_RETURN_IF_ERROR(on.status());
        TCPX_RETURN_IF_ERROR(
            cuda_status(cudaMemcpyAsync(slot(i), src, len, cudaMemcpyDefault, stream(i)),
                        "staging a chunk out of GPU memory"));
        return record(i);
    }

    Status copy_out(int i, void* dst, size_t len) override {
        OnGpu on(device());
        TCPX_RETURN_IF_ERROR(on.status());
        TCPX_RETURN_IF_ERROR(
            cuda_status(cudaMemcpyAsync(dst, slot(i), len, cudaMemcpyDefault, stream(i)),
                        "staging a chunk into GPU memory"));
        return record(i);
    }

    Status unpack(int i, const LoadMeta* entries, uint64_t count, const uint8_t* bounce,
                  uint8_t* dst, uint64_t dst_len) override {
        if (count > static_cast<uint64_t>(kUnpackMaxEntries)) {
            return protocol_error(
                strformat("the transport described a receive in %llu pieces (at most %d)",
                          static_cast<unsigned long long>(count), kUnpackMaxEntries));
        }
        OnGpu on(device());
        TCPX_RETURN_IF_ERROR(on.status());
        TCPX_RETURN_IF_ERROR(ensure_lists());
        // The slot's previous work finished before it was given back: nothing reads its flag or
        // its list any more.
        flags_[i] = 0;
        SlotList* host = host_lists_ + i;
        SlotList* dev = device_lists_ + i;
        host->count = count;
        std::memcpy(host->entries, entries, count * sizeof(LoadMeta));
        TCPX_RETURN_IF_ERROR(cuda_status(
            cudaMemcpyAsync(dev, host, offsetof(SlotList, entries) + count * sizeof(LoadMeta),
                            cudaMemcpyHostToDevice, stream(i)),
            "copying an unpack list to the GPU"));
        const cudaError_t err = launch_unpack_kernel(dev->entries, &dev->count, bounce, dst,
                                                     dst_len, device_flags_ + i, stream(i), count);
        TCPX_RETURN_IF_ERROR(cuda_status(err, "launching the unpack kernel"));
        unpacked_[static_cast<size_t>(i)] = true;
        return record(i);
    }

    Status gather(int i, std::span<const Seg> segs, bool twin_only) override {
        return move_segments(i, segs, /*gather=*/true, twin_only);
    }

    Status scatter(int i, std::span<const Seg> segs, bool twin_only) override {
        return move_segments(i, segs, /*gather=*/false, twin_only);
    }

    StatusOr<CopyEntry*> copy_list(int i) override {
        OnGpu on(device());
        TCPX_RETURN_IF_ERROR(on.status());
        TCPX_RETURN_IF_ERROR(ensure_copy_lists());
        return host_copies_ + static_cast<size_t>(i) * copy_capacity();
    }

    Status run_copy_list(int i, size_t n, bool bad) override {
        OnGpu on(device());
        TCPX_RETURN_IF_ERROR(on.status());
        TCPX_RETURN_IF_ERROR(ensure_copy_lists());
        flags_[i] = bad ? 1 : 0;  // ready(i) reports it, as after the unpack kernel
        unpacked_[static_cast<size_t>(i)] = true;
        CopyEntry* host = host_copies_ + static_cast<size_t>(i) * copy_capacity();
        CopyEntry* dev = device_copies_ + static_cast<size_t>(i) * copy_capacity();
        TCPX_RETURN_IF_ERROR(cuda_status(
            cudaMemcpyAsync(dev, host, n * sizeof(CopyEntry), cudaMemcpyHostToDevice, stream(i)),
            "copying an unpack list to the GPU"));
        TCPX_RETURN_IF_ERROR(
            cuda_status(launch_copy_segments(dev, static_cast<uint32_t>(n), stream(i)),
                        "launching the unpack kernel"));
        return record(i);
    }

    StatusOr<uint8_t*> twin() override {
        OnGpu on(device());
        TCPX_RETURN_IF_ERROR(on.status());
        TCPX_RETURN_IF_ERROR(ensure_copy_lists());
        return device_slots_;
    }

    StatusOr<bool> ready(int i) override {
        const cudaError_t err = cudaEventQuery(handles_.events[static_cast<size_t>(i)]);
        if (err == cudaErrorNotReady) {
            cudaGetLastError();  // not an error; keep it from sticking
            return false;
        }
        TCPX_RETURN_IF_ERROR(cuda_status(err, "an asynchronous copy"));
        if (unpacked_[static_cast<size_t>(i)]) {
            unpacked_[static_cast<size_t>(i)] = false;
            if (flags_[i] != 0) {
                return protocol_error(
                    "the transport described a receive reaching outside its buffer (or with "
                    "more than 2048 pieces); those bytes were not copied");
            }
        }
        return true;
    }

    void synchronize() override {
        OnGpu on(device());
        for (cudaStream_t st : handles_.streams) cudaStreamSynchronize(st);
    }

    bool idle() override {
        OnGpu on(device());
        for (cudaStream_t st : handles_.streams) {
            if (st == nullptr) continue;
            if (cudaStreamQuery(st) == cudaErrorNotReady) {
                cudaGetLastError();  // not an error; keep it from sticking
                return false;
            }
            // (Any other answer: done, or failed for good; nothing more of it runs.)
        }
        return true;
    }

 private:
    // A ring's streams and events, destroyed with it (neither waits for the device).
    struct Handles {
        cudaStream_t streams[2] = {nullptr, nullptr};
        std::vector<cudaEvent_t> events;

        Handles() = default;
        Handles(Handles&& o) noexcept : events(std::move(o.events)) {
            for (int k = 0; k < 2; ++k) streams[k] = std::exchange(o.streams[k], nullptr);
            o.events.clear();
        }
        Handles& operator=(Handles&&) = delete;
        ~Handles() { destroy(); }

        Status make(int records) {
            for (cudaStream_t& st : streams) {
                TCPX_RETURN_IF_ERROR(cuda_status(
                    cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking), "cudaStreamCreate"));
            }
            events.assign(static_cast<size_t>(records), nullptr);
            for (cudaEvent_t& ev : events) {
                TCPX_RETURN_IF_ERROR(cuda_status(
                    cudaEventCreateWithFlags(&ev, cudaEventDisableTiming), "cudaEventCreate"));
            }
            return Status();
        }
        void destroy() {
            for (cudaEvent_t ev : events) {
                if (ev != nullptr) cudaEventDestroy(ev);
            }
            events.clear();
            for (cudaStream_t& st : streams) {
                if (st != nullptr) cudaStreamDestroy(st);
                st = nullptr;
            }
        }
    };

    CudaCopyRing(int device, size_t slot_bytes, int buffer_slots, int records, uint8_t* base,
                 Handles handles)
        : CopyRing(device, slot_bytes, buffer_slots, records, base),
          handles_(std::move(handles)),
          unpacked_(static_cast<size_t>(records), false) {}

    // The mapped flags the kernels report bad lists in, made on first use (a ring that stages
    // whole chunks never needs them); kept, like the lists below, when a later allocation fails.
    Status ensure_flags() {
        if (device_flags_ != nullptr) return Status();
        if (flags_ == nullptr) {
            void* flags = nullptr;
            TCPX_RETURN_IF_ERROR(
                cuda_status(cudaHostAlloc(&flags, sizeof(uint32_t) * static_cast<size_t>(slots()),
                                          cudaHostAllocMapped | cudaHostAllocPortable),
                            "allocating unpack flags"));
            flags_ = static_cast<uint32_t*>(flags);
        }
        void* dev = nullptr;
        TCPX_RETURN_IF_ERROR(
            cuda_status(cudaHostGetDevicePointer(&dev, flags_, 0), "cudaHostGetDevicePointer"));
        device_flags_ = static_cast<uint32_t*>(dev);
        return Status();
    }

    // One receive's list: the count, then its entries (16-byte aligned).
    struct SlotList {
        uint64_t count;
        uint64_t pad;
        LoadMeta entries[kUnpackMaxEntries];
    };

    // A list's pinned host half and its GPU half, `bytes` each, whichever is still missing.
    // What one call allocated stays when the other allocation fails: the next call makes only
    // what is missing, and the destructor frees it all. Freeing it here would wait for every
    // kernel on the GPU (cudaFree, cudaFreeHost), with the engine's lock held.
    template <class T>
    static Status ensure_list_pair(T** host, T** dev, size_t bytes, const char* what) {
        if (*host == nullptr) {
            void* h = nullptr;
            TCPX_RETURN_IF_ERROR(cuda_status(cudaHostAlloc(&h, bytes, cudaHostAllocDefault),
                                             strformat("allocating %s", what).c_str()));
            *host = static_cast<T*>(h);
        }
        if (*dev == nullptr) {
            void* d = nullptr;
            TCPX_RETURN_IF_ERROR(cuda_status(cudaMalloc(&d, bytes),
                                             strformat("allocating %s on the GPU", what).c_str()));
            *dev = static_cast<T*>(d);
        }
        return Status();
    }

    // Lists for unpacks, pinned on the host and on the GPU, made on first use (a staging ring
    // never needs them).
    Status ensure_lists() {
        TCPX_RETURN_IF_ERROR(ensure_flags());
        return ensure_list_pair(&host_lists_, &device_lists_,
                                sizeof(SlotList) * static_cast<size_t>(slots()), "unpack lists");
    }

    // GPU staging slots and copy lists for kernel gathers and scatters, made on first use.
    Status ensure_copy_lists() {
        if (device_slots_ != nullptr) return Status();
        TCPX_RETURN_IF_ERROR(ensure_flags());
        // (What was made stays for the next call when a later part fails: ensure_list_pair.)
        TCPX_RETURN_IF_ERROR(ensure_list_pair(
            &host_copies_, &device_copies_,
            copy_capacity() * sizeof(CopyEntry) * static_cast<size_t>(slots()), "gather lists"));
        // The twin starts on a 4 KiB page: transports register GPU memory by whole pages
        // (Google's TCPX refuses another start), and cudaMalloc aligns small blocks less.
        constexpr size_t kPage = 4096;
        void* slots_mem = nullptr;
        TCPX_RETURN_IF_ERROR(cuda_status(
            cudaMalloc(&slots_mem, twin_bytes() + kPage),
            strformat("allocating %zu bytes of GPU staging memory", twin_bytes()).c_str()));
        device_slots_raw_ = slots_mem;
        device_slots_ = reinterpret_cast<uint8_t*>(
            (reinterpret_cast<uintptr_t>(slots_mem) + kPage - 1) & ~uintptr_t{kPage - 1});
        return Status();
    }

    // Gather (segments -> slot i) or scatter (slot i -> segments). Several segments all on this
    // GPU go by one kernel between them and the slot's GPU twin, and one copy engine transfer
    // between the twin and the pinned slot; otherwise segment by segment.
    Status move_segments(int i, std::span<const Seg> segs, bool gather, bool twin_only) {
        uint64_t total = 0;
        bool all_here = segs.size() > 1 && segs.size() <= kMaxKernelSegs;
        for (const Seg& seg : segs) {
            if (seg.len > length(i) - total) {
                return internal_error("gather or scatter larger than a staging slot");
            }
            total += seg.len;
            all_here = all_here && seg.device == device();
        }
        OnGpu on(device());
        TCPX_RETURN_IF_ERROR(on.status());
        if (twin_only) TCPX_RETURN_IF_ERROR(ensure_copy_lists());
        // The staged side: the pinned buffer, or the GPU twin.
        uint8_t* pinned = twin_only ? device_slots_ + offset(i) : slot(i);
        if (!all_here) {
            uint64_t at = 0;
            for (const Seg& seg : segs) {
                if (seg.len == 0) continue;
                uint8_t* dst = gather ? pinned + at : seg.ptr;
                const uint8_t* src = gather ? seg.ptr : pinned + at;
                if (seg.device < 0 && !twin_only) {
                    std::memcpy(dst, src, seg.len);  // host memory: the slot is ours right now
                } else {
                    TCPX_RETURN_IF_ERROR(cuda_status(
                        cudaMemcpyAsync(dst, src, seg.len, cudaMemcpyDefault, stream(i)),
                        gather ? "gathering a chunk out of GPU memory"
                               : "scattering a chunk into GPU memory"));
                }
                at += seg.len;
            }
            return record(i);
        }
        TCPX_RETURN_IF_ERROR(ensure_copy_lists());
        uint8_t* twin = device_slots_ + offset(i);
        // The slot's previous work finished before it was given back: its list is free.
        CopyEntry* host = host_copies_ + static_cast<size_t>(i) * copy_capacity();
        CopyEntry* dev = device_copies_ + static_cast<size_t>(i) * copy_capacity();
        uint32_t n = 0;
        uint64_t at = 0;
        for (const Seg& seg : segs) {
            for (uint64_t done = 0; done < seg.len; done += kCopyTile) {
                const uint64_t len = std::min<uint64_t>(kCopyTile, seg.len - done);
                const uint64_t piece = reinterpret_cast<uint64_t>(seg.ptr + done);
                const uint64_t staged = reinterpret_cast<uint64_t>(twin + at + done);
                host[n++] = CopyEntry{gather ? piece : staged, gather ? staged : piece, len, 0};
            }
            at += seg.len;
        }
        TCPX_RETURN_IF_ERROR(cuda_status(
            cudaMemcpyAsync(dev, host, n * sizeof(CopyEntry), cudaMemcpyHostToDevice, stream(i)),
            "copying a gather list to the GPU"));
        if (!gather && !twin_only) {
            TCPX_RETURN_IF_ERROR(
                cuda_status(cudaMemcpyAsync(twin, pinned, total, cudaMemcpyHostToDevice, stream(i)),
                            "staging a chunk into GPU memory"));
        }
        TCPX_RETURN_IF_ERROR(
            cuda_status(launch_copy_segments(dev, n, stream(i)),
                        gather ? "launching the gather kernel" : "launching the scatter kernel"));
        if (gather && !twin_only) {
            TCPX_RETURN_IF_ERROR(
                cuda_status(cudaMemcpyAsync(pinned, twin, total, cudaMemcpyDeviceToHost, stream(i)),
                            "staging a chunk out of GPU memory"));
        }
        return record(i);
    }

    Status record(int i) {
        return cuda_status(cudaEventRecord(handles_.events[static_cast<size_t>(i)], stream(i)),
                           "cudaEventRecord");
    }

    // Slots alternate between two streams, so that one slot's copies (and kernels) overlap the
    // next one's: a chunk's work on one stream runs in order, consecutive chunks need not.
    Handles handles_;
    cudaStream_t stream(int i) const { return handles_.streams[i & 1]; }
    std::vector<bool> unpacked_;  // slot i's last work was an unpack (check its flag)
    uint32_t* flags_ = nullptr;   // host view
    uint32_t* device_flags_ = nullptr;
    SlotList* host_lists_ = nullptr;
    SlotList* device_lists_ = nullptr;
    CopyEntry* host_copies_ = nullptr;  // per slot, copy_capacity() entries
    CopyEntry* device_copies_ = nullptr;
    uint8_t* device_slots_ = nullptr;   // each slot's GPU twin, for kernel gathers and scatters
    void* device_slots_raw_ = nullptr;  // as allocated (device_slots_ is page-aligned in it)
};

class CudaDevice final : public Device {
 public:
    int count() override {
        std::call_once(once_, [this] {
            int n = 0;
            if (cudaGetDeviceCount(&n) != cudaSuccess) {
                cudaGetLastError();  // no driver or no device: not an error for host memory
                n = 0;
            }
            count_ = n;
        });
        return count_;
    }

    StatusOr<PointerInfo> classify(const void* ptr, size_t len) override {
        PointerInfo info;
        if (ptr == nullptr || count() == 0) return info;
        cudaPointerAttributes attr{};
        // Host memory CUDA does not know is cudaMemoryTypeUnregistered, not an error.
        TCPX_RETURN_IF_ERROR(cuda_status(
            cudaPointerGetAttributes(&attr, ptr),
            strformat("cannot tell whether %p is GPU memory (cudaPointerGetAttributes)", ptr)
                .c_str()));
        if (attr.type != cudaMemoryTypeDevice) return info;
        info.kind = MemKind::kCuda;
        info.device = attr.device;
        // The whole range mapped on that GPU: the kernels and copies the engine runs on it would
        // otherwise touch whatever lies past the allocation (or fault, killing the context).
        TCPX_RETURN_IF_ERROR(check_mapped(ptr, len, attr.device));
        return info;
    }

    uint64_t mapped_bytes(const void* ptr, uint64_t at_most) override {
        if (ptr == nullptr || count() == 0) return 0;
        cudaPointerAttributes attr{};
        if (cudaPointerGetAttributes(&attr, ptr) != cudaSuccess ||
            attr.type != cudaMemoryTypeDevice) {
            cudaGetLastError();
            return 0;
        }
        const StatusOr<uint64_t> mapped = mapped_from(ptr, at_most, attr.device);
        return mapped.ok() ? *mapped : 0;
    }

    uintptr_t mapped_host_address(const void* host) override {
        if (host == nullptr || count() == 0) return 0;
        void* dev = nullptr;
        if (cudaHostGetDevicePointer(&dev, const_cast<void*>(host), 0) != cudaSuccess) {
            cudaGetLastError();
            return 0;
        }
        return reinterpret_cast<uintptr_t>(dev);
    }

    // Whether [ptr, ptr + len) is device memory of GPU `device` throughout.
    Status check_mapped(const void* ptr, size_t len, int device) {
        TCPX_ASSIGN_OR_RETURN(const uint64_t mapped, mapped_from(ptr, len, device));
        if (mapped >= len) return Status();
        return out_of_range(strformat(
            "%zu bytes from %p run past the end of GPU %d's memory there (%llu bytes of it from "
            "that address)",
            len, ptr, device, static_cast<unsigned long long>(mapped)));
    }

    // How many bytes from `ptr` on, up to `at_most`, are device memory of GPU `device` (`at_most`
    // where the driver cannot say). An allocation of the virtual memory API (cuMemCreate +
    // cuMemMap: PyTorch's expandable segments) is a contiguous range of separately mapped
    // pieces, and cuMemGetAddressRange answers for the piece a pointer lies in: the range is
    // walked piece by piece. An error where `device` cannot be made current.
    // Each address is first asked of cudaPointerGetAttributes, which answers for any address
    // (memory CUDA does not know is cudaMemoryTypeUnregistered, a success), and only device
    // memory is then asked of cuMemGetAddressRange: asked past the end of an allocation it fails
    // (CUDA_ERROR_NOT_FOUND), which compute-sanitizer reports as an error of the program even
    // where, as here, the failure is the answer.
    StatusOr<uint64_t> mapped_from(const void* ptr, uint64_t at_most, int device) {
        const auto range = address_range_call();
        if (range == nullptr) return at_most;  // the driver cannot say: as before
        OnGpu on(device);                      // the driver answers in the current context
        TCPX_RETURN_IF_ERROR(on.status());
        const auto start = reinterpret_cast<CUdeviceptr>(ptr);
        CUdeviceptr at = start;
        for (int pieces = 0; at - start < at_most && pieces < (1 << 20); ++pieces) {
            CUdeviceptr base = 0;
            size_t size = 0;
            cudaPointerAttributes attr{};
            if (cudaPointerGetAttributes(&attr, reinterpret_cast<const void*>(at)) != cudaSuccess ||
                attr.type != cudaMemoryTypeDevice || attr.device != device ||
                range(&base, &size, at) != CUDA_SUCCESS || base + size <= at) {
                cudaGetLastError();
                break;
            }
            at = base + size;
        }
        return std::min<uint64_t>(at - start, at_most);
    }

    Status copy(int device, void* dst, const void* src, size_t len) override {
        return run_copy(device, dst, src, len, false);
    }
    Status copy_to_host(int device, void* host, const void* gpu, size_t len) override {
        return run_copy(device, host, gpu, len, true);
    }

    StatusOr<std::unique_ptr<CopyRing>> make_ring(int device, size_t slot_bytes, int slots,
                                                  int records) override {
        if (count() == 0) return unavailable("GPU memory: no usable GPU");
        return CudaCopyRing::create(device, slot_bytes, slots, records);
    }

    Status select(int device, uintptr_t* previous) override {
        if (device < 0 || device >= count()) {
            return invalid_argument(strformat("GPU %d: %d usable", device, count()));
        }
        return switch_to(device, previous);
    }

    void restore(uintptr_t previous) override { put_back(previous); }

    std::string pci_bus_id(int device) override {
        if (device < 0 || device >= count()) return "";
        char id[32] = {};
        if (cudaDeviceGetPCIBusId(id, static_cast<int>(sizeof(id)), device) != cudaSuccess) {
            cudaGetLastError();
            return "";
        }
        return id;
    }

 private:
    // A stream of GPU `device` for one synchronous copy at a time, and its pinned bounce buffer
    // (kBounceBytes, made the first time a copy of pageable memory uses it; none where that
    // failed).
    struct CopyStream {
        cudaStream_t stream = nullptr;
        void* bounce = nullptr;
    };

    // `to_pageable`: dst is pageable host memory, src GPU memory.
    Status run_copy(int device, void* dst, const void* src, size_t len, bool to_pageable) {
        if (count() == 0) return unavailable("GPU memory: no usable GPU");
        if (device < 0 || device >= count()) {
            return invalid_argument(strformat("copy on GPU %d: %d usable", device, count()));
        }
        // With the memory's GPU current (not whatever the calling thread had, or GPU 0 in a
        // thread that had none, which would make a context there), on a non-blocking stream:
        // the per-thread and legacy default streams wait for the application's work on the
        // legacy stream (PyTorch's default), and this runs under the engine's lock.
        OnGpu on(device);
        TCPX_RETURN_IF_ERROR(on.status());
        TCPX_ASSIGN_OR_RETURN(CopyStream cs, take_stream(device));
        const bool small = to_pageable && len <= kBounceBytes;
        if (small && cs.bounce == nullptr &&
            cudaHostAlloc(&cs.bounce, kBounceBytes, cudaHostAllocDefault) != cudaSuccess) {
            cudaGetLastError();  // (not sticky) without it, the copy goes as it is
            cs.bounce = nullptr;
        }
        const bool bounce = small && cs.bounce != nullptr;
        // cudaMemcpy may return before a copy from pageable memory to the device has landed:
        // wait for it, so that the bytes are in place for any stream once this returns.
        Status st = cuda_status(
            cudaMemcpyAsync(bounce ? cs.bounce : dst, src, len, cudaMemcpyDefault, cs.stream),
            "copying GPU memory");
        if (st.ok()) st = cuda_status(cudaStreamSynchronize(cs.stream), "copying GPU memory");
        if (st.ok() && bounce) std::memcpy(dst, cs.bounce, len);
        give_back(device, cs);
        return st;
    }

    // One per thread copying at once, made as needed and kept for the process's life.
    StatusOr<CopyStream> take_stream(int device) {
        {
            std::lock_guard<std::mutex> lock(streams_mu_);
            if (streams_.size() < static_cast<size_t>(count())) streams_.resize(count());
            auto& free = streams_[static_cast<size_t>(device)];
            if (!free.empty()) {
                CopyStream s = free.back();
                free.pop_back();
                return s;
            }
        }
        CopyStream s;
        TCPX_RETURN_IF_ERROR(cuda_status(
            cudaStreamCreateWithFlags(&s.stream, cudaStreamNonBlocking), "cudaStreamCreate"));
        return s;
    }
    void give_back(int device, CopyStream s) {
        std::lock_guard<std::mutex> lock(streams_mu_);
        streams_[static_cast<size_t>(device)].push_back(s);
    }

    std::once_flag once_;
    int count_ = 0;
    std::mutex streams_mu_;
    std::vector<std::vector<CopyStream>> streams_;  // by GPU, free ones
};

}  // namespace

Device& runtime_device() {
    static CudaDevice d;
    return d;
}

Status launch_unpack(const LoadMeta* entries, const uint64_t* count, const uint8_t* bounce,
                     uint8_t* dst, uint64_t dst_len, uint32_t* bad, void* stream,
                     uint64_t expected) {
    return cuda_status(launch_unpack_kernel(entries, count, bounce, dst, dst_len, bad,
                                            static_cast<cudaStream_t>(stream), expected),
                       "launching the unpack kernel");
}

}  // namespace tcpx::cuda
