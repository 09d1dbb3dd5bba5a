#include "net/socket/io_pool.h"

#include <gtest/gtest.h>

#include <array>
#include <vector>

namespace tcpx::net {
namespace {

using Lane = IoPool::Lane;

// A comm's sockets as the socket transport registers them (socket_comm.cc): its control socket
// (weight 1), then its data sockets (weight 4), all of one direction.
std::vector<int> open_comm(IoPool& pool, Lane data, int nsocks) {
    std::vector<int> threads;
    threads.push_back(pool.assign_thread(1, Lane::kControl));
    for (int i = 0; i < nsocks; ++i) threads.push_back(pool.assign_thread(4, data));
    return threads;
}

// Data sockets of each direction per thread: [thread][0 send, 1 receive].
using Counts = std::vector<std::array<int, 2>>;

void count_data(const std::vector<int>& threads, Lane data, Counts* counts) {
    for (size_t i = 1; i < threads.size(); ++i) {
        (*counts)[static_cast<size_t>(threads[i])][data == Lane::kSendData ? 0 : 1] += 1;
    }
}

// An initiator opens its channels' comms as sending, receiving, sending, receiving (connect and
// accept alternate per channel): spread by load alone, that put both sending comms' data sockets
// on half the threads and both receiving comms' on the other half (seen on the two-H200 host:
// 16 receiving sockets on 9 of 16 threads, and reads from its peer ran at the pace of those).
// Spread by lane, every thread carries as many of each direction.
TEST(IoPoolSpread, EachDirectionIsSpreadOverEveryThreadWhateverTheOrder) {
    constexpr int kThreads = 4;
    constexpr int kSocks = 2;
    const std::vector<std::vector<Lane>> orders = {
        {Lane::kSendData, Lane::kRecvData, Lane::kSendData, Lane::kRecvData},
        {Lane::kSendData, Lane::kSendData, Lane::kRecvData, Lane::kRecvData},
        {Lane::kRecvData, Lane::kSendData, Lane::kSendData, Lane::kRecvData},
    };
    for (const auto& order : orders) {
        auto pool = IoPool::create(kThreads, IoPool::Mode::kDriven);
        ASSERT_TRUE(pool.ok()) << pool.status().to_string();
        Counts counts(kThreads, {0, 0});
        for (Lane lane : order) count_data(open_comm(**pool, lane, kSocks), lane, &counts);
        for (int t = 0; t < kThreads; ++t) {
            SCOPED_TRACE("thread " + std::to_string(t));
            EXPECT_EQ(counts[static_cast<size_t>(t)][0], 1);
            EXPECT_EQ(counts[static_cast<size_t>(t)][1], 1);
        }
    }
}

// A comm that closes gives its threads' weight back: the next one of its direction takes those
// threads again, and each direction stays spread.
TEST(IoPoolSpread, AClosedCommsThreadsAreTakenAgain) {
    constexpr int kThreads = 4;
    auto pool = IoPool::create(kThreads, IoPool::Mode::kDriven);
    ASSERT_TRUE(pool.ok()) << pool.status().to_string();
    const std::vector<int> send0 = open_comm(**pool, Lane::kSendData, 2);
    const std::vector<int> recv0 = open_comm(**pool, Lane::kRecvData, 2);
    const std::vector<int> send1 = open_comm(**pool, Lane::kSendData, 2);
    // send1 closes: its control socket, then its data sockets.
    (*pool)->unassign(send1[0], 1, Lane::kControl);
    for (size_t i = 1; i < send1.size(); ++i) (*pool)->unassign(send1[i], 4, Lane::kSendData);
    const std::vector<int> send2 = open_comm(**pool, Lane::kSendData, 2);
    EXPECT_EQ(std::vector<int>(send2.begin() + 1, send2.end()),
              std::vector<int>(send1.begin() + 1, send1.end()));
    const std::vector<int> recv1 = open_comm(**pool, Lane::kRecvData, 2);
    Counts counts(kThreads, {0, 0});
    count_data(send0, Lane::kSendData, &counts);
    count_data(send2, Lane::kSendData, &counts);
    count_data(recv0, Lane::kRecvData, &counts);
    count_data(recv1, Lane::kRecvData, &counts);
    for (int t = 0; t < kThreads; ++t) {
        SCOPED_TRACE("thread " + std::to_string(t));
        EXPECT_EQ(counts[static_cast<size_t>(t)][0], 1);
        EXPECT_EQ(counts[static_cast<size_t>(t)][1], 1);
    }
}

}  // namespace
}  // namespace tcpx::net
