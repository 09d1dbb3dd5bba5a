#include "engine/reg_windows.h"

#include <algorithm>
#include <limits>

#include "common/status_util.h"
#include "common/strings.h"

namespace tcpx::engine {

namespace {

unsigned long long ull(uint64_t v) { return static_cast<unsigned long long>(v); }

}  // namespace

StatusOr<RegWindows> RegWindows::make(uintptr_t base, uint64_t len, uint64_t max_reg,
                                      uint64_t max_chunk, bool page_cover) {
    if (len == 0) return invalid_argument("registration windows of an empty region");
    if (max_chunk == 0) return invalid_argument("registration windows for chunks of 0 bytes");
    if (len > std::numeric_limits<uintptr_t>::max() - base) {
        return invalid_argument("registration windows of a region past the end of memory");
    }
    RegWindows w;
    w.region_base_ = base;
    w.region_len_ = len;
    w.max_chunk_ = max_chunk;
    w.cover_base_ = base;
    w.cover_len_ = len;
    if (page_cover) {
        const uintptr_t start = base & ~uintptr_t{kPage - 1};
        const uintptr_t end = base + len;
        if (end > std::numeric_limits<uintptr_t>::max() - (kPage - 1)) {
            return invalid_argument("registration windows of a region in the last page of memory");
        }
        w.cover_base_ = start;
        w.cover_len_ = ((end + kPage - 1) & ~uintptr_t{kPage - 1}) - start;
    }
    if (max_reg == 0 || w.cover_len_ <= max_reg) {
        w.width_ = w.stride_ = w.cover_len_;
        w.count_ = 1;
        return w;
    }
    const uint64_t width = max_reg & ~(kPage - 1);
    if (width < 2 * kPage || max_chunk > width / 2) {
        return failed_precondition(strformat(
            "a region of %llu bytes cannot be registered in windows for chunks of %llu bytes: "
            "the transport registers at most %llu bytes at a time, and chunks must be at most "
            "half of that (lower XFER_CHUNK_SIZE)",
            ull(len), ull(max_chunk), ull(max_reg)));
    }
    // width - max_chunk >= width / 2 >= one page: the stride is at least a page.
    w.width_ = width;
    w.stride_ = (width - max_chunk) & ~(kPage - 1);
    w.count_ = static_cast<size_t>(1 + (w.cover_len_ - width + w.stride_ - 1) / w.stride_);
    return w;
}

RegWindows::Window RegWindows::window(size_t index) const {
    const uint64_t off = static_cast<uint64_t>(index) * stride_;
    return Window{cover_base_ + off, std::min(width_, cover_len_ - off)};
}

StatusOr<size_t> RegWindows::find(uintptr_t ptr, uint64_t n) const {
    if (n == 0 || n > max_chunk_) {
        return invalid_argument(strformat("a chunk of %llu bytes for windows of chunks of %llu",
                                          ull(n), ull(max_chunk_)));
    }
    if (ptr < region_base_ || ptr - region_base_ > region_len_ ||
        n > region_len_ - (ptr - region_base_)) {
        return out_of_range(strformat("a chunk of %llu bytes outside its region of %llu bytes",
                                      ull(n), ull(region_len_)));
    }
    if (count_ == 1) return size_t{0};
    const uint64_t off = ptr - cover_base_;
    // Past the start of the last window, the last window holds everything to the end.
    return std::min(static_cast<size_t>(off / stride_), count_ - 1);
}

}  // namespace tcpx::engine
