// Out of memory inside the TCPX backend's entry points. The backend is created straight from
// libplugin_TCPX.so (nixl_plugin_init, create_engine), without an agent, so that an allocation
// made to fail (AllocFault, on the calling thread) is one of the backend's own, not NIXL's: the
// call returns NIXL_ERR_BACKEND and never throws into NIXL, and the backend goes on working.
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "backend/backend_plugin.h"
#include "common/socket.h"
#include "engine/metadata.h"
#include "nixl_test_util.h"
#include "tests/support/alloc_fault.h"

namespace tcpx::nixl_test {
namespace {

// The plugin, loaded as NIXL loads it, and backends made from it.
class Plugin {
 public:
    Plugin() {
        lib_ = ::dlopen(TCPX_NIXL_PLUGIN_DIR "/libplugin_TCPX.so", RTLD_NOW | RTLD_LOCAL);
        EXPECT_NE(lib_, nullptr) << ::dlerror();
        if (lib_ == nullptr) return;
        auto init = reinterpret_cast<nixlBackendPlugin* (*)()>(::dlsym(lib_, "nixl_plugin_init"));
        EXPECT_NE(init, nullptr);
        if (init != nullptr) plugin_ = init();
        EXPECT_NE(plugin_, nullptr);
    }
    ~Plugin() {
        for (nixlBackendEngine* e : engines_) plugin_->destroy_engine(e);
    }
    Plugin(const Plugin&) = delete;
    Plugin& operator=(const Plugin&) = delete;

    // A backend of agent `name` (with a progress thread), or null.
    nixlBackendEngine* make(const std::string& name) {
        if (plugin_ == nullptr) return nullptr;
        nixlBackendInitParams ip;
        ip.localAgent = name;
        ip.type = "TCPX";
        ip.customParams = &params_;
        ip.enableProgTh = true;
        ip.syncMode = nixl_thread_sync_t::NIXL_THREAD_SYNC_DEFAULT;
        nixlBackendEngine* engine = plugin_->create_engine(&ip);
        if (engine != nullptr && engine->getInitErr()) {
            plugin_->destroy_engine(engine);
            return nullptr;
        }
        if (engine != nullptr) engines_.push_back(engine);
        return engine;
    }
    // A custom parameter for the backends made from now on.
    void set_param(const std::string& key, const std::string& value) { params_[key] = value; }
    // Destroys one made by make(), now.
    void destroy(nixlBackendEngine* e) {
        std::erase(engines_, e);
        plugin_->destroy_engine(e);
    }

