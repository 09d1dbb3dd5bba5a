#include "cuda/device.h"

#include <atomic>

#include "common/status_util.h"
#include "common/strings.h"
#include "cuda/unpack_plan.h"

namespace tcpx::cuda {

Status CopyRing::unpack_scatter(int i, const LoadMeta* entries, uint64_t count,
                                const uint8_t* bounce, std::span<const Seg> segs,
                                bool through_twin) {
    if (i < 0 || i >= slots()) return internal_error("unpack: bad slot");
    if (count > static_cast<uint64_t>(kUnpackMaxEntries)) {
        return protocol_error(
            strformat("the transport described a receive in %llu pieces (at most %d)",
                      static_cast<unsigned long long>(count), kUnpackMaxEntries));
    }
    uint64_t total = 0;
    for (const Seg& seg : segs) total += seg.len;
    if (total > slot_bytes()) return internal_error("unpack larger than a staging slot");
    if (through_twin && total > length(i)) {
        return protocol_error(
            "the transport placed some of the receive's bytes in its buffer itself (data that "
            "arrived outside the GPU's pages), where the receive was posted to be unpacked "
            "straight into its pieces, into a buffer other receives share: those bytes are lost");
    }
    if (!through_twin && unpacks_into(segs)) {
        TCPX_ASSIGN_OR_RETURN(CopyEntry * list, copy_list(i));
        const UnpackPlan plan =
            plan_unpack_scatter(entries, count, bounce, segs, list, copy_capacity(), &plan_starts_);
        if (plan.fits) return run_copy_list(i, plan.count, plan.bad);
        // Entries that tile the chunk once never need more copies than a list holds: these
        // overlap. The engine posted the receive as one taken straight into its pieces, holding
        // no room in the twin to go through instead.
        if (total > length(i)) {
            return protocol_error(strformat(
                "the transport described a receive in %llu entries that overlap (more than %zu "
                "copies into its pieces)",
                static_cast<unsigned long long>(count), copy_capacity()));
        }
    }
    // Not one list: the pages into the slot's GPU twin, then the scatter out of it.
    if (total > length(i)) return internal_error("unpack larger than its staging slot");
    TCPX_ASSIGN_OR_RETURN(uint8_t * staged, twin());
    TCPX_RETURN_IF_ERROR(unpack(i, entries, count, bounce, staged + offset(i), total));
    return scatter(i, segs, /*twin_only=*/true);
}

bool CopyRing::unpacks_into(std::span<const Seg> segs) const {
    if (segs.size() > kMaxKernelSegs) return false;
    for (const Seg& seg : segs) {
        if (seg.device != device()) return false;
    }
    return true;
}

// Defined by cuda_device.cc (CUDA builds) or no_cuda_device.cc.
Device& runtime_device();

namespace {
std::atomic<Device*> g_override{nullptr};
}  // namespace

Device& device() {
    Device* d = g_override.load(std::memory_order_acquire);
    return d != nullptr ? *d : runtime_device();
}

void set_device_for_testing(Device* d) { g_override.store(d, std::memory_order_release); }

ScopedGpu::ScopedGpu(int gpu) {
    Device& d = device();
    if (gpu < 0 || gpu >= d.count()) {
        status_ = invalid_argument(strformat("GPU %d: %d usable", gpu, d.count()));
        return;
    }
    status_ = d.select(gpu, &previous_);
    selected_ = status_.ok();
}

ScopedGpu::~ScopedGpu() {
    if (selected_) device().restore(previous_);
}

}  // namespace tcpx::cuda
