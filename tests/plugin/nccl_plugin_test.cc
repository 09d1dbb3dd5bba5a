// The NCCL net plugin (plugins/nccl, libnccl-net-tcpxp2p.so) through its raw C tables, as NCCL
// calls them: what it exports, each version's properties, v11's contexts, and bad arguments. The
// data path of every exported table runs the whole net conformance suite (Providers/NetTest,
// NcclPluginV7 to V11); this file checks what that suite cannot see through the adapter.
#include <dlfcn.h>
#include <elf.h>
#include <gtest/gtest.h>
#include <sys/mman.h>

#include <atomic>
#include <chrono>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <thread>
#include <vector>

#include "net/ncclnet_newer.h"
#include "tests/support/net_test_util.h"
#include "tests/support/sysfs_tree.h"

namespace tcpx {
namespace {

void* plugin() {
    static void* lib = [] {
        testing::set_socket_env(testing::loopback_settings());
        return ::dlopen(TCPX_NCCL_PLUGIN_PATH, RTLD_NOW | RTLD_LOCAL);
    }();
    return lib;
}

template <typename Table>
const Table* table(int version) {
    if (plugin() == nullptr) return nullptr;
    return static_cast<const Table*>(
        ::dlsym(plugin(), ("ncclNetPlugin_v" + std::to_string(version)).c_str()));
}

std::atomic<int> g_log_lines{0};
void count_logger(int, unsigned long, const char*, int, const char*, ...) { ++g_log_lines; }

TEST(NcclPlugin, ExportsV7ToV11UnderItsName) {
    ASSERT_NE(plugin(), nullptr) << ::dlerror();
    for (int v = 1; v <= 16; ++v) {
        const void* sym = ::dlsym(plugin(), ("ncclNetPlugin_v" + std::to_string(v)).c_str());
        EXPECT_EQ(sym != nullptr, v >= 7 && v <= 11) << "ncclNetPlugin_v" << v;
        // Every table starts with its name.
        if (sym != nullptr) {
            EXPECT_STREQ(*static_cast<const char* const*>(sym), "tcpxp2p");
        }
    }
    // Nothing of the transport inside leaks out (a second copy of tcpx-p2p in NCCL's process
    // must not bind to it): the tables are the only symbols.
    EXPECT_EQ(::dlsym(plugin(), "_ZN4tcpx3net12socket_net_v7Ev"), nullptr);
}

// The plugin makes no CUDA call, and cannot: it carries no CUDA runtime and needs no CUDA
// library. A CUDA call in NCCL's proxy thread can wait for NCCL's own kernels, which wait for that
// thread: another thread of the application loading a kernel (CUDA's lazy loading) at that moment
// is enough. Our GPU-staging try hung torch.distributed that way (docs/nccl-plugin.md, GPU
// buffers). This keeps a CUDA dependency from coming back unnoticed.
TEST(NcclPlugin, CarriesNoCudaRuntime) {
    std::ifstream f(TCPX_NCCL_PLUGIN_PATH, std::ios::binary);
    ASSERT_TRUE(f) << TCPX_NCCL_PLUGIN_PATH;
    const std::string bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    ASSERT_GT(bytes.size(), 4096u);
    EXPECT_NE(bytes.find("ncclNetPlugin_v7"), std::string::npos);  // the scan sees the file
    for (const char* cuda : {"libcuda.so", "libcudart", "cudaMemcpy", "cuMemcpy"}) {
        EXPECT_EQ(bytes.find(cuda), std::string::npos) << "the plugin carries " << cuda;
    }
}

// NCCL may unload its net plugin when the last communicator is finalized (dlclose, with
// NET_PLUGIN_REF_COUNT at 0), but the transport inside keeps its I/O threads (a process-wide
// object, never torn down): unmapped, their code would crash the process. The plugin is linked
// -z nodelete so that dlclose leaves it mapped; this reads that flag from its dynamic section.
TEST(NcclPlugin, StaysLoadedAfterDlclose) {
    std::ifstream f(TCPX_NCCL_PLUGIN_PATH, std::ios::binary);
    ASSERT_TRUE(f) << TCPX_NCCL_PLUGIN_PATH;
    const std::string bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    ASSERT_GE(bytes.size(), sizeof(Elf64_Ehdr));
    Elf64_Ehdr eh;
    std::memcpy(&eh, bytes.data(), sizeof(eh));
    ASSERT_EQ(std::memcmp(eh.e_ident, ELFMAG, SELFMAG), 0);
    ASSERT_EQ(eh.e_ident[EI_CLASS], ELFCLASS64);
    bool nodelete = false;
    bool dynamic = false;
    for (int i = 0; i < eh.e_phnum; ++i) {
        Elf64_Phdr ph;
        const size_t at = eh.e_phoff + static_cast<size_t>(i) * eh.e_phentsize;
        ASSERT_LE(at + sizeof(ph), bytes.size());
        std::memcpy(&ph, bytes.data() + at, sizeof(ph));
        if (ph.p_type != PT_DYNAMIC) continue;
        dynamic = true;
        for (size_t d = ph.p_offset; d + sizeof(Elf64_Dyn) <= ph.p_offset + ph.p_filesz &&
                                     d + sizeof(Elf64_Dyn) <= bytes.size();
             d += sizeof(Elf64_Dyn)) {
            Elf64_Dyn dyn;
            std::memcpy(&dyn, bytes.data() + d, sizeof(dyn));
            if (dyn.d_tag == DT_NULL) break;
            if (dyn.d_tag == DT_FLAGS_1 && (dyn.d_un.d_val & DF_1_NODELETE) != 0) nodelete = true;
        }
    }
    ASSERT_TRUE(dynamic) << "no dynamic section";
    EXPECT_TRUE(nodelete) << "the plugin is not linked -z nodelete";
}

// v7 and v8 through their own structs: the core's properties, v8's regIsGlobal.
TEST(NcclPlugin, V7AndV8Properties) {
    const auto* v7 = table<tcpx_ncclNet_v7_t>(7);
    const auto* v8 = table<tcpx_ncclNet_v8_t>(8);
    ASSERT_TRUE(v7 != nullptr && v8 != nullptr);
    ASSERT_EQ(v8->init(count_logger), tcpx_ncclSuccess);
    int ndev = 0;
    ASSERT_EQ(v8->devices(&ndev), tcpx_ncclSuccess);
    ASSERT_GE(ndev, 1);
    tcpx_ncclNetProperties_v7_t p7{};
    tcpx_ncclNetProperties_v8_t p8{};
    ASSERT_EQ(v7->getProperties(0, &p7), tcpx_ncclSuccess);
    ASSERT_EQ(v8->getProperties(0, &p8), tcpx_ncclSuccess);
    EXPECT_STREQ(p8.name, p7.name);
    EXPECT_EQ(p8.guid, p7.guid);
    EXPECT_EQ(p8.ptrSupport, p7.ptrSupport);
    EXPECT_NE(p8.ptrSupport & TCPX_NCCL_PTR_HOST, 0);
    EXPECT_EQ(p8.regIsGlobal, 0);
    EXPECT_EQ(p8.speed, p7.speed);
    EXPECT_GT(p8.speed, 0);
    EXPECT_EQ(p8.maxComms, p7.maxComms);
    EXPECT_GT(p8.maxComms, 0);
    // One receive per request: NCCL groups receives of several source ranks on one connection
    // only where maxRecvs > 1, and their sends would then land in each other's buffers.
    EXPECT_EQ(p7.maxRecvs, 1);
    EXPECT_EQ(p8.maxRecvs, 1);
    EXPECT_EQ(v8->getProperties(0, nullptr), tcpx_ncclInvalidArgument);
    EXPECT_NE(v8->getProperties(ndev, &p8), tcpx_ncclSuccess);
    EXPECT_NE(v8->getProperties(-1, &p8), tcpx_ncclSuccess);
}

// v9 on: the largest request is what the core's int sizes allow, one physical device per
// virtual one, nothing to flush; v11 takes one request per receive.
TEST(NcclPlugin, V9ToV11Properties) {
    const auto* v9 = table<tcpx_ncclNet_v9_t>(9);
    const auto* v10 = table<tcpx_ncclNet_v10_t>(10);
    const auto* v11 = table<tcpx_ncclNet_v11_t>(11);
    ASSERT_TRUE(v9 != nullptr && v10 != nullptr && v11 != nullptr);
    ASSERT_EQ(v9->init(count_logger), tcpx_ncclSuccess);
    tcpx_ncclNetProperties_v9_t p9{};
    tcpx_ncclNetProperties_v10_t p10{};
    tcpx_ncclNetProperties_v11_t p11{};
    ASSERT_EQ(v9->getProperties(0, &p9), tcpx_ncclSuccess);
    ASSERT_EQ(v10->getProperties(0, &p10), tcpx_ncclSuccess);
    ASSERT_EQ(v11->getProperties(0, &p11), tcpx_ncclSuccess);
    for (const tcpx_ncclNetProperties_v9_t* p : {&p9, &p10}) {
        EXPECT_EQ(p->maxP2pBytes, static_cast<size_t>(INT_MAX));
        EXPECT_EQ(p->maxCollBytes, static_cast<size_t>(INT_MAX));
        EXPECT_EQ(p->forceFlush, 0);
        EXPECT_EQ(p->vProps.ndevs, 1);
        EXPECT_EQ(p->vProps.devs[0], 0);
        EXPECT_GT(p->speed, 0);
    }
    EXPECT_EQ(p11.maxP2pBytes, static_cast<size_t>(INT_MAX));
    EXPECT_EQ(p11.maxMultiRequestSize, 1);
    EXPECT_EQ(p11.vProps.ndevs, 1);
    EXPECT_STREQ(p11.name, p9.name);
    EXPECT_EQ(p9.maxRecvs, 1);
    EXPECT_EQ(p10.maxRecvs, 1);
    EXPECT_EQ(p11.maxRecvs, 1);
    // No virtual NICs: no makeVDevice, so NCCL uses the devices as they are (one that refuses
    // still sends NCCL down its NIC-merging path).
    EXPECT_EQ(v9->makeVDevice, nullptr);
    EXPECT_EQ(v10->makeVDevice, nullptr);
    EXPECT_EQ(v11->makeVDevice, nullptr);
}

// v11: init makes a context per communicator; listen, connect and setNetAttr take only contexts
// it made; finalize ends one (twice is an error, never a double free).
TEST(NcclPlugin, V11ContextsAreCheckedAndFinalized) {
    const auto* v11 = table<tcpx_ncclNet_v11_t>(11);
    ASSERT_NE(v11, nullptr);
    tcpx_ncclNetCommConfig_t config{TCPX_NCCL_NET_TRAFFIC_CLASS_UNDEF};
    void* a = nullptr;
    void* b = nullptr;
    ASSERT_EQ(v11->init(&a, 1, &config, count_logger, nullptr), tcpx_ncclSuccess);
    ASSERT_EQ(v11->init(&b, 2, nullptr, count_logger, nullptr), tcpx_ncclSuccess);
    ASSERT_NE(a, nullptr);
    EXPECT_NE(a, b);
    EXPECT_EQ(v11->init(nullptr, 3, &config, count_logger, nullptr), tcpx_ncclInvalidArgument);

    char handle[TCPX_NCCL_NET_HANDLE_MAXSIZE] = {};
    void* listen = nullptr;
    int foreign = 0;
    EXPECT_EQ(v11->listen(&foreign, 0, handle, &listen), tcpx_ncclInvalidUsage);
    EXPECT_EQ(listen, nullptr);
    ASSERT_EQ(v11->listen(a, 0, handle, &listen), tcpx_ncclSuccess);
    ASSERT_NE(listen, nullptr);
    tcpx_ncclNetAttr_t attr{};
    EXPECT_EQ(v11->setNetAttr(a, &attr), tcpx_ncclSuccess);
    EXPECT_EQ(v11->setNetAttr(&foreign, &attr), tcpx_ncclInvalidUsage);
    EXPECT_EQ(v11->closeListen(listen), tcpx_ncclSuccess);

    EXPECT_EQ(v11->finalize(a), tcpx_ncclSuccess);
    EXPECT_EQ(v11->finalize(a), tcpx_ncclInvalidUsage);
    void* send = nullptr;
    EXPECT_EQ(v11->connect(a, 0, handle, &send, nullptr), tcpx_ncclInvalidUsage);
    EXPECT_EQ(v11->finalize(b), tcpx_ncclSuccess);
    EXPECT_EQ(v11->finalize(&foreign), tcpx_ncclInvalidUsage);
}

// A connected pair over loopback, through the v9 table itself.
void connected_pair(const tcpx_ncclNet_v9_t* v9, void** listen, void** send, void** recv) {
    char handle[TCPX_NCCL_NET_HANDLE_MAXSIZE] = {};
    ASSERT_EQ(v9->listen(0, handle, listen), tcpx_ncclSuccess);
    tcpx_ncclNetDeviceHandle_t dev{};
    tcpx_ncclNetDeviceHandle_t* devp = &dev;
    for (int i = 0; i < 100000 && (*send == nullptr || *recv == nullptr); ++i) {
        if (*send == nullptr) {
            ASSERT_EQ(v9->connect(0, handle, send, &devp), tcpx_ncclSuccess);
        }
        if (*recv == nullptr) {
            ASSERT_EQ(v9->accept(*listen, recv, &devp), tcpx_ncclSuccess);
        }
    }
    ASSERT_TRUE(*send != nullptr && *recv != nullptr);
}

// Sizes the core cannot take (its ints) are refused, not truncated: a registration of more than
// INT_MAX bytes (v8 on), a send or receive of more (v9 on, whose sizes are size_t), more than 8
// grouped receives.
TEST(NcclPlugin, SizesPastTheCoresIntAreRefused) {
    const auto* v9 = table<tcpx_ncclNet_v9_t>(9);
    ASSERT_NE(v9, nullptr);
    ASSERT_EQ(v9->init(count_logger), tcpx_ncclSuccess);
    void* listen = nullptr;
    void* send = nullptr;
    void* recv = nullptr;
    ASSERT_NO_FATAL_FAILURE(connected_pair(v9, &listen, &send, &recv));
    std::vector<char> buf(4096);
    void* mh = nullptr;
    EXPECT_EQ(v9->regMr(send, buf.data(), size_t{INT_MAX} + 1, TCPX_NCCL_PTR_HOST, &mh),
              tcpx_ncclInvalidArgument);
    ASSERT_EQ(v9->regMr(send, buf.data(), buf.size(), TCPX_NCCL_PTR_HOST, &mh), tcpx_ncclSuccess);
    void* req = nullptr;
    EXPECT_EQ(v9->isend(send, buf.data(), size_t{INT_MAX} + 1, 0, mh, &req),
              tcpx_ncclInvalidArgument);
    EXPECT_EQ(req, nullptr);
    void* data[9];
    size_t sizes[9];
    int tags[9];
    void* mhs[9];
    for (int i = 0; i < 9; ++i) {
        data[i] = buf.data();
        sizes[i] = 16;
        tags[i] = i;
        mhs[i] = nullptr;
    }
    EXPECT_EQ(v9->irecv(recv, 9, data, sizes, tags, mhs, &req), tcpx_ncclInvalidArgument);
    sizes[0] = size_t{INT_MAX} + 1;
    EXPECT_EQ(v9->irecv(recv, 1, data, sizes, tags, mhs, &req), tcpx_ncclInvalidArgument);
    EXPECT_EQ(req, nullptr);
    EXPECT_EQ(v9->deregMr(send, mh), tcpx_ncclSuccess);
    EXPECT_EQ(v9->closeSend(send), tcpx_ncclSuccess);
    EXPECT_EQ(v9->closeRecv(recv), tcpx_ncclSuccess);
    EXPECT_EQ(v9->closeListen(listen), tcpx_ncclSuccess);
}

// NCCL's teardown of a connection (recvProxyFree: deregMr, free the buffers, then closeRecv), an
// abort's with receives still posted and the peer still sending: a receive pending on the
// registration's memory must fail at deregMr, and nothing may write there after (the I/O
// threads copied the peer's bytes into the unmapped buffer: SIGSEGV). Memory no request uses is
// deregistered without harm to the connection.
TEST(NcclPlugin, DeregWithAReceivePendingOnItFailsTheReceiveAndNothingWritesThere) {
    const auto* v9 = table<tcpx_ncclNet_v9_t>(9);
    ASSERT_NE(v9, nullptr);
    ASSERT_EQ(v9->init(count_logger), tcpx_ncclSuccess);
    void* listen = nullptr;
    void* send = nullptr;
    void* recv = nullptr;
    ASSERT_NO_FATAL_FAILURE(connected_pair(v9, &listen, &send, &recv));
    constexpr size_t kRegion = 1 << 20;
    void* region =
        ::mmap(nullptr, kRegion, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    ASSERT_NE(region, MAP_FAILED);
    std::vector<char> other(4096);
    void* region_mh = nullptr;
    void* other_mh = nullptr;
    ASSERT_EQ(v9->regMr(recv, region, kRegion, TCPX_NCCL_PTR_HOST, &region_mh), tcpx_ncclSuccess);
    ASSERT_EQ(v9->regMr(recv, other.data(), other.size(), TCPX_NCCL_PTR_HOST, &other_mh),
              tcpx_ncclSuccess);
    // Two receives into the region: an inline message and a chunked one.
    void* rreq[2] = {};
    for (int i = 0; i < 2; ++i) {
        void* data[1] = {static_cast<char*>(region) + i * (kRegion / 2)};
        size_t sizes[1] = {kRegion / 2};
        int tags[1] = {i};
        void* mhs[1] = {region_mh};
        ASSERT_EQ(v9->irecv(recv, 1, data, sizes, tags, mhs, &rreq[i]), tcpx_ncclSuccess);
        ASSERT_NE(rreq[i], nullptr);
    }
    // Memory no request uses: the connection is none the worse.
    EXPECT_EQ(v9->deregMr(recv, other_mh), tcpx_ncclSuccess);
    int done = 0;
    int size = 0;
    EXPECT_EQ(v9->test(rreq[0], &done, &size), tcpx_ncclSuccess);
    EXPECT_EQ(done, 0);
    // The region goes, as NCCL's teardown frees it.
    EXPECT_EQ(v9->deregMr(recv, region_mh), tcpx_ncclSuccess);
    ASSERT_EQ(::munmap(region, kRegion), 0);
    // The peer sends into it regardless.
    std::vector<char> payload(kRegion / 2, 'x');
    void* send_mh = nullptr;
    ASSERT_EQ(v9->regMr(send, payload.data(), payload.size(), TCPX_NCCL_PTR_HOST, &send_mh),
              tcpx_ncclSuccess);
    void* sreq[2] = {};
    const size_t send_sizes[2] = {100, payload.size()};
    for (int i = 0; i < 2; ++i) {
        for (int k = 0; k < 100000 && sreq[i] == nullptr; ++k) {
            if (v9->isend(send, payload.data(), send_sizes[i], i, send_mh, &sreq[i]) !=
                tcpx_ncclSuccess) {
                break;  // (the receiving side's failure may already show here)
            }
        }
    }
    for (int i = 0; i < 2; ++i) {
        tcpx_ncclResult_t rc = tcpx_ncclSuccess;
        done = 0;
        for (int k = 0; k < 2000 && rc == tcpx_ncclSuccess && done == 0; ++k) {
            rc = v9->test(rreq[i], &done, &size);
            if (rc == tcpx_ncclSuccess && done == 0) {
                std::this_thread::sleep_for(std::chrono::milliseconds(1));
            }
        }
        EXPECT_NE(rc, tcpx_ncclSuccess) << "receive " << i << " completed into freed memory";
    }
    for (int i = 0; i < 2; ++i) {
        for (int k = 0; k < 2000 && sreq[i] != nullptr; ++k) {
            done = 0;
            if (v9->test(sreq[i], &done, &size) != tcpx_ncclSuccess || done != 0) break;
            std::this_thread::sleep_for(std::chrono::milliseconds(1));
        }
    }
    EXPECT_EQ(v9->deregMr(send, send_mh), tcpx_ncclSuccess);
    EXPECT_EQ(v9->closeRecv(recv), tcpx_ncclSuccess);
    EXPECT_EQ(v9->closeSend(send), tcpx_ncclSuccess);
    EXPECT_EQ(v9->closeListen(listen), tcpx_ncclSuccess);
}

// What NCCL does when a net plugin's init fails: it goes on with its own transports. So a
// failed init must return an error (never abort the process), and every later call must fail
// cleanly too. Run in a fresh process (a death test re-executes this binary), where init has
// not run yet, with an interface that does not exist.
TEST(NcclPlugin, FailedInitIsAnErrorAndLeavesThePluginInert) {
    GTEST_FLAG_SET(death_test_style, "threadsafe");
    EXPECT_EXIT(
        {
            const auto* v7 = table<tcpx_ncclNet_v7_t>(7);
            const auto* v11 = table<tcpx_ncclNet_v11_t>(11);
            if (v7 == nullptr || v11 == nullptr) std::_Exit(10);
            ::setenv("TCPX_P2P_SOCKET_IFNAME", "=tcpx-no-such-if0", 1);
            ::unsetenv("NCCL_P2P_NET_CHUNKSIZE");
            if (v7->init(count_logger) == tcpx_ncclSuccess) std::_Exit(11);
            void* ctx = nullptr;
            if (v11->init(&ctx, 1, nullptr, count_logger, nullptr) == tcpx_ncclSuccess) {
                std::_Exit(12);
            }
            int ndev = -1;
            if (v7->devices(&ndev) == tcpx_ncclSuccess) std::_Exit(13);
            char handle[TCPX_NCCL_NET_HANDLE_MAXSIZE] = {};
            void* listen = nullptr;
            if (v7->listen(0, handle, &listen) == tcpx_ncclSuccess) std::_Exit(14);
            if (g_log_lines.load() == 0) std::_Exit(15);  // the reason went to NCCL's log
            // NCCL falls back to its own transport with its own settings.
            if (std::getenv("NCCL_P2P_NET_CHUNKSIZE") != nullptr) std::_Exit(16);
            std::_Exit(0);
        },
        ::testing::ExitedWithCode(0), "");
}

// NCCL reads its P2P chunk size (and channels per network peer) from the environment after the
// network's init: the plugin's init puts its values there, never over the user's, and a later
// init updates (or takes away) what an earlier one put there when its parameters changed.
TEST(NcclPlugin, InitProvidesNcclSettingsTheEnvironmentLacks) {
    GTEST_FLAG_SET(death_test_style, "threadsafe");
    EXPECT_EXIT(
        {
            const auto* v7 = table<tcpx_ncclNet_v7_t>(7);
            const auto* v11 = table<tcpx_ncclNet_v11_t>(11);
            if (v7 == nullptr || v11 == nullptr) std::_Exit(10);
            for (const char* name :
                 {"NCCL_P2P_NET_CHUNKSIZE", "NCCL_NCHANNELS_PER_NET_PEER",
                  "TCPX_P2P_NCCL_P2P_CHUNK_SIZE", "TCPX_P2P_NCCL_CHANNELS_PER_PEER"}) {
                ::unsetenv(name);
            }
            auto is = [](const char* name, const char* want) {
                const char* got = std::getenv(name);
                return want == nullptr ? got == nullptr
                                       : got != nullptr && std::strcmp(got, want) == 0;
            };
            // The defaults: 512 KiB chunks; NCCL's own channel count.
            if (v7->init(count_logger) != tcpx_ncclSuccess) std::_Exit(11);
            if (!is("NCCL_P2P_NET_CHUNKSIZE", "524288")) std::_Exit(12);
            if (!is("NCCL_NCHANNELS_PER_NET_PEER", nullptr)) std::_Exit(13);
            // The user's value stays; the plugin's own parameters choose the others.
            ::setenv("NCCL_P2P_NET_CHUNKSIZE", "65536", 1);
            ::setenv("TCPX_P2P_NCCL_CHANNELS_PER_PEER", "4", 1);
            void* ctx = nullptr;
            if (v11->init(&ctx, 1, nullptr, count_logger, nullptr) != tcpx_ncclSuccess) {
                std::_Exit(14);
            }
            if (!is("NCCL_P2P_NET_CHUNKSIZE", "65536")) std::_Exit(15);
            if (!is("NCCL_NCHANNELS_PER_NET_PEER", "4")) std::_Exit(16);
            // 0 leaves NCCL's.
            ::unsetenv("NCCL_P2P_NET_CHUNKSIZE");
            ::setenv("TCPX_P2P_NCCL_P2P_CHUNK_SIZE", "0", 1);
            if (v7->init(count_logger) != tcpx_ncclSuccess) std::_Exit(17);
            if (!is("NCCL_P2P_NET_CHUNKSIZE", nullptr)) std::_Exit(18);
            // What an earlier init set (NCCL_NCHANNELS_PER_NET_PEER=4, above) is the plugin's:
            // it follows the plugin's parameters, to another value or away.
            ::setenv("TCPX_P2P_NCCL_CHANNELS_PER_PEER", "8", 1);
            if (v7->init(count_logger) != tcpx_ncclSuccess) std::_Exit(19);
            if (!is("NCCL_NCHANNELS_PER_NET_PEER", "8")) std::_Exit(20);
            ::setenv("TCPX_P2P_NCCL_CHANNELS_PER_PEER", "0", 1);
            if (v7->init(count_logger) != tcpx_ncclSuccess) std::_Exit(21);
            if (!is("NCCL_NCHANNELS_PER_NET_PEER", nullptr)) std::_Exit(22);
            // The user's, set over the plugin's, is the user's from then on.
            ::setenv("TCPX_P2P_NCCL_CHANNELS_PER_PEER", "4", 1);
            if (v7->init(count_logger) != tcpx_ncclSuccess) std::_Exit(23);
            ::setenv("NCCL_NCHANNELS_PER_NET_PEER", "2", 1);
            if (v7->init(count_logger) != tcpx_ncclSuccess) std::_Exit(24);
            if (!is("NCCL_NCHANNELS_PER_NET_PEER", "2")) std::_Exit(25);
            ::setenv("TCPX_P2P_NCCL_CHANNELS_PER_PEER", "0", 1);
            if (v7->init(count_logger) != tcpx_ncclSuccess) std::_Exit(26);
            if (!is("NCCL_NCHANNELS_PER_NET_PEER", "2")) std::_Exit(27);
            std::_Exit(0);
        },
        ::testing::ExitedWithCode(0), "");
}

// One NCCL device per interface, each with the PCI path the GPU-to-NIC map reads (NCCL pairs
// GPUs with devices by it): lo stands for eth1 of an A3-high fixture, in a fresh process whose
// TCPX_P2P_SYSFS_ROOT points at the fixture.
TEST(NcclPlugin, DevicesCarryTheirPciPathAndSpeed) {
    GTEST_FLAG_SET(death_test_style, "threadsafe");
    auto tree = testing::SysfsTree::a3_high();
    const std::string chain = "pci0000:10/0000:10:01.0/0000:11:00.0/0000:12:02.0/0000:15:00.0";
    tree->add_nic("lo", chain, 0, 200000);
    const std::string expected = std::filesystem::canonical(tree->root() + "/devices/" + chain);
    // The lambda returns the child's exit code; the child then drops its own copy of the
    // fixture (gtest's threadsafe style re-runs this body, mkdtemp included, in a fresh process),
    // which std::_Exit would otherwise leave in the temporary directory.
    const auto check = [&]() -> int {
        const auto* v9 = table<tcpx_ncclNet_v9_t>(9);
        if (v9 == nullptr) return 10;
        ::setenv("TCPX_P2P_SYSFS_ROOT", tree->root().c_str(), 1);
        if (v9->init(count_logger) != tcpx_ncclSuccess) return 11;
        int ndev = 0;
        if (v9->devices(&ndev) != tcpx_ncclSuccess || ndev != 1) return 12;
        tcpx_ncclNetProperties_v9_t p{};
        if (v9->getProperties(0, &p) != tcpx_ncclSuccess) return 13;
        if (p.pciPath == nullptr || expected != p.pciPath) return 14;
        if (p.speed != 200000) return 15;
        return 0;
    };
    EXPECT_EXIT(
        {
            const int code = check();
            tree.reset();
            std::_Exit(code);
        },
        ::testing::ExitedWithCode(0), "");
}

}  // namespace
}  // namespace tcpx
