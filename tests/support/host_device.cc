#include "tests/support/host_device.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>

#include "common/status_util.h"
#include "common/strings.h"
#include "cuda/unpack.h"
#include "cuda/unpack_plan.h"

namespace tcpx::testing {
namespace {

// Ring work waits in one queue, in stream order, until the engine has asked about it twice.
class HostCopyRing final : public cuda::CopyRing {
 public:
    HostCopyRing(HostDevice* dev, int device, size_t slot_bytes, int slots, int records)
        : CopyRing(device, slot_bytes, slots, records, alloc(slot_bytes, slots)),
          dev_(dev),
          failed_(static_cast<size_t>(records)) {}
    ~HostCopyRing() override {
        delete[] base();
        if (twin_ != nullptr) {
            dev_->forget(twin_);
            std::free(twin_);
        }
    }

    Status copy_in(int i, const void* src, size_t len) override {
        TCPX_RETURN_IF_ERROR(check_slot(i, len));
        if (!dev_->is_device_range(src, len))
            return internal_error("copy_in from outside device memory");
        uint8_t* to = slot(i);
        enqueue(i, [to, src, len]() {
            std::memcpy(to, src, len);
            return true;
        });
        dev_->count_ring_work(false);
        return Status();
    }

    Status copy_out(int i, void* dst, size_t len) override {
        TCPX_RETURN_IF_ERROR(check_slot(i, len));
        if (!dev_->is_device_range(dst, len))
            return internal_error("copy_out to outside device memory");
        const uint8_t* from = slot(i);
        enqueue(i, [dst, from, len]() {
            std::memcpy(dst, from, len);
            return true;
        });
        dev_->count_ring_work(false);
        return Status();
    }

    Status unpack(int i, const cuda::LoadMeta* entries, uint64_t count, const uint8_t* bounce,
                  uint8_t* dst, uint64_t dst_len) override {
        if (i < 0 || i >= slots()) return internal_error("unpack: bad slot");
        if (count > static_cast<uint64_t>(cuda::kUnpackMaxEntries)) {
            return protocol_error("emulated unpack: more pieces than a slot holds");
        }
        if (dst_len > 0 && !dev_->is_device_range(dst, dst_len)) {
            return internal_error("unpack into memory outside device memory");
        }
        // Like the CUDA ring, the list is copied now; the pages are read when the work runs.
        std::vector<cuda::LoadMeta> list(entries, entries + count);
        enqueue(i, [list = std::move(list), bounce, dst, dst_len]() {
            return cuda::unpack_reference(list.data(), list.size(), bounce, dst, dst_len);
        });
        dev_->count_ring_work(true);
        return Status();
    }

    // As CUDA's ring: host segments now, "device" ones when the work runs.
    Status gather(int i, std::span<const cuda::Seg> segs, bool twin_only) override {
        return move_segments(i, segs, true, twin_only);
    }
    Status scatter(int i, std::span<const cuda::Seg> segs, bool twin_only) override {
        return move_segments(i, segs, false, twin_only);
    }
    // As CUDA's ring: the list (planned by CopyRing::unpack_scatter) is taken now, its copies
    // made when the work runs; every one must land in declared device memory.
    StatusOr<cuda::CopyEntry*> copy_list(int i) override {
        if (i < 0 || i >= slots()) return internal_error("copy list: bad slot");
        if (lists_.empty()) lists_.resize(static_cast<size_t>(slots()));
        std::vector<cuda::CopyEntry>& list = lists_[static_cast<size_t>(i)];
        if (list.empty()) list.resize(copy_capacity());
        return list.data();
    }
    Status run_copy_list(int i, size_t n, bool bad) override {
        if (i < 0 || i >= slots() || lists_.empty() || n > copy_capacity()) {
            return internal_error("copy list: bad slot or length");
        }
        const std::vector<cuda::CopyEntry>& list = lists_[static_cast<size_t>(i)];
        std::vector<cuda::CopyEntry> copies(list.begin(), list.begin() + static_cast<long>(n));
        for (const cuda::CopyEntry& e : copies) {
            if (!dev_->is_device_range(reinterpret_cast<const void*>(e.dst), e.len)) {
                return internal_error("unpack into memory outside device memory");
            }
        }
        enqueue(i, [copies = std::move(copies), good = !bad]() {
            cuda::run_copy_entries(copies.data(), copies.size());
            return good;
        });
        dev_->count_ring_work(true);
        dev_->count_direct_unpack();
        return Status();
    }

