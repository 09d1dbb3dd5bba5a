#include "nccl_defaults.h"

#include <cstdlib>

#include "common/log.h"

namespace tcpx::nccl_plugin {

std::vector<NcclDefault> nccl_defaults(const Config& config) {
    std::vector<NcclDefault> out;
    if (config.nccl_p2p_chunk_size > 0) {
        out.push_back({"NCCL_P2P_NET_CHUNKSIZE", std::to_string(config.nccl_p2p_chunk_size)});
    }
    if (config.nccl_channels_per_peer > 0) {
        out.push_back(
            {"NCCL_NCHANNELS_PER_NET_PEER", std::to_string(config.nccl_channels_per_peer)});
    }
    return out;
}

void apply_nccl_defaults() {
    auto config = Config::from_env();
    if (!config.ok()) return;
    for (const NcclDefault& d : nccl_defaults(*config)) {
        if (std::getenv(d.name) != nullptr) {
            TCPX_INFO("NCCL plugin: %s=%s from the environment", d.name, std::getenv(d.name));
            continue;
        }
        if (::setenv(d.name, d.value.c_str(), /*overwrite=*/0) == 0) {
            TCPX_INFO("NCCL plugin: %s=%s (the plugin's default; set it to choose another)", d.name,
                      d.value.c_str());
        }
    }
}

}  // namespace tcpx::nccl_plugin
