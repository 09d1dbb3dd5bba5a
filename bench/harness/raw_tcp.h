// The raw TCP baseline of the benchmarks: what the same bytes cost over plain TCP sockets,
// measured in the same run as the transport or engine beside it. `streams` TCP connections, one
// thread per stream and side, blocking send/recv, and one more connection for ping-pongs (whose
// receives poll: raw TCP's best latency, not a wakeup's). The
// responder's half answers raw-* commands on the benchmark's command channel (harness/roles.h).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "bench/harness/roles.h"
#include "common/socket.h"
#include "tcpx/status.h"

namespace tcpx::bench {

// --- threads and stream splitting --------------------------------------------------------------

// Splits `size` bytes over `n` streams: stream i carries share(i) bytes at offset(i).
uint64_t stream_share(uint64_t size, int n, int i);
uint64_t stream_offset(uint64_t size, int n, int i);

// Runs fn(i) on n threads at once and joins them; the first error wins.
Status run_threads(int n, const std::function<Status(int)>& fn);

// --- the raw TCP baseline ----------------------------------------------------------------------
//
// `streams` TCP connections, one thread per stream and side, blocking send/recv; each message is
// split evenly over the streams (stream_share/stream_offset), message k coming from / landing in
// slot k % slots of the caller's buffer. One more connection carries ping-pongs; their receives
// poll the socket (MSG_DONTWAIT, yielding) rather than sleep, as the measured side's waits do.

// The responder's half: serves the raw-* commands.
class RawTcpResponder {
 public:
    // The most streams raw-accept takes: the initiator asks for channels x data sockets, at most
    // 16 x 64. Each is a connection and, while a raw-stream runs, a thread.
    static constexpr int kMaxStreams = 1024;

    // `interface`: where to listen (TCPX_P2P_SOCKET_IFNAME syntax). `wait_ms`: how long raw-accept
    // waits for its connections, and how long any raw connection may go without progress, before
    // the command fails: the commands and connections come from the network, and a peer that
    // stops must not hold the responder for ever.
    explicit RawTcpResponder(std::string interface, int wait_ms = 60000)
        : interface_(std::move(interface)), wait_ms_(wait_ms) {}

    // Buffer of at least `bytes` for the data of a raw command.
    using BufferFn = std::function<StatusOr<uint8_t*>(uint64_t bytes)>;

    // Connections that have not yet said who they are, at most: beyond it the oldest is closed.
    static constexpr size_t kMaxPending = 64;

    // Handles `w` when it is a raw-* command (true), setting *st and *reply (reply left as is on
    // success when the command has nothing to say); false when it is not one.
    //   raw-listen                                  -> "port <port> <host> <token>": a fresh
    //                                               random token (hex) for this listener
    //   raw-accept <streams>                        accepts streams + 1 connections
    //                                               (1 <= streams <= kMaxStreams), each of
    //                                               which sends the token and its index first;
    //                                               others (a stray, a wrong token, an index out
    //                                               of range or taken) are closed, and accepting
    //                                               goes on until the wait is over
    //   raw-stream <size> <count> <slots> [send]    receives (or sends) `count` messages, in a
    //                                               buffer of size x slots bytes
    //   raw-pingpong <size> <count> [<reply>]       receives size bytes, answers reply (= size)
    bool handle(const std::vector<std::string>& w, const BufferFn& buffer, Status* st,
                std::string* reply);
    void close();

 private:
    Status listen(std::string* reply);
    Status accept(int streams);
    Status stream(uint64_t size, uint64_t count, uint64_t slots, bool send, const BufferFn& buffer);
    Status pingpong(uint64_t size, uint64_t count, uint64_t reply, const BufferFn& buffer);

    std::string interface_;
    int wait_ms_;
    Fd listen_;
    std::string token_;      // raw-listen's, which every raw connection sends first
    std::vector<Fd> conns_;  // streams, then the ping-pong connection
};

// The bytes a raw connection starts with: the responder's token, then its index (uint32_t).
constexpr size_t kRawTokenBytes = 16;
constexpr size_t kRawPreambleBytes = kRawTokenBytes + sizeof(uint32_t);

// The initiator's half.
class RawTcpInitiator {
 public:
    // `wait_ms`: how long any of its connections may go without progress (SO_RCVTIMEO,
    // SO_SNDTIMEO) before the measurement fails; TCP keepalive notices a peer host that vanished.
    explicit RawTcpInitiator(int wait_ms = 60000) : wait_ms_(wait_ms) {}

    // Asks the responder to listen and accept, and connects `streams` + 1 connections. A reply
    // to raw-listen that is not "port <1..65535> <host> <token>" is a protocol error.
    Status connect(Peer* peer, int streams);
    int streams() const { return static_cast<int>(conns_.size()) - 1; }

    // `count` messages of `size` bytes over the streams; to_peer: we send from slot k % slots of
    // `buf` and the peer receives into slot k % peer_slots of its buffer; otherwise the peer
    // sends and we receive. Returns the seconds until the receiver holds all of them.
    StatusOr<double> stream(Peer* peer, bool to_peer, uint64_t size, uint64_t count, uint8_t* buf,
                            uint64_t slots, uint64_t peer_slots);

    // `count` round trips on the ping-pong connection: `out` bytes from `buf` to the peer, `back`
    // bytes back into `buf`. Returns each round trip's time in microseconds.
    StatusOr<std::vector<double>> pingpong(Peer* peer, uint64_t out, uint64_t back, uint64_t count,
                                           uint8_t* buf);

    void close() { conns_.clear(); }

 private:
    int wait_ms_;
    std::vector<Fd> conns_;
};

}  // namespace tcpx::bench
