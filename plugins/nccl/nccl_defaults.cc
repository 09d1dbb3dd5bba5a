#include "nccl_defaults.h"

#include <cstdlib>
#include <map>
#include <mutex>
#include <optional>
#include <string>

#include "common/env.h"
#include "common/log.h"

namespace tcpx::nccl_plugin {

std::vector<NcclDefault> nccl_defaults(const Config& config) {
    const auto value = [](auto v) { return v > 0 ? std::to_string(v) : std::string(); };
    return {{"NCCL_P2P_NET_CHUNKSIZE", value(config.nccl_p2p_chunk_size)},
            {"NCCL_NCHANNELS_PER_NET_PEER", value(config.nccl_channels_per_peer)}};
}

namespace {

// The values the plugin set in the environment, by variable (immortal: an init may run while
// another thread's exit destroys statics, as the log sink's comment says).
std::map<std::string, std::string>& set_by_plugin() {
    static auto* values = new std::map<std::string, std::string>();
    return *values;
}

}  // namespace

void apply_nccl_defaults() {
    auto config = Config::from_env();
    if (!config.ok()) return;
    // Inits of two threads at once (two NCCL instances in one process) take turns with the map.
    static auto* mu = new std::mutex();
    std::lock_guard<std::mutex> lock(*mu);
    auto& ours = set_by_plugin();
    for (const NcclDefault& want : nccl_defaults(*config)) {
        const char* name = want.name;
        const std::optional<std::string> now = env_get(name);
        auto mine = ours.find(name);
        if (now.has_value() && (mine == ours.end() || mine->second != *now)) {
            TCPX_INFO("NCCL plugin: %s=%s from the environment", name, now->c_str());
            if (mine != ours.end()) ours.erase(mine);  // (the user's from now on)
            continue;
        }
        if (want.value.empty()) {
            // Asked for none: NCCL's own, including in place of one an earlier init set.
            if (now.has_value() && env_unset(name) == 0) ours.erase(name);
            continue;
        }
        ours[name] = want.value;  // (first: out of memory, the environment is left as it was)
        if (env_set(name, want.value.c_str(), /*overwrite=*/true) == 0) {
            TCPX_INFO("NCCL plugin: %s=%s (the plugin's default; set it to choose another)", name,
                      want.value.c_str());
        } else {
            ours.erase(name);
        }
    }
}

}  // namespace tcpx::nccl_plugin
