// Which backend parameters the NIXL bench's greeting may carry from the initiator to a target
// (--listen). The greeting comes from the network: a target set up by anyone who reaches its
// port must take from it only what tunes the transfer, never a setting that names a library or
// program to load (TCPX's NET_PLUGIN, PLUGIN_PROBE_PATH), a secret, an interface, a port, a
// bound or a fault to inject. Free of NIXL, so that it is tested without it.
#pragma once

#include <string_view>

namespace tcpx::bench::nixl_bench {

// Whether `BACKEND:key=...` may travel in the greeting: TCPX's transfer-shaping settings
// (sockets, threads, channels, chunks, window, staging, inline limits, socket buffers, how the
// I/O runs), spelled as the backend takes them (the setting's name in either case, without or
// with its TCPX_P2P_ prefix, or the backend's aliases `channels`, `nsocks`, `chunk_size`), and
// UCX's `num_workers` and `num_threads`. Everything else is each host's own.
bool greeting_param_allowed(std::string_view backend, std::string_view key);

}  // namespace tcpx::bench::nixl_bench
