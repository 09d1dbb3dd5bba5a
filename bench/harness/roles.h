// The roles of a benchmark: the measuring side (initiator) drives the serving side (responder,
// or target) over a line-oriented command channel. The responder runs on a thread of this
// process, in a child process (this executable again, or a fork), or on another host over a TCP
// side channel (--listen / --connect); the drivers' commands are the same lines in every case.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "common/socket.h"
#include "tcpx/status.h"

namespace tcpx::bench {

// --- a line-oriented command channel between initiator and responder ---------------------------
//
// Commands and replies are single lines of space-separated words; binary blobs travel as hex
// (hex_blob/unhex_blob). A reply "error <status>" reports a failure.

class Channel {
 public:
    virtual ~Channel() = default;
    virtual bool write_line(const std::string& line) = 0;
    virtual bool read_line(std::string* line) = 0;
    // Why the last read_line or write_line failed, when it says more than "the peer went away".
    virtual std::string why() const { return ""; }
    // Waits at most `ms` (0: not at all) for input; false when none came, so that the caller may
    // do other work and ask again. True when read_line has something to read or would fail at
    // once (the channel ended, or went without a line for longer than its timeout).
    virtual bool wait_input(int ms) = 0;
};

// The longest line a channel accepts (the metadata of 256 endpoints fits many times over): a
// peer on the side channel must not make us buffer without bound.
constexpr size_t kMaxLineBytes = 1 << 20;

// One direction of an in-process channel.
class LineQueue {
 public:
    void push(std::string line);
    std::string pop();
    // Whether a line is there, waiting at most `ms` for one.
    bool wait(int ms);

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
    bool wait_input(int ms) override { return in_->wait(ms); }

 private:
    LineQueue* out_;
    LineQueue* in_;
};

// Over a pair of file descriptors (a child's stdin/stdout, or one socket twice). A line longer
// than kMaxLineBytes ends the channel; so does a line that is not read whole, or written whole,
// within `timeout_ms` (-1: no bound) of the read_line or write_line that wants it, and (through
// wait_input) going that long without a line. The bound is per line, not per byte: a peer that
// sends (or reads) one byte now and then cannot hold the channel for longer.
class FdChannel final : public Channel {
 public:
    FdChannel(int in, int out, int timeout_ms = -1)
        : in_(in),
          out_(out),
          timeout_ms_(timeout_ms),
          last_line_(std::chrono::steady_clock::now()) {}
    bool write_line(const std::string& line) override;
    bool read_line(std::string* line) override;
    std::string why() const override { return why_; }
    bool wait_input(int ms) override;
    void set_timeout(int timeout_ms) {
        timeout_ms_ = timeout_ms;
        last_line_ = std::chrono::steady_clock::now();
    }

 private:
    // Waits until `fd` is ready for `events`, at most until `deadline`; false (with why_) on a
    // timeout or an error.
    bool wait_for(int fd, short events, std::chrono::steady_clock::time_point deadline);
    // When the line a read_line or write_line starts now must be done.
    std::chrono::steady_clock::time_point line_deadline() const;

    int in_;
    int out_;
    int timeout_ms_;
    std::chrono::steady_clock::time_point last_line_;  // read, or the timeout set
    bool expired_ = false;  // wait_input saw no line for timeout_ms_: read_line fails
    std::string buffer_;
    std::string why_;
};

// The words of a line, split on whitespace.
std::vector<std::string> words(const std::string& line);

// A number in a command or a reply: decimal digits only (no sign, no blank, nothing after them)
// and at most `max`; false otherwise. Lines come from the network on a side channel, and
// std::stoull would take "-1" (as 2^64 - 1) and "12abc" (as 12), and throw past 2^64.
bool parse_uint(std::string_view word, uint64_t max, uint64_t* out);
// The same for an int in [min, max] (min may be negative: then a leading '-' is allowed).
bool parse_int(std::string_view word, int min, int max, int* out);
// A finite number of seconds, at least 0, the whole word ("0.25", "1e-3").
bool parse_seconds(std::string_view word, double* out);

// Hex of binary-safe bytes, and back (false on bad hex).
std::string hex_blob(const std::string& bytes);
bool unhex_blob(const std::string& hex, std::string* bytes);

// --- the responder's loop ----------------------------------------------------------------------

// What a responder does with one command: sets *reply (it is "ok" unless changed) or returns an
// error, which goes back as "error <status>".
using CommandFn = std::function<Status(const std::vector<std::string>& w, const std::string& line,
                                       std::string* reply)>;

// Work a responder does between commands (a NIXL target polling its agent's notifications, which
// without a progress thread is what moves its side's data). Before each wait for a command,
// `every_ms` says whether `run` runs and how long the wait after it may last before it runs
// again: -1, no work now (wait for the command as long as the channel lets it); 0, run it again
// at once (poll without pause); more, at most that many milliseconds apart.
struct IdleWork {
    std::function<int()> every_ms;
    std::function<void()> run;
};

// Serves commands from `ch` until "quit" (then `close`, and "bye") or until the channel breaks
// (then `close`, and UNAVAILABLE saying why). A number that does not parse (std::stoull and
// friends throw) is an error reply, not the end of the process: on a side channel the commands
// come from the network. Empty lines are ignored. With `idle`, its work runs between commands.
Status serve_commands(Channel* ch, const CommandFn& handle, const std::function<void()>& close,
                      const IdleWork* idle = nullptr);

// Answers every command with "error <why>" until "quit" (answered "bye"): a responder that could
// not start, so that the initiator reports the reason.
void refuse_commands(Channel* ch, const Status& why);

// --- the peer: the responder as the initiator sees it ------------------------------------------

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
    ~ProcessPeer() override;  // "quit"; the child gets 2 s to exit before SIGKILL
    Channel* channel() override { return &channel_; }

