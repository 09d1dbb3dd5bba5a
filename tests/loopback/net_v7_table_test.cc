// The socket transport's ncclNet v7 table driven directly through its C function pointers, as
// NCCL drives it: what the V7Net wrapper in net_test.cc would hide (int sizes per buffer of a
// multi-receive, property pointers, NULL requests, error codes).
#include <gtest/gtest.h>
#include <stdlib.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "net/socket/socket_v7.h"
#include "tests/support/net_test_util.h"

namespace tcpx::testing {
namespace {

class V7TableTest : public ::testing::Test {
 protected:
    void SetUp() override {
        setenv("TCPX_P2P_SOCKET_IFNAME", "=lo", 1);
        setenv("TCPX_P2P_SOCKET_FAMILY", "ipv4", 1);
        t_ = net::socket_net_v7();
        ASSERT_EQ(t_->init(nullptr), tcpx_ncclSuccess);
        ASSERT_EQ(t_->init(nullptr), tcpx_ncclSuccess);  // a second init is harmless
        ASSERT_NO_FATAL_FAILURE(connect_pair(&send_, &recv_));
    }
    // A send comm and the receive comm accepted for it, through a listener closed again (its
    // handle in *closed_listen, when asked for).
    void connect_pair(void** send, void** recv, void** closed_listen = nullptr) {
        char handle[TCPX_NCCL_NET_HANDLE_MAXSIZE] = {};
        void* listen = nullptr;
        ASSERT_EQ(t_->listen(0, handle, &listen), tcpx_ncclSuccess);
        for (int i = 0; i < 100000 && (*send == nullptr || *recv == nullptr); ++i) {
            tcpx_ncclNetDeviceHandle_v7_t* dev = nullptr;
            if (*send == nullptr) {
                ASSERT_EQ(t_->connect(0, handle, send, &dev), tcpx_ncclSuccess);
            }
            if (*recv == nullptr) {
                ASSERT_EQ(t_->accept(listen, recv, &dev), tcpx_ncclSuccess);
            }
        }
        ASSERT_EQ(t_->closeListen(listen), tcpx_ncclSuccess);
        ASSERT_NE(*send, nullptr);
        ASSERT_NE(*recv, nullptr);
        if (closed_listen != nullptr) *closed_listen = listen;
    }
    void TearDown() override {
        if (send_ != nullptr) {
            EXPECT_EQ(t_->closeSend(send_), tcpx_ncclSuccess);
        }
        if (recv_ != nullptr) {
            EXPECT_EQ(t_->closeRecv(recv_), tcpx_ncclSuccess);
        }
    }
    // Polls until done; returns test()'s result.
    tcpx_ncclResult_t wait(void* req, int* sizes) {
        int done = 0;
        for (long i = 0; i < 100000000L; ++i) {
            const tcpx_ncclResult_t rc = t_->test(req, &done, sizes);
            if (rc != tcpx_ncclSuccess || done) return rc;
        }
        return tcpx_ncclInternalError;
    }

