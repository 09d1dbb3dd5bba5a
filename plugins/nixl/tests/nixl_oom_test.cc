// Out of memory inside the TCPX backend's entry points. The backend is created straight from
// libplugin_TCPX.so (nixl_plugin_init, create_engine), without an agent, so that an allocation
// made to fail (AllocFault, on the calling thread) is one of the backend's own, not NIXL's: the
// call returns NIXL_ERR_BACKEND and never throws into NIXL, and the backend goes on working.
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "backend/backend_plugin.h"
#include "nixl_test_util.h"
#include "tests/support/alloc_fault.h"

namespace tcpx::nixl_test {
namespace {

TEST(NixlOom, AnEntryPointOutOfMemoryIsAnErrorAndTheBackendGoesOn) {
    void* lib = ::dlopen(TCPX_NIXL_PLUGIN_DIR "/libplugin_TCPX.so", RTLD_NOW | RTLD_LOCAL);
    ASSERT_NE(lib, nullptr) << ::dlerror();
    auto init = reinterpret_cast<nixlBackendPlugin* (*)()>(::dlsym(lib, "nixl_plugin_init"));
    ASSERT_NE(init, nullptr);
    nixlBackendPlugin* plugin = init();
    ASSERT_NE(plugin, nullptr);
    nixl_b_params_t params = loopback_params();
    nixlBackendInitParams ip;
    ip.localAgent = "oom-agent";
    ip.type = "TCPX";
    ip.customParams = &params;
    ip.enableProgTh = true;
    ip.syncMode = nixl_thread_sync_t::NIXL_THREAD_SYNC_DEFAULT;
    nixlBackendEngine* engine = plugin->create_engine(&ip);
    ASSERT_NE(engine, nullptr);
    ASSERT_FALSE(engine->getInitErr());

    std::vector<uint8_t> buf(1 << 20, 7);
    const nixlBlobDesc desc(reinterpret_cast<uintptr_t>(buf.data()), buf.size(), 0, "");
    int hits = 0;
    for (long skip = 0; skip < 12; ++skip) {
        SCOPED_TRACE("allocation " + std::to_string(skip));
        nixlBackendMD* md = nullptr;
        if (test::fails_with(NIXL_ERR_BACKEND, "registerMem", skip,
                             [&] { return engine->registerMem(desc, DRAM_SEG, md); })) {
            ++hits;
            continue;
        }
        ASSERT_NE(md, nullptr);
        std::string pub, conn;
        hits += test::fails_with(NIXL_ERR_BACKEND, "getPublicData", skip,
                                 [&] { return engine->getPublicData(md, pub); });
        hits += test::fails_with(NIXL_ERR_BACKEND, "getConnInfo", skip,
                                 [&] { return engine->getConnInfo(conn); });
        nixlBackendMD* local = nullptr;
        if (test::fails_with(NIXL_ERR_BACKEND, "loadLocalMD", skip,
                             [&] { return engine->loadLocalMD(md, local); })) {
            ++hits;
        } else {
            ASSERT_NE(local, nullptr);
            EXPECT_EQ(engine->unloadMD(local), NIXL_SUCCESS);
        }
        EXPECT_EQ(engine->deregisterMem(md), NIXL_SUCCESS);
    }
    EXPECT_GE(hits, 3);  // these calls allocate: the faults hit
    // Memory back: the backend answers as before.
    nixlBackendMD* md = nullptr;
    ASSERT_EQ(engine->registerMem(desc, DRAM_SEG, md), NIXL_SUCCESS);
    std::string pub;
    EXPECT_EQ(engine->getPublicData(md, pub), NIXL_SUCCESS);
    EXPECT_FALSE(pub.empty());
    EXPECT_EQ(engine->deregisterMem(md), NIXL_SUCCESS);
    plugin->destroy_engine(engine);
}

}  // namespace
}  // namespace tcpx::nixl_test