 private:
    ProcessPeer(pid_t pid, int in, int out) : pid_(pid), in_(in), out_(out), channel_(in, out) {}
    pid_t pid_;
    int in_;
    int out_;
    FdChannel channel_;
};

// The responder in a forked child of this process (no new program): `serve` runs there with its
// end of a socketpair, and what it returns is the child's exit code. Fork before any thread,
// agent or CUDA context exists, so that both sides start clean.
class ForkPeer final : public Peer {
 public:
    static StatusOr<std::unique_ptr<ForkPeer>> fork(const std::function<int(int fd)>& serve);
    ~ForkPeer() override;  // "quit"; the child gets 5 s to exit before SIGKILL
    Channel* channel() override { return &channel_; }

 private:
    ForkPeer(pid_t pid, int fd) : pid_(pid), fd_(fd), channel_(fd, fd) {}
    pid_t pid_;
    int fd_;
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

// --- two hosts: the side channel (--listen / --connect) ----------------------------------------
//
// The initiator connects and speaks first: a greeting line "<hello> key=value..." that carries
// the settings the target needs; the target answers "<hello> <what it runs>", or "error ..." and
// closes. Plaintext and unauthenticated: the engine's own handshake (TCPX_P2P_AUTH_SECRET) guards
// the data endpoints.

// "HOST:PORT", "[IPV6]:PORT": a numeric address or a host name (resolved, first address), and a
// port (0 allowed only with `allow_port_0`, for listening on an ephemeral port).
StatusOr<SocketAddress> parse_host_port(const std::string& text, bool allow_port_0);

// The name of the interface that holds `addr` ("lo" for 127.0.0.1); NOT_FOUND when none does
// (a wildcard address, or another host's).
StatusOr<std::string> interface_of(const SocketAddress& addr);

// The target of two hosts gets what it needs in the initiator's greeting: with --listen, an option
// that only the initiator chooses is an error. INVALID_ARGUMENT for the first of `initiator_only`
// that `given` says is on the command line ("--listen: NAME is the initiator's to choose (give it
// to --connect)"); OK when none is.
Status check_initiator_only(const std::vector<std::string>& initiator_only,
                            const std::function<bool(const std::string&)>& given);

// Either side of two hosts run without --interface: the interface that holds its end of the side
// channel (`local`), as a --interface value ("=NAME"). The error says that `flag` ("--connect" or
// "--listen") ran without --interface, and why no interface would do.
StatusOr<std::string> side_channel_interface(const SocketAddress& local, const std::string& flag);

// How long the initiator waits for an answer: a measurement's run, or the engine's connect
// timeout, with room to spare.
int reply_timeout_ms(double min_seconds);

// The initiator's side: connects to the target at `addr` (HOST:PORT, from --connect), trying for
// `connect_timeout_s`.
StatusOr<std::unique_ptr<SocketPeer>> connect_to_target(const std::string& addr,
                                                        double connect_timeout_s,
                                                        int reply_timeout_ms);

// A greeting: `hello`, then " key=value" for every setting whose value is not empty.
std::string greeting_line(const std::string& hello,
                          const std::vector<std::pair<std::string, std::string>>& settings);

// The settings of a greeting, in order: kInvalidArgument when `line` is not `hello` followed by
// words key=value ("not a <program> initiator of this version", or which word is not).
StatusOr<std::vector<std::pair<std::string, std::string>>> greeting_settings(
    const std::string& line, const std::string& hello, const std::string& program);

// Sends the greeting `hello_line` (which starts with `hello`) and returns what the target said
// of itself after its own `hello`; an answer without it is not a target of this program's
// version (`program`, for the message).
StatusOr<std::string> greet_target(Peer* peer, const std::string& hello,
                                   const std::string& hello_line, const std::string& program,
                                   const std::string& addr);

// An initiator on the side channel, greeted.
struct SideChannel {
    Fd fd;
    std::unique_ptr<FdChannel> channel;
    std::string who;    // the initiator's address
    std::string hello;  // its greeting
};

// The target's --interface once an initiator is accepted: `*interface` as given, or when empty the
// side channel's (side_channel_interface for "--listen"); on failure the initiator is answered
// "error <why>" too.
Status target_interface(const SideChannel& side, std::string* interface);

// The target's side: listens at `listen` (HOST:PORT, port 0: any) and says where on stdout
// ("<program>: target listening on ADDR (...)").
StatusOr<Fd> listen_side_channel(const std::string& program, const std::string& listen);

// How long an initiator has to send its whole greeting.
constexpr int kGreetingMs = 10000;

// Returns the first initiator on `listener` whose greeting (its first line, whole within
// `greeting_ms`) `check_hello` accepts. A connection that does not greet in time is closed, one
// whose greeting is refused is answered "error <why>" and closed; both are reported on stderr
// (prefixed with `program`) and listening goes on. `check_hello` is where every setting of the
// greeting is checked: what it lets through, the target must be able to serve.
StatusOr<SideChannel> accept_initiator(const std::string& program, const Fd& listener,
                                       const std::function<Status(const std::string&)>& check_hello,
                                       int greeting_ms = kGreetingMs);

}  // namespace tcpx::bench