    // "Device" memory of the ring's GPU, declared as such, poisoned like the pinned buffer.
    StatusOr<uint8_t*> twin() override {
        if (twin_ == nullptr) {
            if (bytes() == 0) return internal_error("twin of a ring without a buffer");
            const size_t n = twin_bytes();
            twin_ = static_cast<uint8_t*>(std::aligned_alloc(4096, n));
            if (twin_ == nullptr) return internal_error("twin: out of memory");
            std::memset(twin_, 0xdb, n);
            dev_->declare(twin_, n, device());
        }
        return twin_;
    }

    StatusOr<bool> ready(int i) override {
        if (i < 0 || i >= slots()) return internal_error("ready: bad slot");
        if (dev_->ring_work_held()) {
            for (const Work& w : queue_) {
                if (w.slot == i) return false;
            }
        }
        // The newest work for slot i.
        auto last = queue_.end();
        for (auto it = queue_.begin(); it != queue_.end(); ++it) {
            if (it->slot == i) last = it;
        }
        if (last != queue_.end()) {
            if (!last->asked) {
                last->asked = true;
                return false;
            }
            run_through(last);
        }
        if (failed_[static_cast<size_t>(i)]) {
            failed_[static_cast<size_t>(i)] = false;
            return protocol_error("emulated unpack: the receive reached outside its buffer");
        }
        return true;
    }

    void synchronize() override {
        dev_->wait_ring_work_released();
        run_through(queue_.end());
    }

    // As a GPU's streams move on by themselves: each question runs the oldest piece of work, so
    // that a teardown sees work still running for a pass or more (and must come back for it).
    bool idle() override {
        if (queue_.empty()) return true;
        if (dev_->ring_work_held()) return false;
        run_through(queue_.begin());
        return queue_.empty();
    }

 private:
    struct Work {
        int slot;
        std::function<bool()> fn;
        bool asked = false;
    };

    static uint8_t* alloc(size_t slot_bytes, int slots) {
        if (slot_bytes == 0) return nullptr;
        // Stale bytes from earlier chunks must never pass for data: fill with a poison.
        const size_t n = slot_bytes * static_cast<size_t>(slots);
        auto* p = new uint8_t[n];
        std::memset(p, 0xdb, n);
        return p;
    }

    Status check_slot(int i, size_t len) const {
        if (i < 0 || i >= slots()) return internal_error("copy: bad slot");
        if (slot(i) == nullptr || len > length(i))
            return internal_error("copy: larger than a slot");
        return Status();
    }

    Status move_segments(int i, std::span<const cuda::Seg> segs, bool gather, bool twin_only) {
        uint64_t total = 0;
        for (const cuda::Seg& seg : segs) {
            if (seg.device >= 0 && !dev_->is_device_range(seg.ptr, seg.len)) {
                return internal_error("gather or scatter outside device memory");
            }
            total += seg.len;
        }
        TCPX_RETURN_IF_ERROR(check_slot(i, total));
        if (twin_only && twin_ == nullptr) return internal_error("twin used before it was made");
        uint8_t* pinned = twin_only ? twin_ + offset(i) : slot(i);
        // Host pieces now; "device" copies (every copy into or out of the twin) when the work runs.
        struct Copy {
            uint8_t* dst;
            const uint8_t* src;
            uint64_t len;
        };
        std::vector<Copy> later;
        uint64_t at = 0;
        for (const cuda::Seg& seg : segs) {
            const Copy c{gather ? pinned + at : seg.ptr, gather ? seg.ptr : pinned + at, seg.len};
            if (seg.device < 0 && !twin_only) {
                std::memcpy(c.dst, c.src, c.len);
            } else {
                later.push_back(c);
            }
            at += seg.len;
        }
        enqueue(i, [later = std::move(later)]() {
            for (const Copy& c : later) std::memcpy(c.dst, c.src, c.len);
            return true;
        });
        dev_->count_ring_work(false);
        return Status();
    }

