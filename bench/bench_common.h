// Pieces shared by the loopback benchmarks (bench net, bench engine): the line-oriented command
// channel between the measuring side (initiator) and the serving side (responder), the responder
// on a thread or in a child process, the raw TCP baseline (N streams, and a ping-pong socket),
// calibration of measurement lengths, percentile summaries and the progress line.
#pragma once

#include <sys/types.h>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/socket.h"
#include "tcpx/status.h"

namespace tcpx::bench {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start);

// --- a line-oriented command channel between initiator and responder ---------------------------
//
// Commands and replies are single lines of space-separated words; binary blobs travel as hex
// (to_hex/from_hex). A reply "error <status>" reports a failure.

class Channel {
 public:
    virtual ~Channel() = default;
    virtual bool write_line(const std::string& line) = 0;
    virtual bool read_line(std::string* line) = 0;
    // Why the last read_line or write_line failed, when it says more than "the peer went away".
    virtual std::string why() const { return ""; }
};

// The longest line a channel accepts (the metadata of 256 endpoints fits many times over): a
// peer on the side channel must not make us buffer without bound.
constexpr size_t kMaxLineBytes = 1 << 20;

// One direction of an in-process channel.
class LineQueue {
 public:
    void push(std::string line);
    std::string pop();

 private:
    std::mutex mu_;
    std::condition_variable cv_;
    std::deque<std::string> lines_;
};

class QueueChannel final : public Channel {
 public:
    QueueChannel(LineQueue* out, LineQueue* in) : out_(out), in_(in) {}
    bool write_line(const std::string& line) override;
    bool read_line(std::string* line) override;

 private:
    LineQueue* out_;
    LineQueue* in_;
};

// Over a pair of file descriptors (a child's stdin/stdout, or one socket twice). A line longer
// than kMaxLineBytes ends the channel; so does waiting longer than `timeout_ms` (-1: forever)
// for a line to complete or for a write to make progress.
class FdChannel final : public Channel {
 public:
    FdChannel(int in, int out, int timeout_ms = -1) : in_(in), out_(out), timeout_ms_(timeout_ms) {}
    bool write_line(const std::string& line) override;
    bool read_line(std::string* line) override;
    std::string why() const override { return why_; }
    void set_timeout(int timeout_ms) { timeout_ms_ = timeout_ms; }

 private:
    // Waits until `fd` is ready for `events`; false (with why_) on a timeout or an error.
    bool wait_for(int fd, short events);

    int in_;
    int out_;
    int timeout_ms_;
    std::string buffer_;
    std::string why_;
};

// The words of a line, split on whitespace.
std::vector<std::string> words(const std::string& line);

// Hex of binary-safe bytes, and back (false on bad hex).
std::string hex_blob(const std::string& bytes);
bool unhex_blob(const std::string& hex, std::string* bytes);

// --- command-line sizes ------------------------------------------------------------------------

// "4K,64K,1M" or a range "4K..64M" (each size 4x the previous), or both ("4K..64K,1M"); false on
// anything else (an empty list, a bad size, a range of zero or backwards).
bool parse_size_list(const std::string& text, std::vector<uint64_t>* out);
// "A,B": two GPU indices, each in Config::gpu_index's range (0..1023).
bool parse_gpu_pair(const std::string& text, std::vector<int>* out);

// --- patterns for --verify ---------------------------------------------------------------------
//
// A destination is poisoned before the transfer that should overwrite it, the source filled with
// a pattern unique to its seed; afterwards the destination must hold the pattern.

// What --verify writes over a destination before the transfer that should overwrite it.
constexpr uint8_t kPoison = 0xee;

// A seed for measurement `run` and peer `peer`.
uint64_t pattern_seed(uint64_t run, int peer);
void fill_pattern(uint8_t* p, uint64_t len, uint64_t seed);
// OK, or which byte differs (kInternal, "<what>: byte ...").
Status check_pattern(const uint8_t* p, uint64_t len, uint64_t seed, const std::string& what);

// --- the peer: the responder on a thread, or in a child process --------------------------------

