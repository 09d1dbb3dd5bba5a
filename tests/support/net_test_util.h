// Helpers shared by the net-layer tests: nets bound to loopback, connected comm pairs, polling
// with deadlines, data patterns, and process resource counts.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/params.h"
#include "common/socket.h"
#include "net/net.h"

namespace tcpx::testing {

// Settings for tests: loopback only (tests never send traffic off the machine), a few sockets.
Settings loopback_settings();

// The ways a test reaches the socket transport: the C++ provider directly; its exported ncclNet v7
// table wrapped back into a Net (so the C ABI path is tested by the same suite); and each table
// the NCCL plugin (plugins/nccl, libnccl-net-tcpxp2p.so) exports, dlopen()ed as NCCL does and
// wrapped through the loader's adapter for its version.
enum class Provider {
    kSocket,
    kSocketInCaller,  // the socket transport with no I/O threads: progress() moves the bytes
    kSocketV7,
    kNcclPluginV7,
    kNcclPluginV8,
    kNcclPluginV9,
    kNcclPluginV10,
    kNcclPluginV11,
};
// The ncclNet version of a kNcclPlugin* provider (0 for the others).
int plugin_version(Provider p);
// The socket transport behind an ncclNet table (ours, or a test plugin's) builds itself from the
// environment at its first init(): this hands it `settings` that way.
void set_socket_env(const Settings& settings);
std::string provider_name(Provider p);
std::unique_ptr<net::Net> make_net(Provider provider, const Settings& settings);

struct CommPair {
    net::SendComm* send = nullptr;
    net::RecvComm* recv = nullptr;
};

// Listens, connects and accepts (interleaved, as the contract requires), within `timeout`.
CommPair connect_pair(net::Net* net, std::chrono::milliseconds timeout = std::chrono::seconds(10));
void close_pair(net::Net* net, CommPair pair);

// Polls `request` (and drives the net's I/O, net::Net::progress()) until done or the deadline;
// returns the status test() gave. On timeout returns kTimeout and leaves the request in flight.
Status wait_request(net::Net* net, net::Request* request, size_t* sizes = nullptr,
                    std::chrono::milliseconds timeout = std::chrono::seconds(30));

// Posts, retrying while the net has no room, until the deadline.
Status post_send(net::Net* net, net::SendComm* comm, const void* data, size_t size, int tag,
                 net::Request** request);
Status post_recv(net::Net* net, net::RecvComm* comm, void* data, size_t size, int tag,
                 net::Request** request);

// A deterministic byte pattern per (seed, offset), so any misplaced byte is detected.
void fill_pattern(void* data, size_t size, uint64_t seed);
// Index of the first byte that differs from the pattern, or -1.
int64_t find_pattern_mismatch(const void* data, size_t size, uint64_t seed);

// A plain TCP connection to `addr`, as another process (a stranger) would open it: outside
// the socket budget; with `nonblocking`, the connect is only started. -1 on failure.
int plain_connect(const SocketAddress& addr, bool nonblocking = false);

int count_open_fds();
// Threads of this process named tcpx-io-* (the transports' I/O threads).
int count_io_threads();
// The same, once no thread is still leaving: a joined thread stays listed in /proc/self/task
// for a moment after join() returns (the kernel wakes the joiner before it reaps the thread), so
// a count taken right after another test's transport closed may still include its threads.
int settled_io_threads();

// Retries `cond` until true or `timeout`.
bool eventually(const std::function<bool()>& cond,
                std::chrono::milliseconds timeout = std::chrono::seconds(10));

// While it lives, the process has no file descriptor left: the limit (RLIMIT_NOFILE) is lowered
// to the lowest free one and every free one below it is taken, so that the next socket() or
// accept() fails with EMFILE. Descriptors made before it (sockets to connect later) still work.
// Restores the limit and frees what it took when it goes. Under UBSan, a call whose object's
// dynamic type is checked for the first time fails while it lives (the check opens a pipe):
// make such calls once before.
class NoDescriptorsLeft {
 public:
    NoDescriptorsLeft();
    ~NoDescriptorsLeft();
    NoDescriptorsLeft(const NoDescriptorsLeft&) = delete;
    NoDescriptorsLeft& operator=(const NoDescriptorsLeft&) = delete;
    bool ok() const { return ok_; }

 private:
    bool ok_ = false;
    unsigned long saved_cur_ = 0;
    std::vector<int> taken_;
};

}  // namespace tcpx::testing
