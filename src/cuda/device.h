// The engine's view of GPU memory: what a pointer points to, synchronous copies, and copy rings
// (asynchronous copies and kernels on the ring's streams, their completion tracked per slot by an
// event, never by device-wide synchronization).
//
// device() is the CUDA runtime when the CUDA parts are built and a GPU is usable; otherwise every
// pointer is host memory and rings cannot be made. Tests substitute an emulation that keeps
// "device" memory in host memory (set_device_for_testing) so that the engine's device paths run
// in CI without a GPU, the same code that runs over CUDA.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "common/slot_fifo.h"
#include "cuda/copy_defs.h"
#include "cuda/unpack_defs.h"
#include "tcpx/endpoint.h"
#include "tcpx/status.h"

namespace tcpx::cuda {

// One piece of a gather or scatter: `len` bytes at `ptr`, memory of GPU `device`, or host memory
// when `device` is -1.
struct Seg {
    uint8_t* ptr = nullptr;
    uint64_t len = 0;
    int device = -1;
};

// Most pieces a gather or scatter takes with one kernel (more are copied one by one).
inline constexpr size_t kMaxKernelSegs = 1024;

struct PointerInfo {
    MemKind kind = MemKind::kHost;
    int32_t device = -1;  // for kCuda
};

// A ring of slots on GPU streams (a slot's work in order). Each slot tracks the completion of the
// last work enqueued for it and, in a staging ring, holds an allocation of up to slot_bytes() of
// the ring's pinned host buffer (slot_fifo.h: small chunks hold only what they need). Slots are
// taken and given back in FIFO order, which is the order in which the engine's channels complete
// their requests.
class CopyRing : public SlotFifo {
 public:
    virtual ~CopyRing() = default;
    CopyRing(const CopyRing&) = delete;
    CopyRing& operator=(const CopyRing&) = delete;

    int device() const { return device_; }
    // The largest allocation a slot takes.
    size_t slot_bytes() const { return slot_bytes_; }
    // Slot i's allocation of the pinned buffer (null when the ring has none), where the next
    // acquire(len) would place one, and the whole area (to register it with a transport once).
    uint8_t* slot(int i) const { return base_ == nullptr ? nullptr : base_ + offset(i); }
    uint8_t* next_slot(uint64_t len) const {
        return base_ == nullptr ? nullptr : base_ + next_offset(len);
    }
    uint8_t* base() const { return base_; }
    size_t bytes() const { return arena(); }