    void enqueue(int i, std::function<bool()> fn) { queue_.push_back(Work{i, std::move(fn)}); }

    // Runs queued work up to and including `last` (everything for end()).
    void run_through(std::deque<Work>::iterator last) {
        const size_t n =
            last == queue_.end() ? queue_.size() : static_cast<size_t>(last - queue_.begin()) + 1;
        for (size_t k = 0; k < n; ++k) {
            Work w = std::move(queue_.front());
            queue_.pop_front();
            if (!w.fn()) failed_[static_cast<size_t>(w.slot)] = true;
        }
    }

    HostDevice* const dev_;
    uint8_t* twin_ = nullptr;
    std::vector<std::vector<cuda::CopyEntry>> lists_;  // per slot, made on first use
    std::deque<Work> queue_;
    std::vector<bool> failed_;
};

}  // namespace

void HostDevice::declare(const void* ptr, size_t len, int device) {
    std::lock_guard<std::mutex> lock(mu_);
    regions_[reinterpret_cast<uintptr_t>(ptr)] = Region{len, device};
}

void HostDevice::forget(const void* ptr) {
    std::lock_guard<std::mutex> lock(mu_);
    regions_.erase(reinterpret_cast<uintptr_t>(ptr));
}

StatusOr<cuda::PointerInfo> HostDevice::classify(const void* ptr, size_t len) {
    std::lock_guard<std::mutex> lock(mu_);
    cuda::PointerInfo info;
    const auto p = reinterpret_cast<uintptr_t>(ptr);
    auto it = regions_.upper_bound(p);
    if (it == regions_.begin()) return info;
    --it;
    if (p < it->first + it->second.len) {
        info.kind = MemKind::kCuda;
        info.device = it->second.device;
        // As CUDA's: device memory past the end of its allocation is refused.
        if (len > it->first + it->second.len - p) {
            return out_of_range("runs past the end of its GPU allocation");
        }
    }
    return info;
}

uint64_t HostDevice::mapped_bytes(const void* ptr, uint64_t at_most) {
    std::lock_guard<std::mutex> lock(mu_);
    const auto p = reinterpret_cast<uintptr_t>(ptr);
    auto it = regions_.upper_bound(p);
    if (it == regions_.begin()) return 0;
    --it;
    if (p >= it->first + it->second.len) return 0;
    return std::min<uint64_t>(it->first + it->second.len - p, at_most);
}

bool HostDevice::is_device_range(const void* ptr, size_t len) {
    std::lock_guard<std::mutex> lock(mu_);
    const auto p = reinterpret_cast<uintptr_t>(ptr);
    auto it = regions_.upper_bound(p);
    if (it == regions_.begin()) return false;
    --it;
    return p >= it->first && p + len <= it->first + it->second.len;
}

void HostDevice::set_copy_hook(std::function<void()> hook) {
    std::lock_guard<std::mutex> lock(mu_);
    copy_hook_ = std::move(hook);
}

Status HostDevice::copy(int device, void* dst, const void* src, size_t len) {
    std::function<void()> hook;
    {
        std::lock_guard<std::mutex> lock(mu_);
        hook = copy_hook_;
    }
    if (hook) hook();
    // As CUDA's, the copy names the GPU of the device memory it involves (a wrong one would copy
    // on another GPU's stream, with another GPU current).
    const auto kind_of = [&](const void* p) {
        auto info = classify(p, 1);  // one byte: never past its region
        return info.ok() ? *info : cuda::PointerInfo{};
    };
    const cuda::PointerInfo to = kind_of(dst), from = kind_of(src);
    if ((to.kind == MemKind::kCuda || from.kind == MemKind::kCuda) &&
        !(to.kind == MemKind::kCuda && to.device == device) &&
        !(from.kind == MemKind::kCuda && from.device == device)) {
        return internal_error(strformat("a copy on GPU %d of GPU %d's memory", device,
                                        to.kind == MemKind::kCuda ? to.device : from.device));
    }
    // Like cudaMemcpyDefault, any two of host and device memory.
    if (len == 0) return Status();
    std::memcpy(dst, src, len);
    return Status();
}

StatusOr<std::unique_ptr<cuda::CopyRing>> HostDevice::make_ring(int device, size_t slot_bytes,
                                                                int slots, int records) {
    if (device < 0 || device >= gpus_ || slots < 1) return invalid_argument("make_ring: bad args");
    if (records < 1) records = slots;
    {
        std::lock_guard<std::mutex> lock(mu_);
        ++rings_made_;
    }
    return std::unique_ptr<cuda::CopyRing>(
        new HostCopyRing(this, device, slot_bytes, slots, records));
}

namespace {
thread_local int t_current = -1;
}  // namespace

Status HostDevice::select(int device, uintptr_t* previous) {
    if (device < 0 || device >= gpus_) return invalid_argument("select: no such GPU");
    // As the CUDA layer: something to put back only where another GPU was current.
    *previous = t_current >= 0 && t_current != device ? static_cast<uintptr_t>(t_current) + 1 : 0;
    t_current = device;
    return Status();
}

void HostDevice::restore(uintptr_t previous) {
    if (previous != 0) t_current = static_cast<int>(previous - 1);
}

int HostDevice::current() { return t_current; }

void HostDevice::set_current(int device) { t_current = device; }

std::string HostDevice::pci_bus_id(int device) {
    std::lock_guard<std::mutex> lock(mu_);
    if (device < 0 || static_cast<size_t>(device) >= pci_bus_ids_.size()) return "";
    return pci_bus_ids_[static_cast<size_t>(device)];
}

void HostDevice::set_pci_bus_ids(std::vector<std::string> ids) {
    std::lock_guard<std::mutex> lock(mu_);
    pci_bus_ids_ = std::move(ids);
}

int HostDevice::rings_made() const {
    std::lock_guard<std::mutex> lock(mu_);
    return rings_made_;
}
uint64_t HostDevice::ring_copies() const {
    std::lock_guard<std::mutex> lock(mu_);
    return ring_copies_;
}
uint64_t HostDevice::unpacks() const {
    std::lock_guard<std::mutex> lock(mu_);
    return unpacks_;
}
uint64_t HostDevice::direct_unpacks() const {
    std::lock_guard<std::mutex> lock(mu_);
    return direct_unpacks_;
}
void HostDevice::count_ring_work(bool unpack) {
    std::lock_guard<std::mutex> lock(mu_);
    ++(unpack ? unpacks_ : ring_copies_);
}
void HostDevice::count_direct_unpack() {
    std::lock_guard<std::mutex> lock(mu_);
    ++direct_unpacks_;
}

void HostDevice::hold_ring_work(bool hold) {
    {
        std::lock_guard<std::mutex> lock(mu_);
        ring_work_held_ = hold;
    }
    released_.notify_all();
}

bool HostDevice::ring_work_held() const {
    std::lock_guard<std::mutex> lock(mu_);
    return ring_work_held_;
}

void HostDevice::wait_ring_work_released() {
    std::unique_lock<std::mutex> lock(mu_);
    released_.wait(lock, [this] { return !ring_work_held_; });
}

ScopedHostDevice::ScopedHostDevice(int gpus) : device_(gpus) {
    cuda::set_device_for_testing(&device_);
}
ScopedHostDevice::~ScopedHostDevice() { cuda::set_device_for_testing(nullptr); }

}  // namespace tcpx::testing
