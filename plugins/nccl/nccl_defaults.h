// NCCL's own settings that the plugin provides where the environment does not: NCCL reads them
// from the environment after the plugin's init, so the plugin sets them there.
#pragma once

#include <string>
#include <vector>

#include "tcpx/config.h"

namespace tcpx::nccl_plugin {

struct NcclDefault {
    const char* name;   // NCCL's variable
    std::string value;  // empty: `config` asks for none (NCCL's own)
};

// Every variable the plugin manages, with the value `config` asks for (NCCL_P2P_CHUNK_SIZE,
// NCCL_CHANNELS_PER_PEER; a 0 asks for none), whether or not the environment has them.
std::vector<NcclDefault> nccl_defaults(const Config& config);

// Sets each of nccl_defaults(Config::from_env()) that the environment does not have (the
// user's value always wins) and logs what it set. What an earlier init set is the plugin's, not
// the user's: it follows the parameters of this one (another value, or gone when they ask for
// none), and is not reported as the environment's. Called from the plugin's init, on NCCL's init
// thread, before NCCL reads them (computeBuffSizes and the P2P channel setup run after the
// network's init). A Config that does not parse changes nothing: the core's init has reported
// it already.
void apply_nccl_defaults();

}  // namespace tcpx::nccl_plugin