 private:
    void* lib_ = nullptr;
    nixlBackendPlugin* plugin_ = nullptr;
    nixl_b_params_t params_ = loopback_params();
    std::vector<nixlBackendEngine*> engines_;
};

TEST(NixlOom, AnEntryPointOutOfMemoryIsAnErrorAndTheBackendGoesOn) {
    Plugin plugin;
    nixlBackendEngine* engine = plugin.make("oom-agent");
    ASSERT_NE(engine, nullptr);

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
}

// Long enough that each message is an allocation of its own (past the small-string buffer).
std::string message(int i) {
    return "a notification longer than a small string's own buffer, #" + std::to_string(i);
}

// getNotifs out of memory at each of its allocations in turn: it fails (NIXL_ERR_BACKEND) with
// nothing put in the list, which NIXL drops on an error, or succeeds with all of them; either
// way each notification is delivered exactly once, by it or by the calls after it (no loss, no
// duplicate, no empty "ghost" left from a half-moved one).
void expect_each_once_out_of_memory(nixlBackendEngine* sender, nixlBackendEngine* receiver,
                                    const std::string& to, const std::string& from) {
    constexpr int kCount = 3;
    int hits = 0;
    for (long skip = 0; skip < 32; ++skip) {
        SCOPED_TRACE("allocation " + std::to_string(skip));
        for (int i = 0; i < kCount; ++i) {
            ASSERT_EQ(sender->genNotif(to, message(i)), NIXL_SUCCESS);
        }
        if (sender != receiver) {
            // In the receiver's engine before the faulty call (its progress thread takes them).
            std::this_thread::sleep_for(std::chrono::milliseconds(200));
        }
        notif_list_t got;
        nixl_status_t st;
        bool hit;
        {
            test::AllocFault fault("", skip, 1);
            st = receiver->getNotifs(got);
            hit = fault.failed() > 0;
        }
        if (st != NIXL_SUCCESS) {
            EXPECT_EQ(st, NIXL_ERR_BACKEND);
            EXPECT_TRUE(got.empty()) << got.size() << " delivered by a call that failed";
            got.clear();
        }
        // The rest, by the calls after it (and nothing more a while later).
        const auto deadline = std::chrono::steady_clock::now() + kTimeout;
        while (got.size() < kCount && std::chrono::steady_clock::now() < deadline) {
            ASSERT_EQ(receiver->getNotifs(got), NIXL_SUCCESS);
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
        ASSERT_EQ(receiver->getNotifs(got), NIXL_SUCCESS);
        std::vector<std::pair<std::string, std::string>> want;
        for (int i = 0; i < kCount; ++i) want.emplace_back(from, message(i));
        EXPECT_EQ(got, want);
        if (!hit) break;  // past the call's last allocation
        ++hits;
    }
    EXPECT_GE(hits, 2);
}

TEST(NixlOom, GetNotifsOutOfMemoryDeliversLocalNotificationsOnce) {
    Plugin plugin;
    nixlBackendEngine* a = plugin.make("oom-local");
    ASSERT_NE(a, nullptr);
    expect_each_once_out_of_memory(a, a, "oom-local", "oom-local");
}

TEST(NixlOom, GetNotifsOutOfMemoryDeliversRemoteNotificationsOnce) {
    Plugin plugin;
    nixlBackendEngine* a = plugin.make("oom-sender");
    nixlBackendEngine* b = plugin.make("oom-receiver");
    ASSERT_TRUE(a && b);
    std::string b_info;
    ASSERT_EQ(b->getConnInfo(b_info), NIXL_SUCCESS);
    ASSERT_EQ(a->loadRemoteConnInfo("oom-receiver", b_info), NIXL_SUCCESS);
    expect_each_once_out_of_memory(a, b, "oom-receiver", "oom-sender");
}

// The connection info of an agent `name` whose endpoint listens where nobody does.
std::string fake_conn_info(const std::string& name) {
    engine::EndpointAddress a;
    a.name = name;
    a.address = SocketAddress::parse("127.0.0.1", 9).value();
    a.nonce = 1;
    return engine::encode_metadata(a);
}

// Host memory of `len` bytes registered with `engine`: its metadata, and its descriptor.
struct Registered {
    std::vector<uint8_t> bytes;
    nixlBackendMD* md = nullptr;
    nixlBlobDesc desc() const {
        return nixlBlobDesc(reinterpret_cast<uintptr_t>(bytes.data()), bytes.size(), 0);
    }
};

// A WRITE of `from` (registered with `a`) into `to` (registered with b, of agent `b_name`), as
// NIXL posts it: prepXfer, postXfer, then checkXfer until done. The post's or the end's status.
nixl_status_t write_to(nixlBackendEngine* a, Registered& from, nixlBackendEngine* b, Registered& to,
                       const std::string& b_name) {
    std::string pub;
    EXPECT_EQ(b->getPublicData(to.md, pub), NIXL_SUCCESS);
    nixlBackendMD* remote = nullptr;
    nixlBlobDesc rdesc = to.desc();
    rdesc.metaInfo = pub;
    EXPECT_EQ(a->loadRemoteMD(rdesc, DRAM_SEG, b_name, remote), NIXL_SUCCESS);
    nixl_meta_dlist_t local(DRAM_SEG), far(DRAM_SEG);
    local.addDesc(nixlMetaDesc(reinterpret_cast<uintptr_t>(from.bytes.data()), from.bytes.size(), 0,
                               from.md));
    far.addDesc(
        nixlMetaDesc(reinterpret_cast<uintptr_t>(to.bytes.data()), to.bytes.size(), 0, remote));
    nixlBackendReqH* handle = nullptr;
    nixl_status_t st = a->prepXfer(NIXL_WRITE, local, far, b_name, handle, nullptr);
    EXPECT_EQ(st, NIXL_SUCCESS);
    if (st == NIXL_SUCCESS) st = a->postXfer(NIXL_WRITE, local, far, b_name, handle, nullptr);
    const auto deadline = std::chrono::steady_clock::now() + kTimeout;
    while (st == NIXL_IN_PROG && std::chrono::steady_clock::now() < deadline) {
        st = a->checkXfer(handle);
    }
    if (handle != nullptr) {
        EXPECT_EQ(a->releaseReqH(handle), NIXL_SUCCESS);
    }
    EXPECT_EQ(a->unloadMD(remote), NIXL_SUCCESS);
    return st;
}

// (Not out of memory either.) NIXL forgets a remote whose metadata it rejects without
// disconnecting it from the backend, so the backend keeps connection info for at most 16 x
// MAX_PEERS agents (agents known are not connections: a decode worker may load every prefill
// worker of a large cluster): past that the earliest loaded of those never connected is
// forgotten. A transfer posted to it then fails as a lost connection (NIXL invalidates the
// agent, so that the application loads it again), not as NOT_FOUND for good; loaded again, it
// is reached. (The bound was MAX_PEERS, and a forgotten agent unreachable until invalidated.)
TEST(NixlBackend, ConnectionInfoIsKeptFor16TimesMaxPeersAgents) {
    Plugin plugin;
    plugin.set_param("max_peers", "2");  // room for 32 agents' connection info
    nixlBackendEngine* a = plugin.make("cap-a");
    ASSERT_NE(a, nullptr);
    plugin.set_param("max_peers", "1024");
    nixlBackendEngine* b0 = plugin.make("cap-b0");
    nixlBackendEngine* b1 = plugin.make("cap-b1");
    ASSERT_TRUE(b0 && b1);
    std::string info0, info1;
    ASSERT_EQ(b0->getConnInfo(info0), NIXL_SUCCESS);
    ASSERT_EQ(b1->getConnInfo(info1), NIXL_SUCCESS);
    ASSERT_EQ(a->loadRemoteConnInfo("cap-b0", info0), NIXL_SUCCESS);
    ASSERT_EQ(a->genNotif("cap-b0", "connected"), NIXL_SUCCESS);
    ASSERT_EQ(a->loadRemoteConnInfo("cap-b1", info1), NIXL_SUCCESS);  // loaded, not connected
    Registered from{std::vector<uint8_t>(4096, 0x3c)}, to{std::vector<uint8_t>(4096, 0)};
    ASSERT_EQ(a->registerMem(from.desc(), DRAM_SEG, from.md), NIXL_SUCCESS);
    ASSERT_EQ(b1->registerMem(to.desc(), DRAM_SEG, to.md), NIXL_SUCCESS);
    // 30 more: 32, the bound, all kept (the bound was MAX_PEERS, 2: b1 would be gone).
    for (int i = 0; i < 30; ++i) {
        const std::string name = "cap-f" + std::to_string(i);
        ASSERT_EQ(a->loadRemoteConnInfo(name, fake_conn_info(name)), NIXL_SUCCESS) << name;
    }
    EXPECT_EQ(a->genNotif("cap-b1", "kept"), NIXL_SUCCESS);
    // b1 disconnected (its info forgotten, as NIXL's invalidation does) and loaded again: now
    // the latest loaded. Each newcomer past the bound pushes out the earliest loaded of those
    // not connected: f0 first; b0, connected, stays.
    ASSERT_EQ(a->disconnect("cap-b1"), NIXL_SUCCESS);
    ASSERT_EQ(a->loadRemoteConnInfo("cap-b1", info1), NIXL_SUCCESS);
    ASSERT_EQ(a->loadRemoteConnInfo("cap-f30", fake_conn_info("cap-f30")), NIXL_SUCCESS);
    EXPECT_EQ(a->genNotif("cap-f0", "forgotten"), NIXL_ERR_NOT_FOUND);
    EXPECT_EQ(a->genNotif("cap-b0", "connected: kept"), NIXL_SUCCESS);
    // 29 more push out f1..f29; the 30th pushes out b1.
    for (int i = 31; i <= 60; ++i) {
        const std::string name = "cap-f" + std::to_string(i);
        ASSERT_EQ(a->loadRemoteConnInfo(name, fake_conn_info(name)), NIXL_SUCCESS) << name;
    }
    EXPECT_EQ(a->genNotif("cap-f29", "forgotten"), NIXL_ERR_NOT_FOUND);
    EXPECT_EQ(write_to(a, from, b1, to, "cap-b1"), NIXL_ERR_REMOTE_DISCONNECT);
    EXPECT_EQ(to.bytes, std::vector<uint8_t>(4096, 0));
    // Loaded again (as NIXL does with the metadata, after invalidating the agent): reached.
    ASSERT_EQ(a->loadRemoteConnInfo("cap-b1", info1), NIXL_SUCCESS);
    EXPECT_EQ(write_to(a, from, b1, to, "cap-b1"), NIXL_SUCCESS);
    EXPECT_EQ(to.bytes, from.bytes);
    EXPECT_EQ(a->deregisterMem(from.md), NIXL_SUCCESS);
    EXPECT_EQ(b1->deregisterMem(to.md), NIXL_SUCCESS);
}

// (Not out of memory, but this file's backends without an agent are the way to call it.) The
// connection info of one agent's endpoint, loaded under another agent's name, is refused: the
// second agent's transfers would go to the first.
TEST(NixlBackend, ConnectionInfoOfAnotherAgentIsRefused) {
    Plugin plugin;
    nixlBackendEngine* a = plugin.make("conn-a");
    nixlBackendEngine* b = plugin.make("conn-b");
    ASSERT_TRUE(a && b);
    std::string b_info;
    ASSERT_EQ(b->getConnInfo(b_info), NIXL_SUCCESS);
    EXPECT_EQ(a->loadRemoteConnInfo("conn-c", b_info), NIXL_ERR_INVALID_PARAM);
    EXPECT_EQ(a->loadRemoteConnInfo("conn-b", b_info), NIXL_SUCCESS);
    EXPECT_EQ(a->genNotif("conn-b", "hello"), NIXL_SUCCESS);
    notif_list_t got;
    const auto deadline = std::chrono::steady_clock::now() + kTimeout;
    while (got.empty() && std::chrono::steady_clock::now() < deadline) {
        ASSERT_EQ(b->getNotifs(got), NIXL_SUCCESS);
    }
    ASSERT_EQ(got.size(), 1u);
    EXPECT_EQ(got[0], std::make_pair(std::string("conn-a"), std::string("hello")));
}

// Connection info saying agent `agent` listens at 192.0.2.1 (TEST-NET-1): `info` (an IPv4
// endpoint's metadata: magic, version, family, then the address) with its address replaced.
std::string elsewhere(const std::string& info) {
    constexpr size_t kAddressAt = 8;
    EXPECT_GT(info.size(), kAddressAt + 4);
    EXPECT_EQ(info.substr(kAddressAt, 4), std::string("\x7f\x00\x00\x01", 4))
        << "not an endpoint on 127.0.0.1";
    std::string out = info;
    out.replace(kAddressAt, 4, std::string("\xc0\x00\x02\x01", 4));
    return out;
}

// Notifications `e` receives within `for_how_long`.
notif_list_t notifs_within(nixlBackendEngine* e, std::chrono::milliseconds for_how_long) {
    notif_list_t all;
    const auto until = std::chrono::steady_clock::now() + for_how_long;
    while (std::chrono::steady_clock::now() < until) {
        notif_list_t got;
        EXPECT_EQ(e->getNotifs(got), NIXL_SUCCESS);
        all.insert(all.end(), got.begin(), got.end());
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return all;
}

// Without a shared secret a connection's name is its own claim: where we hold the connection
// info of the agent it names, it must come from that agent's host. Here `a` believes far-b
// listens at 192.0.2.1, and far-b talks to it from 127.0.0.1: refused (its notifications are
// not delivered), whether it connected after the info was loaded or before; with the right info
// loaded, far-b is heard again.
TEST(NixlBackend, AConnectionClaimingAnAgentFromElsewhereIsRefused) {
    Plugin plugin;
    nixlBackendEngine* a = plugin.make("far-a");
    nixlBackendEngine* b = plugin.make("far-b");
    ASSERT_TRUE(a && b);
    std::string a_info, b_info;
    ASSERT_EQ(a->getConnInfo(a_info), NIXL_SUCCESS);
    ASSERT_EQ(b->getConnInfo(b_info), NIXL_SUCCESS);
    const std::string b_far = elsewhere(b_info);
    ASSERT_EQ(b->loadRemoteConnInfo("far-a", a_info), NIXL_SUCCESS);

    // Before: a knows nothing of far-b and takes its word.
    ASSERT_EQ(b->genNotif("far-a", "before"), NIXL_SUCCESS);
    EXPECT_EQ(notifs_within(a, std::chrono::milliseconds(500)),
              (notif_list_t{{"far-b", "before"}}));
    // Then a learns that far-b is elsewhere: the connection it took is closed.
    ASSERT_EQ(a->loadRemoteConnInfo("far-b", b_far), NIXL_SUCCESS);
    (void)b->genNotif("far-a", "after the info");
    EXPECT_TRUE(notifs_within(a, std::chrono::milliseconds(500)).empty());
    // A new connection from here under that name: refused too.
    for (int i = 0; i < 5; ++i) (void)b->genNotif("far-a", "again");
    EXPECT_TRUE(notifs_within(a, std::chrono::milliseconds(500)).empty());
    // With far-b's true info, far-b is heard (its first notification may go down with the
    // connection refused last: it connects again).
    ASSERT_EQ(a->loadRemoteConnInfo("far-b", b_info), NIXL_SUCCESS);
    notif_list_t got;
    const auto deadline = std::chrono::steady_clock::now() + kTimeout;
    while (got.empty() && std::chrono::steady_clock::now() < deadline) {
        (void)b->genNotif("far-a", "heard");
        got = notifs_within(a, std::chrono::milliseconds(100));
    }
    ASSERT_FALSE(got.empty());
    EXPECT_EQ(got[0], std::make_pair(std::string("far-b"), std::string("heard")));
}

// The same claim from a connection that ended before the target looked at it (it sent its
// notification and went; the engine keeps no connection it never handed out): its
// notification is judged by where it came from all the same, and dropped.
// `<prefix>-b` sends `<prefix>-a` a notification and goes, where a holds connection info saying
// that b is elsewhere: a's engine holds the notification of a connection it never handed out.
// Returns a.
nixlBackendEngine* hit_and_run(Plugin& plugin, const std::string& prefix) {
    nixlBackendEngine* a = plugin.make(prefix + "-a");
    nixlBackendEngine* b = plugin.make(prefix + "-b");
    EXPECT_TRUE(a && b);
    if (a == nullptr || b == nullptr) return nullptr;
    std::string a_info, b_info;
    EXPECT_EQ(a->getConnInfo(a_info), NIXL_SUCCESS);
    EXPECT_EQ(b->getConnInfo(b_info), NIXL_SUCCESS);
    EXPECT_EQ(a->loadRemoteConnInfo(prefix + "-b", elsewhere(b_info)), NIXL_SUCCESS);
    EXPECT_EQ(b->loadRemoteConnInfo(prefix + "-a", a_info), NIXL_SUCCESS);
    EXPECT_EQ(b->genNotif(prefix + "-a", "hit and run"), NIXL_SUCCESS);
    std::this_thread::sleep_for(std::chrono::milliseconds(300));  // connected, sent
    plugin.destroy(b);  // its connection closes; a's progress thread sees it end
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    return a;
}

TEST(NixlBackend, AClaimFromElsewhereThatLeftAtOnceIsStillRefused) {
    Plugin plugin;
    nixlBackendEngine* a = hit_and_run(plugin, "gone");
    ASSERT_NE(a, nullptr);
    EXPECT_TRUE(notifs_within(a, std::chrono::milliseconds(300)).empty());
}

// Out of memory for a while (every allocation of the call failing from some point on) while
// getNotifs judges a notification by asking the engine where its sender is (a connection that
// ended before it was looked at, claiming an agent we know to be elsewhere): the call fails and
// the notification waits for the next, which drops it; the process goes on (the judgement was
// noexcept, and an error the engine could not even make an error of ended it).
TEST(NixlOom, AJudgementOutOfMemoryFailsTheCallNotTheProcess) {
    Plugin plugin;
    nixlBackendEngine* a = hit_and_run(plugin, "judge");
    ASSERT_NE(a, nullptr);
    int failed = 0;
    bool judged = false;
    for (long skip = 0; skip < 200 && !judged; ++skip) {
        notif_list_t got;
        nixl_status_t st;
        {
            test::AllocFault fault("", skip, 1000000);
            st = a->getNotifs(got);
        }
        if (st == NIXL_SUCCESS) {
            EXPECT_TRUE(got.empty()) << "a refused claim delivered at skip " << skip;
            judged = true;
        } else {
            EXPECT_EQ(st, NIXL_ERR_BACKEND);
            EXPECT_TRUE(got.empty());
            ++failed;
        }
    }
    EXPECT_TRUE(judged);
    EXPECT_GT(failed, 0);
    EXPECT_TRUE(notifs_within(a, std::chrono::milliseconds(200)).empty());
}

}  // namespace
}  // namespace tcpx::nixl_test