class Peer {
 public:
    virtual ~Peer() = default;
    virtual Channel* channel() = 0;

    // Sends a command and returns the reply; an "error ..." reply becomes a status.
    StatusOr<std::string> call(const std::string& command);
    Status send(const std::string& command);
    StatusOr<std::string> reply();
};

// The responder on a thread of this process: `serve` runs there until it reads "quit" (sent by
// the destructor) and answers it.
class ThreadPeer final : public Peer {
 public:
    explicit ThreadPeer(std::function<void(Channel*)> serve);
    ~ThreadPeer() override;
    Channel* channel() override { return &mine_; }

 private:
    LineQueue to_peer_;
    LineQueue from_peer_;
    QueueChannel mine_;
    QueueChannel theirs_;
    std::thread thread_;
};

// The responder in a child process: this executable (/proc/self/exe) with `args`, commands on
// its stdin, replies on its stdout; its stderr is ours.
class ProcessPeer final : public Peer {
 public:
    static StatusOr<std::unique_ptr<ProcessPeer>> spawn(const std::vector<std::string>& args);
    ~ProcessPeer() override;
    Channel* channel() override { return &channel_; }

 private:
    ProcessPeer(pid_t pid, int in, int out) : pid_(pid), in_(in), out_(out), channel_(in, out) {}
    pid_t pid_;
    int in_;
    int out_;
    FdChannel channel_;
};

// The responder on another host, over the benchmark's side channel: a TCP connection carrying
// the same lines as ProcessPeer's pipes. Plaintext and unauthenticated (docs/benchmarking.md).
class SocketPeer final : public Peer {
 public:
    // Connects to `addr`, trying again while nothing listens there yet (the other host may start
    // later), for at most `connect_timeout_ms` in all. Replies must come within
    // `reply_timeout_ms`.
    static StatusOr<std::unique_ptr<SocketPeer>> connect(const SocketAddress& addr,
                                                         int connect_timeout_ms,
                                                         int reply_timeout_ms);
    ~SocketPeer() override;  // "quit", and a short wait for its answer
    Channel* channel() override { return &channel_; }
    // Our end's address (the interface the peer is reached through).
    const SocketAddress& local() const { return local_; }

 private:
    SocketPeer(Fd fd, SocketAddress local, int reply_timeout_ms)
        : fd_(std::move(fd)), local_(local), channel_(fd_.get(), fd_.get(), reply_timeout_ms) {}
    Fd fd_;
    SocketAddress local_;
    FdChannel channel_;
};

// --- the side channel's addresses --------------------------------------------------------------

// "HOST:PORT", "[IPV6]:PORT": a numeric address or a host name (resolved, first address), and a
// port (0 allowed only with `allow_port_0`, for listening on an ephemeral port).
StatusOr<SocketAddress> parse_host_port(const std::string& text, bool allow_port_0);

// The name of the interface that holds `addr` ("lo" for 127.0.0.1); NOT_FOUND when none does
// (a wildcard address, or another host's).
StatusOr<std::string> interface_of(const SocketAddress& addr);

// --- threads and stream splitting --------------------------------------------------------------

// Splits `size` bytes over `n` streams: stream i carries share(i) bytes at offset(i).
uint64_t stream_share(uint64_t size, int n, int i);
uint64_t stream_offset(uint64_t size, int n, int i);

// Receive buffers in flight are capped at this many bytes (a window of 16 64 MiB messages
// would be 1 GiB).
constexpr uint64_t kMaxInFlightBytes = 512ULL << 20;

// Runs fn(i) on n threads at once and joins them; the first error wins.
Status run_threads(int n, const std::function<Status(int)>& fn);

// --- the raw TCP baseline ----------------------------------------------------------------------
//
// `streams` TCP connections, one thread per stream and side, blocking send/recv; each message is
// split evenly over the streams (stream_share/stream_offset), message k coming from / landing in
// slot k % slots of the caller's buffer. One more connection carries ping-pongs.

