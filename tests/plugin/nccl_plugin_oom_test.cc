// Out of memory inside the NCCL plugin's entry points: an allocation that fails (AllocFault, on
// the calling thread, as NCCL's proxy thread calls) makes the call return ncclSystemError, never
// throw into NCCL (which would end the process). NCCL aborts a communicator on any error, so
// the comms the failures touched are closed, and fresh ones move bytes again.
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "net/ncclnet_newer.h"
#include "tests/support/alloc_fault.h"
#include "tests/support/net_test_util.h"

namespace tcpx {
namespace nccl_oom {  // the binary is one unity build: its own names

const tcpx_ncclNet_v9_t* v9() {
    static void* lib = [] {
        testing::set_socket_env(testing::loopback_settings());
        return ::dlopen(TCPX_NCCL_PLUGIN_PATH, RTLD_NOW | RTLD_LOCAL);
    }();
    if (lib == nullptr) return nullptr;
    return static_cast<const tcpx_ncclNet_v9_t*>(::dlsym(lib, "ncclNetPlugin_v9"));
}

struct Pair {
    void* listen = nullptr;
    void* send = nullptr;
    void* recv = nullptr;
};

// A connected send/recv pair over loopback through the table (nothing armed).
bool open_pair(const tcpx_ncclNet_v9_t* t, Pair* p) {
    char handle[TCPX_NCCL_NET_HANDLE_MAXSIZE] = {};
    if (t->listen(0, handle, &p->listen) != tcpx_ncclSuccess) return false;
    tcpx_ncclNetDeviceHandle_t dev{};
    tcpx_ncclNetDeviceHandle_t* devp = &dev;
    for (int i = 0; i < 100000 && (p->send == nullptr || p->recv == nullptr); ++i) {
        if (p->send == nullptr && t->connect(0, handle, &p->send, &devp) != tcpx_ncclSuccess) {
            return false;
        }
        if (p->recv == nullptr && t->accept(p->listen, &p->recv, &devp) != tcpx_ncclSuccess) {
            return false;
        }
    }
    return p->send != nullptr && p->recv != nullptr;
}

void close_pair(const tcpx_ncclNet_v9_t* t, Pair* p) {
    EXPECT_EQ(t->closeSend(p->send), tcpx_ncclSuccess);
    EXPECT_EQ(t->closeRecv(p->recv), tcpx_ncclSuccess);
    EXPECT_EQ(t->closeListen(p->listen), tcpx_ncclSuccess);
}

// A 64 KiB message from send to recv, every byte checked.
void expect_message_moves(const tcpx_ncclNet_v9_t* t, const Pair& p) {
    std::vector<char> out(64 << 10), in(64 << 10, 0);
    for (size_t i = 0; i < out.size(); ++i) out[i] = static_cast<char>(i * 7 + 3);
    void* smh = nullptr;
    void* rmh = nullptr;
    ASSERT_EQ(t->regMr(p.send, out.data(), out.size(), TCPX_NCCL_PTR_HOST, &smh), tcpx_ncclSuccess);
    ASSERT_EQ(t->regMr(p.recv, in.data(), in.size(), TCPX_NCCL_PTR_HOST, &rmh), tcpx_ncclSuccess);
    void* sreq = nullptr;
    void* rreq = nullptr;
    void* data[1] = {in.data()};
    size_t sizes[1] = {in.size()};
    int tags[1] = {5};
    void* mhs[1] = {rmh};
    for (int i = 0; i < 100000 && (sreq == nullptr || rreq == nullptr); ++i) {
        if (sreq == nullptr) {
            ASSERT_EQ(t->isend(p.send, out.data(), out.size(), 5, smh, &sreq), tcpx_ncclSuccess);
        }
        if (rreq == nullptr) {
            ASSERT_EQ(t->irecv(p.recv, 1, data, sizes, tags, mhs, &rreq), tcpx_ncclSuccess);
        }
    }
    ASSERT_TRUE(sreq != nullptr && rreq != nullptr);
    int sdone = 0, rdone = 0;
    for (int i = 0; i < 10000000 && (!sdone || !rdone); ++i) {
        int sz[1] = {};
        if (!sdone) {
            ASSERT_EQ(t->test(sreq, &sdone, sz), tcpx_ncclSuccess);
        }
        if (!rdone) {
            ASSERT_EQ(t->test(rreq, &rdone, sz), tcpx_ncclSuccess);
        }
    }
    ASSERT_TRUE(sdone && rdone);
    EXPECT_EQ(std::memcmp(out.data(), in.data(), out.size()), 0);
    EXPECT_EQ(t->deregMr(p.send, smh), tcpx_ncclSuccess);
    EXPECT_EQ(t->deregMr(p.recv, rmh), tcpx_ncclSuccess);
}

// Whether the plugin allocates through this binary's operator new. It does where the C++
// runtime is a shared library (the plugin's operator new binds to the program's); a toolchain
// that links the runtime into each binary statically gives the plugin its own, out of reach.
bool faults_reach_plugin(const tcpx_ncclNet_v9_t* t) {
    tcpx_ncclNetProperties_v9_t props{};
    test::AllocFault fault("", 0, 1000000);
    (void)t->getProperties(12345, &props);  // no such device: the error's message is allocated
    return fault.failed() > 0;
}

// NCCL's logger formats each line into a buffer of its own, as this one does.
int g_logged = 0;
void formatting_logger(int, unsigned long, const char*, int, const char* fmt, ...) {
    char line[1024];
    va_list args;
    va_start(args, fmt);
    std::vsnprintf(line, sizeof(line), fmt, args);
    va_end(args);
    ++g_logged;
}

// With a logger, as NCCL inits the plugin: every error the faults cause is logged through it,
// from the entry points' catch handlers. (The plugin's sink once copied each line into a
// std::string: out of memory there, the handler threw and the process was terminated.)
TEST(NcclPluginOom, AnEntryPointOutOfMemoryReturnsSystemErrorAndThePluginGoesOn) {
    const auto* t = v9();
    ASSERT_NE(t, nullptr) << ::dlerror();
    ASSERT_EQ(t->init(formatting_logger), tcpx_ncclSuccess);
    if (!faults_reach_plugin(t)) {
        GTEST_SKIP() << "the plugin has an operator new of its own (the C++ runtime is linked "
                        "into it statically here): allocation faults cannot reach it";
    }
    int hits = 0;
    for (long skip = 0; skip < 4; ++skip) {
        SCOPED_TRACE("allocation " + std::to_string(skip));
        tcpx_ncclNetProperties_v9_t props{};
        hits += test::fails_with(tcpx_ncclSystemError, "getProperties", skip,
                                 [&] { return t->getProperties(0, &props); });
        char handle[TCPX_NCCL_NET_HANDLE_MAXSIZE] = {};
        void* listen = nullptr;
        if (test::fails_with(tcpx_ncclSystemError, "listen", skip,
                             [&] { return t->listen(0, handle, &listen); })) {
            ++hits;
        } else if (listen != nullptr) {
            EXPECT_EQ(t->closeListen(listen), tcpx_ncclSuccess);
        }
        Pair p;
        ASSERT_TRUE(open_pair(t, &p));
        std::vector<char> buf(4096, 1);
        void* mh = nullptr;
        if (test::fails_with(tcpx_ncclSystemError, "regMr", skip, [&] {
                return t->regMr(p.send, buf.data(), buf.size(), TCPX_NCCL_PTR_HOST, &mh);
            })) {
            ++hits;
            EXPECT_EQ(mh, nullptr);
            ASSERT_EQ(t->regMr(p.send, buf.data(), buf.size(), TCPX_NCCL_PTR_HOST, &mh),
                      tcpx_ncclSuccess);
        }
        void* rmh = nullptr;
        ASSERT_EQ(t->regMr(p.recv, buf.data(), buf.size(), TCPX_NCCL_PTR_HOST, &rmh),
                  tcpx_ncclSuccess);
        // A post: ncclSystemError where the allocation failed before its request was queued;
        // where after, the request is NCCL's, and ends: with an error its test() reports when
        // the comm failed for it, or done (an allocation the transport could do without).
        const auto post = [&](const char* what, void** r, auto call) {
            tcpx_ncclResult_t rc = tcpx_ncclSuccess;
            {
                test::AllocFault fault("", skip, 1);
                rc = call();
                if (fault.failed() == 0) return;
            }
            ++hits;
            if (rc == tcpx_ncclSystemError) return;
            ASSERT_EQ(rc, tcpx_ncclSuccess) << what;
            ASSERT_NE(*r, nullptr) << what;
            int done = 0;
            tcpx_ncclResult_t tested = tcpx_ncclSuccess;
            for (int i = 0; i < 10000000 && !done && tested == tcpx_ncclSuccess; ++i) {
                tested = t->test(*r, &done, nullptr);
            }
            EXPECT_TRUE(done || tested != tcpx_ncclSuccess) << what << ": its request never ended";
        };
        void* req = nullptr;
        post("isend", &req, [&] { return t->isend(p.send, buf.data(), 100, 1, mh, &req); });
        void* data[1] = {buf.data()};
        size_t sizes[1] = {buf.size()};
        int tags[1] = {1};
        void* mhs[1] = {rmh};
        void* rreq = nullptr;
        post("irecv", &rreq, [&] { return t->irecv(p.recv, 1, data, sizes, tags, mhs, &rreq); });
        // What the failures touched ends with its comms (NCCL aborts on any error).
        EXPECT_EQ(t->deregMr(p.send, mh), tcpx_ncclSuccess);
        EXPECT_EQ(t->deregMr(p.recv, rmh), tcpx_ncclSuccess);
        close_pair(t, &p);
    }
    // The test means something only if the faults hit: these calls allocate.
    EXPECT_GE(hits, 4);
    EXPECT_GT(g_logged, 0);  // (the errors went through the logger)
    // Memory back: a fresh pair moves a message byte for byte.
    Pair p;
    ASSERT_TRUE(open_pair(t, &p));
    expect_message_moves(t, p);
    close_pair(t, &p);
}

}  // namespace nccl_oom
}  // namespace tcpx