    // Enqueues `len` bytes of device memory at `src` -> slot i's buffer (len <= its allocation).
    virtual Status copy_in(int i, const void* src, size_t len) = 0;
    // Enqueues slot i's buffer -> `len` bytes of device memory at `dst`.
    virtual Status copy_out(int i, void* dst, size_t len) = 0;
    // Enqueues the unpack of one devmem-TCP receive (unpack.h) into `dst`, a buffer of `dst_len`
    // bytes: its `count` entries (host memory, at most kUnpackMaxEntries) are copied now, then
    // taken to the GPU with one copy ahead of the kernel. Entries reaching outside the
    // destination are not followed, and ready(i) then reports the receive as failed.
    virtual Status unpack(int i, const LoadMeta* entries, uint64_t count, const uint8_t* bounce,
                          uint8_t* dst, uint64_t dst_len) = 0;
    // Enqueues the gather of `segs`, back to back, into slot i's pinned buffer (their total at
    // most its allocation): host segments are copied before this returns, GPU ones on the ring's
    // stream (several segments of the ring's GPU by one kernel, through the slot's GPU twin and
    // one copy engine transfer). With `twin_only`, into the GPU twin, and no further.
    virtual Status gather(int i, std::span<const Seg> segs, bool twin_only = false) = 0;
    // Enqueues the scatter of slot i's pinned buffer (or with `twin_only`, its GPU twin), back
    // to back, into `segs` (the reverse).
    virtual Status scatter(int i, std::span<const Seg> segs, bool twin_only = false) = 0;
    // Enqueues the unpack of one devmem-TCP receive straight into `segs` (the chunk's pieces,
    // back to back): one copy list over the receive's entries composed with the pieces
    // (unpack_plan.h, run by run_copy_list), when the pieces are all on the ring's GPU and the
    // copies fit a slot's list; otherwise the unpack into slot i's GPU twin and the scatter out
    // of it, which needs slot i's allocation (a slot taken without one, for pieces that
    // unpacks_into() takes, gets a protocol error when overlapping entries overflow the list).
    // Entries are checked as unpack() checks them (ready(i) reports a bad receive). The same
    // decision for every ring (device.cc), so the tests' emulation runs the CUDA ring's.
    // `through_twin`: the entries leave gaps the transport filled itself in the buffer the
    // receive was posted with (check_unpack_entries), which must then be slot i's twin: always
    // the unpack into it and the scatter out of it (PROTOCOL for a slot taken without one).
    Status unpack_scatter(int i, const LoadMeta* entries, uint64_t count, const uint8_t* bounce,
                          std::span<const Seg> segs, bool through_twin = false);
    // Whether unpack_scatter() takes a receive straight into `segs` (all on the ring's GPU, at
    // most kMaxKernelSegs of them): such a receive needs a slot's record, not its buffer.
    bool unpacks_into(std::span<const Seg> segs) const;
    // The GPU twin of the pinned buffer (the same size rounded up to whole 4 KiB pages, starting
    // on one; each slot's allocation at the same offset), made on first call: where a transport
    // that takes GPU memory sends a gathered chunk from and receives one to be scattered into.
    // Past the slots, at landing_offset(), one slot's worth that no slot uses: the buffer a
    // receive that unpack_scatter() takes straight into its pieces (no slot's allocation) is
    // posted with, so that bytes a transport puts in it itself disturb no slot's. twin_bytes():
    // all of it.
    virtual StatusOr<uint8_t*> twin() = 0;
    size_t landing_offset() const { return (bytes() + 4095) & ~size_t{4095}; }
    size_t twin_bytes() const { return landing_offset() + ((slot_bytes_ + 4095) & ~size_t{4095}); }
    // Whether the work last enqueued for slot i has finished; an error if it failed.
    virtual StatusOr<bool> ready(int i) = 0;
    // Waits for all enqueued work (before buffers it touches may be released).
    virtual void synchronize() = 0;
    // Whether all enqueued work has finished (or failed), without waiting: what a teardown under
    // the engine's lock asks, so that work queued behind the application's kernels holds no lock.
    virtual bool idle() = 0;

 protected:
    // Entries of one slot's copy list: a gather's or scatter's segments, cut into tiles of at
    // most kCopyTile; or the copies of an unpack into pieces, each cut where a piece ends.
    size_t copy_capacity() const {
        return kUnpackMaxEntries + kMaxKernelSegs + slot_bytes_ / kCopyTile + 1;
    }
    // Slot i's copy list, copy_capacity() entries of host memory, free (the slot's previous work
    // has finished); made on first use.
    virtual StatusOr<CopyEntry*> copy_list(int i) = 0;
    // Enqueues the first `n` entries of slot i's copy list on the slot's stream; `bad`: the
    // receive they came from reached outside its chunk (ready(i) reports it, as after unpack()).
    virtual Status run_copy_list(int i, size_t n, bool bad) = 0;

    // `slots` records, and a pinned buffer (`base`, or none) of `buffer_slots` × slot_bytes.
    CopyRing(int device, size_t slot_bytes, int buffer_slots, int slots, uint8_t* base)
        : SlotFifo(slots, base == nullptr ? 0 : slot_bytes * static_cast<size_t>(buffer_slots)),
          device_(device),
          slot_bytes_(slot_bytes),
          base_(base) {}

