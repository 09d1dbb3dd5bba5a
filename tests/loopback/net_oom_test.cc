// Out of memory while posting to the socket transport. A post that fails before its request is
// queued (std::bad_alloc out of isend / irecv, on the posting thread) leaves no request slot taken
// and no sequence number used, so posting it again delivers every message, in order, byte for
// byte. (A send given a sequence number and never queued left the receiver waiting for it for
// ever, every later message behind it; a slot taken and not given back was lost to the comm.)
// One that runs out once its request is queued returns it, and fails the comm: the request ends
// failed, never sent twice or waiting for ever.
#include <gtest/gtest.h>

#include <new>
#include <vector>

#include "net/net.h"
#include "tests/support/alloc_fault.h"
#include "tests/support/net_test_util.h"

namespace tcpx::testing {
namespace {

using net::Request;

// Runs `post` with the calling thread's allocation number `skip` failing; true when it threw
// std::bad_alloc (or returned an error), with *req left null.
template <typename Post>
bool post_failed(long skip, Request** req, Post post) {
    *req = nullptr;
    test::AllocFault fault("", skip, 1);
    try {
        const Status st = post(req);
        if (!st.ok()) {
            EXPECT_EQ(*req, nullptr);
            return true;
        }
    } catch (const std::bad_alloc&) {
        EXPECT_EQ(*req, nullptr);
        return true;
    }
    return false;
}

class NetOom : public ::testing::TestWithParam<size_t> {};

TEST_P(NetOom, APostThatRunsOutOfMemoryLeavesNothingBehind) {
    const size_t kSize = GetParam();  // inline on the control socket, or chunked
    auto net = make_net(Provider::kSocket, loopback_settings());
    ASSERT_NE(net, nullptr);
    CommPair p = connect_pair(net.get());
    ASSERT_NE(p.send, nullptr);
    net::Properties props;
    ASSERT_TRUE(net->get_properties(0, &props).ok());
    uint64_t seed = 1;
    int failures = 0;      // posts that failed before their request was queued
    int failed_comms = 0;  // ... and once it was
    for (long skip = 0; skip < 24; ++skip) {
        SCOPED_TRACE(skip);
        std::vector<uint8_t> out(kSize), in(kSize, 0);
        fill_pattern(out.data(), kSize, seed);
        // The receive first, under the fault; posted again without it where it failed.
        Request* r = nullptr;
        void* data = in.data();
        size_t cap = in.size();
        int tag = 3;
        if (post_failed(skip, &r, [&](Request** x) {
                return net->irecv(p.recv, 1, &data, &cap, &tag, nullptr, x);
            })) {
            ++failures;
        }
        // Out of memory once a request was queued fails the comm, both ends with it: the next
        // post says so (its error), or the requests end with it below. A fresh pair goes on.
        const auto comm_failed = [&](const Status& st) {
            ++failed_comms;
            // (the side that ran out says so; the other saw its peer close)
            EXPECT_TRUE(st.code() == StatusCode::kResourceExhausted ||
                        st.code() == StatusCode::kUnavailable)
                << st.to_string();
            close_pair(net.get(), p);
            p = connect_pair(net.get());
            return p.send != nullptr;
        };
        if (r == nullptr) {
            if (Status st = post_recv(net.get(), p.recv, in.data(), kSize, 3, &r); !st.ok()) {
                ASSERT_TRUE(comm_failed(st));
                continue;
            }
        }
        Request* s = nullptr;
        if (post_failed(skip, &s, [&](Request** x) {
                return net->isend(p.send, out.data(), kSize, 3, nullptr, x);
            })) {
            ++failures;
        }
        if (s == nullptr) {
            if (Status st = post_send(net.get(), p.send, out.data(), kSize, 3, &s); !st.ok()) {
                ASSERT_TRUE(comm_failed(st));
                continue;
            }
        }
        const Status sent = wait_request(net.get(), s, nullptr, std::chrono::seconds(10));
        size_t got = 0;
        const Status st = wait_request(net.get(), r, &got, std::chrono::seconds(10));
        ASSERT_NE(sent.code(), StatusCode::kTimeout);
        ASSERT_NE(st.code(), StatusCode::kTimeout);
        if (!sent.ok() || !st.ok()) {
            ASSERT_TRUE(comm_failed(!sent.ok() ? sent : st));
            continue;
        }
        EXPECT_EQ(got, kSize);
        ASSERT_EQ(find_pattern_mismatch(in.data(), kSize, seed), -1);
        ++seed;
    }
    EXPECT_GT(failures + failed_comms, 0) << "no allocation of a post failed: it tested nothing";
    // Every slot is still there: as many sends and receives in flight as the comm takes.
    const int n = props.max_requests;
    std::vector<std::vector<uint8_t>> outs(static_cast<size_t>(n), std::vector<uint8_t>(kSize));
    std::vector<std::vector<uint8_t>> ins(static_cast<size_t>(n), std::vector<uint8_t>(kSize, 0));
    std::vector<Request*> sends, recvs;
    for (int i = 0; i < n; ++i) {
        fill_pattern(outs[static_cast<size_t>(i)].data(), kSize, seed + static_cast<uint64_t>(i));
        void* data = ins[static_cast<size_t>(i)].data();
        size_t cap = kSize;
        int tag = 3;
        Request* r = nullptr;
        ASSERT_TRUE(net->irecv(p.recv, 1, &data, &cap, &tag, nullptr, &r).ok());
        ASSERT_NE(r, nullptr) << "receive slot " << i << " of " << n << " is gone";
        recvs.push_back(r);
        Request* s = nullptr;
        ASSERT_TRUE(
            net->isend(p.send, outs[static_cast<size_t>(i)].data(), kSize, 3, nullptr, &s).ok());
        ASSERT_NE(s, nullptr) << "send slot " << i << " of " << n << " is gone";
        sends.push_back(s);
    }
    for (int i = 0; i < n; ++i) {
        ASSERT_TRUE(wait_request(net.get(), sends[static_cast<size_t>(i)]).ok());
        ASSERT_TRUE(wait_request(net.get(), recvs[static_cast<size_t>(i)]).ok());
        EXPECT_EQ(find_pattern_mismatch(ins[static_cast<size_t>(i)].data(), kSize,
                                        seed + static_cast<uint64_t>(i)),
                  -1)
            << "message " << i;
    }
    close_pair(net.get(), p);
}

INSTANTIATE_TEST_SUITE_P(Sizes, NetOom, ::testing::Values(size_t{100}, size_t{1} << 20),
                         [](const ::testing::TestParamInfo<size_t>& param) {
                             return param.param < 4096 ? std::string("Inline")
                                                       : std::string("Chunked");
                         });

}  // namespace
}  // namespace tcpx::testing