    const tcpx_ncclNet_v7_t* t_ = nullptr;
    void* send_ = nullptr;
    void* recv_ = nullptr;
};

TEST_F(V7TableTest, PropertiesAreStableAndHostOnly) {
    int ndev = 0;
    ASSERT_EQ(t_->devices(&ndev), tcpx_ncclSuccess);
    ASSERT_GE(ndev, 1);
    tcpx_ncclNetProperties_v7_t a{}, b{};
    ASSERT_EQ(t_->getProperties(0, &a), tcpx_ncclSuccess);
    ASSERT_EQ(t_->getProperties(0, &b), tcpx_ncclSuccess);
    EXPECT_STREQ(a.name, "lo");
    EXPECT_EQ(a.name, b.name) << "name strings must be made once, not per call";
    EXPECT_EQ(a.ptrSupport, TCPX_NCCL_PTR_HOST);
    EXPECT_EQ(a.maxRecvs, 8);
    EXPECT_EQ(a.netDeviceType, TCPX_NCCL_NET_DEVICE_HOST);
    EXPECT_EQ(t_->getProperties(ndev, &a), tcpx_ncclInvalidArgument);
    EXPECT_STREQ(t_->name, "tcpx-p2p-socket");
    EXPECT_EQ(t_->regMrDmaBuf, nullptr);
}

TEST_F(V7TableTest, MultiReceiveReportsEverySize) {
    std::vector<char> a(100, 0), b(100, 0);
    void* bufs[2] = {a.data(), b.data()};
    int sizes[2] = {100, 100};
    int tags[2] = {1, 2};
    void* rreq = nullptr;
    ASSERT_EQ(t_->irecv(recv_, 2, bufs, sizes, tags, nullptr, &rreq), tcpx_ncclSuccess);
    ASSERT_NE(rreq, nullptr);
    char m2[7] = "second";
    char m1[6] = "first";
    void* s2 = nullptr;
    void* s1 = nullptr;
    ASSERT_EQ(t_->isend(send_, m2, 7, 2, nullptr, &s2), tcpx_ncclSuccess);
    ASSERT_EQ(t_->isend(send_, m1, 6, 1, nullptr, &s1), tcpx_ncclSuccess);
    int got[2] = {-1, -1};
    ASSERT_EQ(wait(rreq, got), tcpx_ncclSuccess);
    EXPECT_EQ(got[0], 6);
    EXPECT_EQ(got[1], 7);
    EXPECT_STREQ(a.data(), "first");
    EXPECT_STREQ(b.data(), "second");
    int sent = -1;
    ASSERT_EQ(wait(s1, &sent), tcpx_ncclSuccess);
    EXPECT_EQ(sent, 6);
    ASSERT_EQ(wait(s2, &sent), tcpx_ncclSuccess);
    EXPECT_EQ(t_->irecvConsumed(recv_, 2, rreq), tcpx_ncclSuccess);
}

TEST_F(V7TableTest, BadArgumentsGiveErrorCodes) {
    char buf[8];
    void* req = nullptr;
    EXPECT_EQ(t_->isend(send_, buf, -1, 0, nullptr, &req), tcpx_ncclInvalidArgument);
    void* bufs[1] = {buf};
    int sizes[1] = {-5};
    int tags[1] = {0};
    EXPECT_EQ(t_->irecv(recv_, 1, bufs, sizes, tags, nullptr, &req), tcpx_ncclInvalidArgument);
    sizes[0] = 8;
    EXPECT_EQ(t_->irecv(recv_, 9, bufs, sizes, tags, nullptr, &req), tcpx_ncclInvalidArgument);
    void* mh = nullptr;
    EXPECT_NE(t_->regMr(send_, buf, 8, TCPX_NCCL_PTR_CUDA, &mh), tcpx_ncclSuccess);
    ASSERT_EQ(t_->regMr(send_, buf, 8, TCPX_NCCL_PTR_HOST, &mh), tcpx_ncclSuccess);
    EXPECT_EQ(t_->deregMr(send_, mh), tcpx_ncclSuccess);
    EXPECT_NE(t_->iflush(recv_, 1, bufs, sizes, nullptr, &req), tcpx_ncclSuccess);
    EXPECT_EQ(req, nullptr);
}

// Handles the table did not hand out, or has taken back, are refused before anything reads
// them: a request tested again after it completed, a registration deregistered twice or used on
// another comm, a comm closed twice, a send comm where a receive comm belongs, and pointers to
// memory that holds something else entirely. (Under ASan a read of any of them would fail.)
TEST_F(V7TableTest, StaleAndForeignHandlesAreRefusedUnread) {
    std::vector<char> src(4096, 7), dst(4096);
    void* smh = nullptr;
    void* rmh = nullptr;
    ASSERT_EQ(t_->regMr(send_, src.data(), 4096, TCPX_NCCL_PTR_HOST, &smh), tcpx_ncclSuccess);
    ASSERT_EQ(t_->regMr(recv_, dst.data(), 4096, TCPX_NCCL_PTR_HOST, &rmh), tcpx_ncclSuccess);
    void* sreq = nullptr;
    void* rreq = nullptr;
    void* bufs[1] = {dst.data()};
    int sizes[1] = {4096};
    int tags[1] = {3};
    void* mhs[1] = {rmh};
    ASSERT_EQ(t_->irecv(recv_, 1, bufs, sizes, tags, mhs, &rreq), tcpx_ncclSuccess);
    ASSERT_EQ(t_->isend(send_, src.data(), 4096, 3, smh, &sreq), tcpx_ncclSuccess);
    ASSERT_EQ(wait(sreq, nullptr), tcpx_ncclSuccess);
    ASSERT_EQ(wait(rreq, sizes), tcpx_ncclSuccess);
    EXPECT_EQ(dst, src);

    int done = 1;
    EXPECT_EQ(t_->test(sreq, &done, nullptr), tcpx_ncclInvalidArgument);  // already completed
    EXPECT_EQ(done, 0);
    EXPECT_EQ(t_->test(rreq, &done, sizes), tcpx_ncclInvalidArgument);
    auto garbage = std::make_unique<uint64_t[]>(64);
    for (int i = 0; i < 64; ++i) garbage[i] = 0x0101010101010101ull * static_cast<unsigned>(i);
    void* bogus = garbage.get();
    EXPECT_EQ(t_->test(bogus, &done, sizes), tcpx_ncclInvalidArgument);

    void* req = nullptr;
    EXPECT_EQ(t_->isend(recv_, src.data(), 16, 0, nullptr, &req), tcpx_ncclInvalidArgument);
    EXPECT_EQ(t_->isend(bogus, src.data(), 16, 0, nullptr, &req), tcpx_ncclInvalidArgument);
    EXPECT_EQ(t_->isend(send_, src.data(), 16, 0, rmh, &req), tcpx_ncclInvalidArgument);
    EXPECT_EQ(t_->isend(send_, src.data(), 16, 0, bogus, &req), tcpx_ncclInvalidArgument);
    EXPECT_EQ(req, nullptr);
    EXPECT_EQ(t_->irecv(send_, 1, bufs, sizes, tags, nullptr, &req), tcpx_ncclInvalidArgument);
    mhs[0] = smh;  // the sender's registration on the receiving comm
    EXPECT_EQ(t_->irecv(recv_, 1, bufs, sizes, tags, mhs, &req), tcpx_ncclInvalidArgument);
    EXPECT_EQ(req, nullptr);
    void* mh = nullptr;
    EXPECT_EQ(t_->regMr(bogus, src.data(), 16, TCPX_NCCL_PTR_HOST, &mh), tcpx_ncclInvalidArgument);
    EXPECT_EQ(mh, nullptr);
    EXPECT_EQ(t_->deregMr(recv_, smh), tcpx_ncclInvalidArgument);  // not this comm's
    EXPECT_EQ(t_->deregMr(send_, smh), tcpx_ncclSuccess);
    EXPECT_EQ(t_->deregMr(send_, smh), tcpx_ncclInvalidArgument);  // twice
    EXPECT_EQ(t_->deregMr(send_, bogus), tcpx_ncclInvalidArgument);
    EXPECT_EQ(t_->irecvConsumed(bogus, 1, rreq), tcpx_ncclInvalidArgument);
    void* comm = nullptr;
    EXPECT_EQ(t_->accept(bogus, &comm, nullptr), tcpx_ncclInvalidArgument);
    EXPECT_EQ(comm, nullptr);
    EXPECT_EQ(t_->closeSend(recv_), tcpx_ncclInvalidArgument);
    EXPECT_EQ(t_->closeRecv(bogus), tcpx_ncclInvalidArgument);
    EXPECT_EQ(t_->closeListen(send_), tcpx_ncclInvalidArgument);
    // Closing takes the comm's registrations with it (rmh is freed): closing twice is refused.
    EXPECT_EQ(t_->closeRecv(recv_), tcpx_ncclSuccess);
    EXPECT_EQ(t_->closeRecv(recv_), tcpx_ncclInvalidArgument);
    EXPECT_EQ(t_->deregMr(recv_, rmh), tcpx_ncclInvalidArgument);
    recv_ = nullptr;
}

// A handle is never given out twice, though the transport reuses a finished request's memory
// for the next one and a closed comm's for the next comm: a stale request tested, or a comm
// closed a second time, is refused even then, and the new request or comm it would have hit
// goes on untouched.
TEST_F(V7TableTest, StaleHandlesAreRefusedEvenOnceTheirMemoryIsReused) {
    std::vector<char> src(4096, 5), dst(4096);
    void* bufs[1] = {dst.data()};
    int sizes[1] = {4096};
    int tags[1] = {1};
    void* old_send = nullptr;
    void* old_recv = nullptr;
    ASSERT_EQ(t_->irecv(recv_, 1, bufs, sizes, tags, nullptr, &old_recv), tcpx_ncclSuccess);
    ASSERT_EQ(t_->isend(send_, src.data(), 4096, 1, nullptr, &old_send), tcpx_ncclSuccess);
    ASSERT_EQ(wait(old_send, nullptr), tcpx_ncclSuccess);
    ASSERT_EQ(wait(old_recv, sizes), tcpx_ncclSuccess);
    // The next posting: the transport takes the request just freed.
    void* new_send = nullptr;
    void* new_recv = nullptr;
    sizes[0] = 4096;
    ASSERT_EQ(t_->irecv(recv_, 1, bufs, sizes, tags, nullptr, &new_recv), tcpx_ncclSuccess);
    ASSERT_EQ(t_->isend(send_, src.data(), 4096, 1, nullptr, &new_send), tcpx_ncclSuccess);
    EXPECT_NE(new_send, old_send);
    EXPECT_NE(new_recv, old_recv);
    int done = 1;
    EXPECT_EQ(t_->test(old_send, &done, nullptr), tcpx_ncclInvalidArgument);
    EXPECT_EQ(done, 0);
    EXPECT_EQ(t_->test(old_recv, &done, sizes), tcpx_ncclInvalidArgument);
    ASSERT_EQ(wait(new_send, nullptr), tcpx_ncclSuccess) << "the new send was taken by the stale";
    ASSERT_EQ(wait(new_recv, sizes), tcpx_ncclSuccess);
    EXPECT_EQ(sizes[0], 4096);

    // Comms: a second pair after the first is closed (the allocator hands its memory out again).
    void* const old_send_comm = send_;
    ASSERT_EQ(t_->closeSend(send_), tcpx_ncclSuccess);
    send_ = nullptr;
    void* second_recv = nullptr;
    void* listen = nullptr;
    ASSERT_NO_FATAL_FAILURE(connect_pair(&send_, &second_recv, &listen));
    EXPECT_NE(send_, old_send_comm);
    EXPECT_EQ(t_->closeSend(old_send_comm), tcpx_ncclInvalidArgument);
    EXPECT_EQ(t_->closeListen(listen), tcpx_ncclInvalidArgument);
    // The new pair works.
    bufs[0] = dst.data();
    sizes[0] = 4096;
    void* r = nullptr;
    void* w = nullptr;
    std::fill(dst.begin(), dst.end(), 0);
    ASSERT_EQ(t_->irecv(second_recv, 1, bufs, sizes, tags, nullptr, &r), tcpx_ncclSuccess);
    ASSERT_EQ(t_->isend(send_, src.data(), 4096, 1, nullptr, &w), tcpx_ncclSuccess);
    ASSERT_EQ(wait(w, nullptr), tcpx_ncclSuccess);
    ASSERT_EQ(wait(r, sizes), tcpx_ncclSuccess);
    EXPECT_EQ(dst, src);
    EXPECT_EQ(t_->closeRecv(second_recv), tcpx_ncclSuccess);
}

// Two threads testing one finished request at once: one of them gets it, the other is refused
// (before, both gave the transport's request back, and two later postings shared it). Every
// posting after that still completes with its own bytes.
TEST_F(V7TableTest, ARequestTestedByTwoThreadsAtOnceIsReleasedOnce) {
    std::vector<char> src(64, 3), dst(64);
    void* bufs[1] = {dst.data()};
    int tags[1] = {2};
    for (int round = 0; round < 200; ++round) {
        int sizes[1] = {64};
        void* r = nullptr;
        void* w = nullptr;
        ASSERT_EQ(t_->irecv(recv_, 1, bufs, sizes, tags, nullptr, &r), tcpx_ncclSuccess);
        ASSERT_EQ(t_->isend(send_, src.data(), 64, 2, nullptr, &w), tcpx_ncclSuccess);
        ASSERT_EQ(wait(r, sizes), tcpx_ncclSuccess);
        // w is done, or about to be: both threads test it until one sees it done.
        std::atomic<int> go{0};
        std::atomic<int> saw_done{0};
        const auto tester = [&] {
            go.fetch_add(1);
            while (go.load() < 2) {
            }
            for (int i = 0; i < 100000; ++i) {
                int done = 0;
                const tcpx_ncclResult_t rc = t_->test(w, &done, nullptr);
                if (rc == tcpx_ncclSuccess && done) saw_done.fetch_add(1);
                if (rc != tcpx_ncclSuccess || done) return;
            }
        };
        std::thread other(tester);
        tester();
        other.join();
        ASSERT_EQ(saw_done.load(), 1) << round;
    }
    // Eight postings in flight together: each its own request.
    std::vector<std::vector<char>> ins(8, std::vector<char>(64)), outs(8);
    std::vector<void*> rs(8), ws(8);
    for (int i = 0; i < 8; ++i) {
        outs[static_cast<size_t>(i)].assign(64, static_cast<char>('a' + i));
        void* b[1] = {ins[static_cast<size_t>(i)].data()};
        int sz[1] = {64};
        int tg[1] = {10 + i};
        ASSERT_EQ(t_->irecv(recv_, 1, b, sz, tg, nullptr, &rs[static_cast<size_t>(i)]),
                  tcpx_ncclSuccess);
    }
    for (int i = 0; i < 8; ++i) {
        ASSERT_EQ(t_->isend(send_, outs[static_cast<size_t>(i)].data(), 64, 10 + i, nullptr,
                            &ws[static_cast<size_t>(i)]),
                  tcpx_ncclSuccess);
    }
    for (int i = 0; i < 8; ++i) {
        int sz[1] = {0};
        ASSERT_EQ(wait(ws[static_cast<size_t>(i)], nullptr), tcpx_ncclSuccess) << i;
        ASSERT_EQ(wait(rs[static_cast<size_t>(i)], sz), tcpx_ncclSuccess) << i;
        EXPECT_EQ(ins[static_cast<size_t>(i)], outs[static_cast<size_t>(i)]) << i;
    }
}

}  // namespace
}  // namespace tcpx::testing