 private:
    const int device_;
    const size_t slot_bytes_;
    uint8_t* const base_;
    std::vector<uint64_t> plan_starts_;  // scratch of unpack_scatter's plans
};

class Device {
 public:
    virtual ~Device() = default;
    // Usable GPUs; 0 when there is no driver or device, or the CUDA parts were not built.
    virtual int count() = 0;
    // What [ptr, ptr + len) is: kCuda for device memory (and the device it lives on), kHost for
    // anything else (pageable or pinned host memory, or when there is no GPU). An error where
    // CUDA cannot tell (a sticky error of the context: taking GPU memory for host memory would
    // have the CPU write into it), or where device memory runs into addresses with no memory of
    // that GPU mapped.
    virtual StatusOr<PointerInfo> classify(const void* ptr, size_t len) = 0;
    // How many bytes from `ptr` on are device memory of one GPU, mapped without a gap: at most
    // `at_most`, 0 where `ptr` is not device memory. Where the driver cannot say, `at_most`.
    virtual uint64_t mapped_bytes(const void* ptr, uint64_t at_most) = 0;
    // The GPUs' address of host memory mapped into them (cudaHostAllocMapped, as a plugin's
    // unpack queue); 0 where `host` is no such memory.
    virtual uintptr_t mapped_host_address(const void* host) = 0;
    // Whether what it calls device memory may be plain host memory (the tests' emulation, where
    // a plugin's "device" handles are host memory too); false for the CUDA runtime, where
    // anything a plugin says is on the GPU must be.
    virtual bool host_only() const { return false; }
    // A synchronous copy of `len` bytes between any two of host and device memory; `device` is
    // the GPU of the device memory involved (of `dst` where both are). It runs on a stream of our
    // own that does not wait for the application's work (not the legacy default stream, nor a
    // per-thread default stream, which waits for it), with that GPU current for the call and
    // the caller's current GPU left as it was.
    virtual Status copy(int device, void* dst, const void* src, size_t len) = 0;
    // copy() out of GPU memory into pageable host memory (a control message's bytes). The CUDA
    // runtime's copies of up to kBounceBytes go through a pinned buffer of the copying stream's
    // own: the driver's own staging of pageable memory took 10.6 us for 4 KiB against 8.0
    // through ours, 26 us for 64 KiB against 13 (one H200; `tcpx-p2p bench unpack`,
    // docs/gpu.md). Into the GPU the same buffer measured no faster (0.87-1.13x by size), so
    // copies that way stay copy().
    static constexpr size_t kBounceBytes = 256 * 1024;
    virtual Status copy_to_host(int device, void* host, const void* gpu, size_t len) {
        return copy(device, host, gpu, len);
    }
    // A ring on GPU `device` of `records` slots (0: `slots`), with a pinned buffer of `slots`
    // allocations of slot_bytes; slot_bytes 0 makes one without (completion tracking only, for
    // unpacks).
    virtual StatusOr<std::unique_ptr<CopyRing>> make_ring(int device, size_t slot_bytes, int slots,
                                                          int records = 0) = 0;
    // Makes GPU `device` the calling thread's current one: what a transport allocates for the
    // caller then lands there (Google's TCPX plugin puts a receive comm's bounce buffer on it).
    // On success `*previous` says what was current before, for restore(); ScopedGpu pairs them.
    virtual Status select(int device, uintptr_t* previous) = 0;
    // Makes current again what select() found current (its `previous`). Where nothing was (a
    // thread that never used a GPU), it leaves the selected GPU current.
    virtual void restore(uintptr_t previous) = 0;
    // GPU `device`'s PCI bus id ("0000:86:00.0"), which places it on the PCI tree for the
    // GPU-to-NIC choice (common/topology.h); empty when there is no such GPU.
    virtual std::string pci_bus_id(int device) = 0;
};

// Makes GPU `device` current in the calling thread for the scope, and what was current before
// current again at its end. The engine runs in the application's threads too (API calls make
// progress), and a library call must leave the caller's current GPU as it found it, as NCCL's
// calls do. Where nothing was current (a thread that never used a GPU), the GPU stays selected:
// making GPU 0 current "again" would create a context on it (cudaSetDevice does so since CUDA
// 12), holding memory on a GPU the application may never use. A device that is not usable is
// not selected (status() says why).
class ScopedGpu {
 public:
    explicit ScopedGpu(int device);
    ~ScopedGpu();
    ScopedGpu(const ScopedGpu&) = delete;
    ScopedGpu& operator=(const ScopedGpu&) = delete;
    const Status& status() const { return status_; }

 private:
    Status status_;
    bool selected_ = false;
    uintptr_t previous_ = 0;
};

// The device layer in use.
Device& device();
// Substitutes `d` (not owned) for the CUDA runtime; null restores it. Only while no endpoint
// exists.
void set_device_for_testing(Device* d);

inline int device_count() { return device().count(); }
inline StatusOr<PointerInfo> classify(const void* ptr, size_t len) {
    return device().classify(ptr, len);
}

}  // namespace tcpx::cuda
