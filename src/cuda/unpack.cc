#include "cuda/unpack.h"

#include <cstring>

#include "common/status_util.h"
#include "common/strings.h"
#include "cuda/unpack_kernel.h"

namespace tcpx::cuda {

void unpack_reference(const LoadMeta* entries, uint64_t count, const uint8_t* bounce,
                      uint8_t* dst) {
    for (uint64_t i = 0; i < count; ++i) {
        std::memcpy(dst + entries[i].dst_off, bounce + entries[i].src_off, entries[i].len);
    }
}

Status launch_unpack(const LoadMeta* entries, const uint64_t* count, const uint8_t* bounce,
                     uint8_t* dst, void* stream) {
    const cudaError_t err =
        launch_unpack_kernel(entries, count, bounce, dst, static_cast<cudaStream_t>(stream));
    if (err != cudaSuccess) {
        return Status(StatusCode::kCuda,
                      strformat("launching the unpack kernel: %s", cudaGetErrorString(err)));
    }
    return Status();
}

}  // namespace tcpx::cuda
