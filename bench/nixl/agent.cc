#include "bench/nixl/agent.h"

#include <algorithm>
#include <cstdlib>
#include <vector>

#include "common/status_util.h"
#include "common/strings.h"

namespace tcpx::bench::nixl_bench {

// --- memory: host or GPU -------------------------------------------------------------------------

StatusOr<std::unique_ptr<Memory>> Memory::allocate(bool vram, int gpu, uint64_t len) {
    if (vram) {
        auto gpus = usable_gpus();
        if (!gpus.ok()) return Status(gpus.status()).with_context("--mem vram");
        if (gpu < 0 || gpu >= *gpus) {
            return invalid_argument(
                strformat("--gpus: GPU %d does not exist (%d here)", gpu, *gpus));
        }
    }
    auto m = std::make_unique<Memory>();
    TCPX_ASSIGN_OR_RETURN(m->buf_,
                          Buffer::allocate(vram ? MemType::kVram : MemType::kHost, gpu, len, 0x5a));
    m->gpu_ = vram ? gpu : -1;
    return m;
}

Status Memory::prepare(uint64_t run, uint64_t slot_bytes, int slots, bool pattern) {
    TCPX_RETURN_IF_ERROR(check_range(slot_bytes, slots));
    for (int s = 0; s < slots; ++s) {
        TCPX_RETURN_IF_ERROR(prepare_bytes(buf_, static_cast<uint64_t>(s) * slot_bytes, slot_bytes,
                                           pattern, pattern_seed(run, s)));
    }
    return Status();
}

Status Memory::check(uint64_t run, uint64_t slot_bytes, int slots, const std::string& what) const {
    TCPX_RETURN_IF_ERROR(check_range(slot_bytes, slots));
    for (int s = 0; s < slots; ++s) {
        TCPX_RETURN_IF_ERROR(check_bytes(buf_, static_cast<uint64_t>(s) * slot_bytes, slot_bytes,
                                         pattern_seed(run, s),
                                         strformat("%s, request slot %d", what.c_str(), s)));
    }
    return Status();
}

Status Memory::check_range(uint64_t slot_bytes, int slots) const {
    // slot_bytes x slots > size, without the product (it may overflow).
    if (slots < 0 || (slots > 0 && slot_bytes > buf_.size() / static_cast<uint64_t>(slots))) {
        return out_of_range("slots beyond the registered region");
    }
    return Status();
}

// --- agents --------------------------------------------------------------------------------------

namespace {

std::string join_plugins(const std::vector<nixl_backend_t>& plugins) {
    std::string out;
    for (const auto& p : plugins) out += (out.empty() ? "" : ", ") + p;
    return out.empty() ? "none" : out;
}

}  // namespace

StatusOr<Agent> create_agent(const std::string& name, const std::string& backend,
                             const Options& o) {
    Agent a;
    nixlAgentConfig cfg;
    cfg.useProgThread = o.progress_thread;
    try {
        a.agent = std::make_unique<nixlAgent>(name, cfg);
    } catch (const std::exception& e) {
        return internal_error(std::string("creating a NIXL agent: ") + e.what());
    }
    std::vector<nixl_backend_t> plugins;
    TCPX_RETURN_IF_ERROR(from_nixl(a.agent->getAvailPlugins(plugins), "getAvailPlugins"));
    if (std::find(plugins.begin(), plugins.end(), backend) == plugins.end()) {
        const char* dir = std::getenv("NIXL_PLUGIN_DIR");
        return not_found(strformat("no NIXL plugin '%s' (NIXL_PLUGIN_DIR=%s; found: %s)",
                                   backend.c_str(), dir != nullptr ? dir : "(unset)",
                                   join_plugins(plugins).c_str()));
    }
    nixl_mem_list_t mems;
    nixl_b_params_t params;
    const nixl_status_t loaded = a.agent->getPluginParams(backend, mems, params);
    if (loaded == NIXL_ERR_NOT_FOUND) {
        return not_found(
            strformat("NIXL plugin '%s' was found but did not load (NIXL_LOG_LEVEL=INFO says "
                      "why; often a library of the plugin's that LD_LIBRARY_PATH must name)",
                      backend.c_str()));
    }
    TCPX_RETURN_IF_ERROR(from_nixl(loaded, "getPluginParams"));
    if (backend == "TCPX" && !o.interface.empty()) params["interface"] = o.interface;
    for (const auto& [b, kv] : o.params) {
        if (b == backend) params[kv.first] = kv.second;
    }
    const nixl_mem_t seg = o.vram ? VRAM_SEG : DRAM_SEG;
    if (std::find(mems.begin(), mems.end(), seg) == mems.end()) {
        return unimplemented(strformat("backend %s does not take %s", backend.c_str(),
                                       nixlEnumStrings::memTypeStr(seg).c_str()));
    }
    TCPX_RETURN_IF_ERROR(from_nixl(a.agent->createBackend(backend, params, a.backend),
                                   "creating backend " + backend));
    TCPX_RETURN_IF_ERROR(
        from_nixl(a.agent->getBackendParams(a.backend, mems, a.params), "getBackendParams"));
    return a;
}

nixl_reg_dlist_t region_dlist(const Memory& m) {
    nixl_reg_dlist_t d(m.segment());
    d.addDesc(nixlBlobDesc(reinterpret_cast<uintptr_t>(m.data()), m.size(), m.dev_id(), ""));
    return d;
}

}  // namespace tcpx::bench::nixl_bench
