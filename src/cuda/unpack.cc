#include "cuda/unpack.h"

#include <algorithm>
#include <cstring>

namespace tcpx::cuda {

bool unpack_reference(const LoadMeta* entries, uint64_t count, const uint8_t* bounce, uint8_t* dst,
                      uint64_t dst_len) {
    bool good = count <= static_cast<uint64_t>(kUnpackMaxEntries);
    count = std::min<uint64_t>(count, kUnpackMaxEntries);
    for (uint64_t i = 0; i < count; ++i) {
        const LoadMeta& m = entries[i];
        if (m.dst_off > dst_len || m.len > dst_len - m.dst_off) {
            good = false;
            continue;
        }
        std::memcpy(dst + m.dst_off, bounce + m.src_off, m.len);
    }
    return good;
}

}  // namespace tcpx::cuda