// The responder's half: serves the raw-* commands.
class RawTcpResponder {
 public:
    // `interface`: where to listen (TCPX_P2P_SOCKET_IFNAME syntax).
    explicit RawTcpResponder(std::string interface) : interface_(std::move(interface)) {}

    // Buffer of at least `bytes` for the data of a raw command.
    using BufferFn = std::function<StatusOr<uint8_t*>(uint64_t bytes)>;

    // Handles `w` when it is a raw-* command (true), setting *st and *reply (reply left as is on
    // success when the command has nothing to say); false when it is not one.
    //   raw-listen                                  -> "port <port> <host>"
    //   raw-accept <streams>                        accepts streams + 1 connections
    //   raw-stream <size> <count> <slots> [send]    receives (or sends) `count` messages
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
    Fd listen_;
    std::vector<Fd> conns_;  // streams, then the ping-pong connection
};

// The initiator's half.
class RawTcpInitiator {
 public:
    // Asks the responder to listen and accept, and connects `streams` + 1 connections.
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
    std::vector<Fd> conns_;
};

// --- measurements ------------------------------------------------------------------------------

struct Throughput {
    double gbps = 0;
    uint64_t iters = 0;
    double seconds = 0;
    // CPU seconds (user + system, every thread) that both sides, initiator and target, spent in
    // the measured run; 0 where not measured. peer_cpu_seconds: the part of it spent by the
    // target's process when that is another process (0 when both sides share one).
    double cpu_seconds = 0;
    double peer_cpu_seconds = 0;
};

// CPU seconds per GB (10^9 bytes) moved; 0 where not measured.
double cpu_per_gb(const Throughput& t);
// "0.123", or "-" where not measured.
std::string cpu_cell(const Throughput& t);

struct Latency {
    double p50_us = 0;
    double p99_us = 0;
    double mean_us = 0;
    uint64_t iters = 0;
};

Latency summarize(std::vector<double> samples_us);

// How long to measure: about min_seconds, at least min_iters iterations.
struct Calibration {
    double min_seconds = 0.5;
    uint64_t min_iters = 5;
};

// CPU seconds (user + system) every thread of this process has used so far
// (CLOCK_PROCESS_CPUTIME_ID).
double process_cpu_seconds();

// CPU seconds so far of this process and of the peer's process (0 when the peer is a thread
// here: this process's time covers it).
struct CpuTimes {
    double here = 0;
    double peer = 0;
};
using CpuClock = std::function<StatusOr<CpuTimes>()>;

// The peer process's CPU seconds so far ("cpu" -> "cpu <seconds>").
StatusOr<double> peer_cpu_seconds(Peer* peer);

// Warms up with growing runs until one lasts an eighth of min_seconds (connections and buffers
// are warm then, and the rate is known), then measures for about min_seconds. A measurement that
// ends up shorter than half of min_seconds (the rate rose after the warm-up) is taken again at the
// new rate. run(count) does `count` iterations of `bytes_per_iter` bytes and returns its seconds.
// With `cpu`, read before and after every run, the measured run's CPU seconds too.
StatusOr<Throughput> measure_throughput(const Calibration& cal, uint64_t bytes_per_iter,
                                        const std::function<StatusOr<double>(uint64_t)>& run,
                                        const CpuClock& cpu = nullptr);

// Warms up with 20 iterations, then measures for about min_seconds (at most 200000 iterations);
// samples adding up to less than half of min_seconds (the warm-up was slow) are topped up at the
// new rate. run(count) returns one sample (microseconds) per iteration.
StatusOr<Latency> measure_latency(
    const Calibration& cal, const std::function<StatusOr<std::vector<double>>(uint64_t)>& run);

// --- reporting ---------------------------------------------------------------------------------

// "[step/steps] what" on stderr, when enabled and stderr is a terminal.
class Progress {
 public:
    explicit Progress(bool enabled);
    void show(size_t step, size_t steps, const std::string& what);
    void clear();

 private:
    bool enabled_;
};

// "1.23x", or "-" when either side is missing.
std::string ratio(double a, double b);

}  // namespace tcpx::bench
