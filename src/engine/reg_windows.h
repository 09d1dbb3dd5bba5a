// Registration windows: how the engine registers a region larger than a transport takes in one
// registration (net::Properties::max_reg_size; v7's regMr has an int size).
//
// The region is registered as overlapping windows of equal length W (at most the limit), one
// every S bytes, with S <= W - C for C the largest chunk ever posted. A chunk starting in
// [k*S, (k+1)*S) then ends before k*S + S + C <= k*S + W: it lies entirely inside window k, so
// every request can be given one memory handle whose registration holds all its bytes. The last
// window is cut short at the end of the region, and no window starts after the first one that
// reaches the end (it would hold nothing the earlier one does not). A region that fits is one
// window, the whole region.
//
// Windows are registered lazily by the engine (Endpoint::Impl::mr_for), so only those that
// transfers touch cost anything. W and S are whole 4 KiB pages: for GPU memory, registered by
// its page-aligned cover (Google's TCPX maps whole pages from an aligned pointer), every window
// then starts on a page too.
//
// Arithmetic only, on addresses as integers: no memory is touched.
#pragma once

#include <cstddef>
#include <cstdint>

#include "tcpx/status.h"

namespace tcpx::engine {

class RegWindows {
 public:
    static constexpr uint64_t kPage = 4096;

    struct Window {
        uintptr_t base = 0;
        uint64_t len = 0;
    };

    // The windows of region [base, base + len) (len > 0) for a transport whose registrations
    // hold at most `max_reg` bytes (0: no limit) and chunks of at most `max_chunk` bytes (> 0).
    // `page_cover`: what is registered is the region's cover by whole 4 KiB pages (GPU memory).
    // Refuses shapes where no such windows exist: a chunk larger than half a window (windows
    // would overlap more than they advance), or a limit below two pages.
    static StatusOr<RegWindows> make(uintptr_t base, uint64_t len, uint64_t max_reg,
                                     uint64_t max_chunk, bool page_cover);

    size_t count() const { return count_; }
    // Window `index` (< count()): what to register.
    Window window(size_t index) const;
    // The window that holds all of chunk [ptr, ptr + n): the region must hold it and
    // 0 < n <= max_chunk.
    StatusOr<size_t> find(uintptr_t ptr, uint64_t n) const;

    // Window length and stride; equal to the cover's length when there is one window.
    uint64_t width() const { return width_; }
    uint64_t stride() const { return stride_; }

 private:
    RegWindows() = default;

    uintptr_t region_base_ = 0;
    uint64_t region_len_ = 0;
    uintptr_t cover_base_ = 0;  // what is registered: the region or its page cover
    uint64_t cover_len_ = 0;
    uint64_t max_chunk_ = 0;
    uint64_t width_ = 0;
    uint64_t stride_ = 0;
    size_t count_ = 1;
};

}  // namespace tcpx::engine
