#include "bench/nixl/greeting_params.h"

#include <algorithm>
#include <cctype>
#include <string>

namespace tcpx::bench::nixl_bench {

bool greeting_param_allowed(std::string_view backend, std::string_view key) {
    std::string name(key);
    std::transform(name.begin(), name.end(), name.begin(),
                   [](unsigned char c) { return static_cast<char>(std::toupper(c)); });
    if (backend == "UCX") return key == "num_workers" || key == "num_threads";
    if (backend != "TCPX") return false;
    constexpr std::string_view kPrefix = "TCPX_P2P_";
    if (name.starts_with(kPrefix)) name.erase(0, kPrefix.size());
    // (The backend's alias chunk_size is XFER_CHUNK_SIZE; CHUNK_SIZE is the transport's: both
    // shape transfers.)
    static constexpr std::string_view kAllowed[] = {"CHANNELS",
                                                    "NSOCKS",
                                                    "IO_THREADS",
                                                    "CHUNK_SIZE",
                                                    "MIN_CHUNK_SIZE",
                                                    "INLINE_THRESHOLD",
                                                    "SOCKET_SNDBUF",
                                                    "SOCKET_RCVBUF",
                                                    "SOCKET_RCVLOWAT",
                                                    "WRITE_BACK_MAX",
                                                    "XFER_CHUNK_SIZE",
                                                    "STAGING_SLOTS",
                                                    "WINDOW",
                                                    "XFER_INLINE_THRESHOLD",
                                                    "XFER_INLINE_ALONE",
                                                    "XFER_INLINE_ALONE_READ",
                                                    "XFER_INLINE_BUSY",
                                                    "SOCKET_IO",
                                                    "STAGE_TIMES"};
    return std::find(std::begin(kAllowed), std::end(kAllowed), name) != std::end(kAllowed);
}

}  // namespace tcpx::bench::nixl_bench
