// The reaper that destroys staging rings off the engine's threads (src/engine/reaper.h): put()
// returns while a destructor blocks, destructors run on another thread, the reaper's own
// destructor destroys everything it was given.
#include "engine/reaper.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>

namespace tcpx::engine {
namespace {

using namespace std::chrono_literals;

// A gate the test opens; destructors of Blocker wait at it, as cudaFree waits for a kernel.
struct Gate {
    std::mutex mu;
    std::condition_variable cv;
    bool open = false;
    int entered = 0;
    void wait() {
        std::unique_lock<std::mutex> lock(mu);
        ++entered;
        cv.notify_all();
        cv.wait(lock, [this] { return open; });
    }
    void let_go() {
        std::lock_guard<std::mutex> lock(mu);
        open = true;
        cv.notify_all();
    }
    bool wait_entered(int n) {
        std::unique_lock<std::mutex> lock(mu);
        return cv.wait_for(lock, 10s, [&] { return entered >= n; });
    }
};

struct Blocker {
    Blocker(Gate* g, std::atomic<int>* d, std::thread::id* o = nullptr)
        : gate(g), destroyed(d), on(o) {}
    Blocker(const Blocker&) = delete;
    Gate* gate;
    std::atomic<int>* destroyed;
    std::thread::id* on;
    ~Blocker() {
        if (on != nullptr) *on = std::this_thread::get_id();
        if (gate != nullptr) gate->wait();
        destroyed->fetch_add(1);
    }
};

TEST(Reaper, PutReturnsWhileADestructorBlocksElsewhere) {
    Gate gate;
    std::atomic<int> destroyed{0};
    std::thread::id on;
    Reaper<Blocker> reaper;
    reaper.put(std::make_unique<Blocker>(&gate, &destroyed, &on));
    ASSERT_TRUE(gate.wait_entered(1)) << "the object was never destroyed";
    EXPECT_NE(on, std::this_thread::get_id()) << "destroyed in the caller's thread";
    // Later puts return too while the first destructor still blocks.
    for (int i = 0; i < 10; ++i) reaper.put(std::make_unique<Blocker>(nullptr, &destroyed));
    EXPECT_EQ(destroyed.load(), 0);
    gate.let_go();
    reaper.drain();
    EXPECT_EQ(destroyed.load(), 11);
}

TEST(Reaper, ItsDestructorDestroysEverythingHandedOver) {
    Gate gate;
    std::atomic<int> destroyed{0};
    std::thread opener;
    {
        Reaper<Blocker> reaper;
        reaper.put(std::make_unique<Blocker>(&gate, &destroyed));
        for (int i = 0; i < 100; ++i) {
            reaper.put(std::make_unique<Blocker>(nullptr, &destroyed));
        }
        ASSERT_TRUE(gate.wait_entered(1));
        opener = std::thread([&] {
            std::this_thread::sleep_for(50ms);
            gate.let_go();
        });
        // The reaper's destructor waits for the blocked one and the 100 behind it.
    }
    EXPECT_EQ(destroyed.load(), 101);
    opener.join();
}

TEST(Reaper, WhatIsHandedOverCountsAsPendingUntilItIsDestroyed) {
    // The engine counts staging still being freed against its total: a weight must stay counted
    // while its destructor runs, and only until then.
    Gate gate;
    std::atomic<int> destroyed{0};
    Reaper<Blocker> reaper;
    EXPECT_EQ(reaper.pending(), 0u);
    reaper.put(std::make_unique<Blocker>(&gate, &destroyed), 1000);
    ASSERT_TRUE(gate.wait_entered(1));
    reaper.put(std::make_unique<Blocker>(nullptr, &destroyed), 24);
    reaper.put(std::make_unique<Blocker>(nullptr, &destroyed));  // no weight
    EXPECT_EQ(reaper.pending(), 1024u) << "the blocked destructor's weight left early";
    gate.let_go();
    reaper.drain();
    EXPECT_EQ(destroyed.load(), 3);
    EXPECT_EQ(reaper.pending(), 0u);
}

TEST(Reaper, NothingHandedOverStartsNoThreadAndDrainsAtOnce) {
    Reaper<Blocker> reaper;
    reaper.put(nullptr);
    reaper.drain();
}

TEST(Reaper, ManyThreadsPutAtOnce) {
    std::atomic<int> destroyed{0};
    {
        Reaper<Blocker> reaper;
        std::vector<std::thread> putters;
        for (int t = 0; t < 4; ++t) {
            putters.emplace_back([&] {
                for (int i = 0; i < 500; ++i) {
                    reaper.put(std::make_unique<Blocker>(nullptr, &destroyed));
                }
            });
        }
        for (auto& t : putters) t.join();
        reaper.drain();
        EXPECT_EQ(destroyed.load(), 2000);
    }
    EXPECT_EQ(destroyed.load(), 2000);
}

}  // namespace
}  // namespace tcpx::engine
