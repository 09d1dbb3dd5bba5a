// tcpx/endpoint.h — the transfer engine's C++ API.
//
// An Endpoint connects to peers (other endpoints, in this process or elsewhere) and moves bytes
// between registered memory regions:
//
//   auto ep = tcpx::Endpoint::create(tcpx::Config::from_env().value(), "prefill-0").value();
//   std::string md = ep->metadata();                 // give this to peers out of band
//   tcpx::PeerId peer = ep->connect(their_md).value();
//   tcpx::MemId mem = ep->reg(buf, len).value();
//   tcpx::XferId x = ep->write(peer, mem, 0, their_region, 0, len, "kv-ready").value();
//   tcpx::Status st = ep->wait(x, std::chrono::seconds(10));
//
// One-sided operations (write, read, their vector forms) need nothing from the target's
// application: its endpoint validates every request against its registrations and serves it.
// A write may carry a notification, delivered to the target's application exactly once, after
// all of the write's data is in place there; a read may too, delivered to the target's
// application exactly once, after all of the read's data is in place here. Two-sided send/recv
// match by tag.
//
// Every operation is asynchronous and returns a transfer id; poll() reports its state and
// wait() blocks for it. A finished transfer (done or failed) is reported once, by the poll() or
// wait() that sees it finish, and its id is then forgotten (INVALID_ARGUMENT after).
//
// All methods are thread-safe. Errors are Status values; no exception leaves a method that
// returns one (out of memory inside is RESOURCE_EXHAUSTED, unless memory is so short that not
// even that error's message can be made: then std::bad_alloc). The few that return a value
// with no room for an error (metadata(), stats(), get_notifications(), ...) may throw
// std::bad_alloc, as the standard library's containers do. (The C API lets nothing out.)
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "tcpx/api.h"
#include "tcpx/config.h"
#include "tcpx/status.h"

namespace tcpx {

using PeerId = uint64_t;
using MemId = uint64_t;
using XferId = uint64_t;

enum class MemKind : uint8_t { kHost = 0, kCuda = 1 };

// What a peer needs to address one of our registrations. Produced by Endpoint::describe, carried
// to peers out of band (serialize/parse), used as the target of write/read.
struct TCPX_API RemoteMem {
    uint64_t addr = 0;  // the region's start in its owner's address space
    uint64_t len = 0;
    uint64_t key = 0;  // random per registration: requests must present it
    MemKind kind = MemKind::kHost;
    int32_t device = -1;  // GPU index when kind is kCuda

    // A versioned binary form (binary-safe bytes).
    std::string serialize() const;
    static StatusOr<RemoteMem> parse(std::string_view bytes);
};

// What Endpoint::metadata() says about an endpoint.
struct TCPX_API EndpointInfo {
    std::string name;
    std::string host;  // numeric IPv4 or IPv6 address
    uint16_t port = 0;
    int32_t gpu = -1;
};

struct TCPX_API Notification {
    std::string peer;     // the sending endpoint's name
    std::string payload;  // binary-safe, possibly empty
    // The connection it came on, as connect/accept return it. A name is only the peer's claim;
    // this says which connection made it (one the application refused, or one it never accepted,
    // may carry a name another peer already holds). The id may be disconnected by now.
    PeerId peer_id = 0;
};

// One piece of a vector transfer: `len` bytes between our registration `mem` at `offset` and the
// peer's registration `remote` at `remote_offset`.
struct TCPX_API IoVec {
    MemId mem = 0;
    uint64_t offset = 0;
    RemoteMem remote;
    uint64_t remote_offset = 0;
    uint64_t len = 0;
};

// One piece of a local copy: `len` bytes from our registration `src` at `src_offset` to our
// registration `dst` at `dst_offset`.
struct TCPX_API LocalCopy {
    MemId dst = 0;
    uint64_t dst_offset = 0;
    MemId src = 0;
    uint64_t src_offset = 0;
    uint64_t len = 0;
};

enum class XferState { kInProgress, kDone, kFailed };

struct TCPX_API XferStatus {
    XferState state = XferState::kInProgress;
    Status error;  // why it failed, when state is kFailed (INVALID_ARGUMENT for an unknown id)
};

// Counters of an endpoint (all its peers, past and present, since it was created) or of one peer
// (since it connected). Monotonic but for staging_bytes (held now); read with Endpoint::stats()
// and peer_stats().
struct TCPX_API Stats {
    uint64_t bytes_sent = 0;      // bytes of completed transfers that left this endpoint's memory
    uint64_t bytes_received = 0;  // bytes of completed transfers that landed in its memory
    uint64_t transfers_started = 0;    // posted here (write, read, send, recv and vectors)
    uint64_t transfers_completed = 0;  // of those, done
    // Of those, failed: cancelled ones and their peer's failure included (started = completed +
    // failed + those in flight).
    uint64_t transfers_failed = 0;
    uint64_t requests_served = 0;  // the peers' reads and writes served here
    uint64_t errors = 0;           // peers failed: connection lost, protocol errors, timeouts
    uint64_t retries = 0;  // transport requests the transport had no room for yet (posted later)
    uint64_t window_blocked_ns = 0;  // time data channels had chunks waiting on a full window
    // Chunks that waited for staging memory (MAX_STAGING_BYTES_TOTAL), each wait counted once.
    uint64_t staging_waits = 0;
    // Staging memory held now (the endpoint's: all peers', with what is still being freed; a
    // peer's: its channels'), and the most the endpoint has held (0 for a peer).
    uint64_t staging_bytes = 0;
    uint64_t staging_peak_bytes = 0;
};

class TcpxSession;
class TcpxTransfer;

class TCPX_API Endpoint {
 public:
    // Starts an endpoint: picks the interface and transport from `config`, listens for peers.
    // `name` identifies it to peers (default: "<host>:<port>"): at most 256 bytes, no ASCII
    // control characters (INVALID_ARGUMENT otherwise).
    static StatusOr<std::unique_ptr<Endpoint>> create(const Config& config, std::string name = "");
    // Disconnects every peer (their transfers fail) and stops.
    ~Endpoint();
    Endpoint(const Endpoint&) = delete;
    Endpoint& operator=(const Endpoint&) = delete;

    const std::string& name() const;
    // A versioned binary blob (binary-safe bytes) with how to reach this endpoint.
    std::string metadata() const;
    static StatusOr<EndpointInfo> parse_metadata(std::string_view metadata);

    // --- peers ---
    // Connects to the endpoint described by `metadata`; returns once the connection is ready
    // (or fails after TCPX_P2P_CONNECT_TIMEOUT_MS). kUnavailable also when the endpoint that
    // answers there has another name or nonce than the metadata's (stale metadata); with
    // AUTH_SECRET set, another name is kUnauthenticated (the name is what the secret proves).
    StatusOr<PeerId> connect(std::string_view metadata);
    // Starts connecting and returns at once. Writes, reads, sends, receives and notifications may
    // be posted to the peer right away: they wait (in order, at most 65536) until the connection
    // is ready and then go out; if it fails, they fail with its error. peer_status() says where
    // it stands. A failed peer stays known (with its error) until disconnect(), or until
    // MAX_PEERS peers have failed after it without being disconnected (then NOT_FOUND).
    StatusOr<PeerId> connect_async(std::string_view metadata);
    // Endpoints that connect to us are served at once, without accept(): one-sided transfers,
    // notifications and sends from them work immediately. accept() returns the next such peer
    // not yet returned, waiting up to `timeout` (kTimeout if none came).
    StatusOr<PeerId> accept(std::chrono::milliseconds timeout);
    // Closes the connection; the peer's transfers in flight fail, here and there.
    Status disconnect(PeerId peer);
    StatusOr<std::string> peer_name(PeerId peer) const;
    // Whether `peer` is, as far as can be told, the endpoint `metadata` describes: its name is
    // the metadata's, and unless it proved the shared secret it talks to us from the host
    // address the metadata gives (from this host, when that address is one of ours). A
    // connecting stranger can claim any name, not an address: TCP answers only there. It also
    // answers for the sender of a notification (Notification::peer_id) whose connection has
    // ended, until the next get_notifications() after the one that returned it. OK;
    // UNAUTHENTICATED naming the difference; INVALID_ARGUMENT for metadata that does not parse;
    // NOT_FOUND for an unknown peer.
    Status peer_matches(PeerId peer, std::string_view metadata) const;
    // Whether the connection to `peer` is up: OK when ready; the error it failed with (the peer
    // closed the connection, stopped answering, ...) once failed; FAILED_PRECONDITION while it
    // is still being made; NOT_FOUND for an id never connected or disconnected. Makes progress
    // once where no progress thread runs, as poll() does.
    Status peer_status(PeerId peer);
    // The endpoint's counters, and one peer's (NOT_FOUND once it is gone).
    Stats stats() const;
    StatusOr<Stats> peer_stats(PeerId peer) const;

    // --- memory ---
    // Registers [ptr, ptr + len) for transfers. Registration ids and keys are never reused.
    StatusOr<MemId> reg(void* ptr, size_t len);
    // After dereg returns, nothing reads or writes the region any more: new requests for it are
    // refused; a receive into it that no send has matched yet fails at once (kCancelled);
    // transfers already using it finish first (or fail, if their peer does not complete them
    // within TCPX_P2P_PEER_TIMEOUT_MS — that peer is then disconnected).
    Status dereg(MemId mem);
    StatusOr<RemoteMem> describe(MemId mem) const;

    // --- one-sided ---
    // Copies `len` bytes from our registration `mem` at `offset` to the peer's `remote` at
    // `remote_offset`. With `notification`, the peer's application receives it (with our name)
    // once all the data is in place there; when the peer has no room for it (its application
    // has not taken MAX_QUEUED_NOTIFICATIONS of ours), the write is refused, RESOURCE_EXHAUSTED,
    // before any byte moves.
    StatusOr<XferId> write(PeerId peer, MemId mem, uint64_t offset, const RemoteMem& remote,
                           uint64_t remote_offset, uint64_t len,
                           std::optional<std::string_view> notification = std::nullopt);
    // Copies `len` bytes from the peer's `remote` at `remote_offset` into our `mem` at `offset`.
    // With `notification`, the peer's application receives it (with our name) exactly once,
    // after all the data is in place here: sent by whatever makes progress here (the progress
    // thread, poll, wait), at the latest when the read is reported done; never if the read fails.
    // Notifications we send the peer after that report arrive after it. The peer holds room for
    // it from the request on: with none, the read is refused (RESOURCE_EXHAUSTED) before any byte
    // moves, as a write.
    StatusOr<XferId> read(PeerId peer, MemId mem, uint64_t offset, const RemoteMem& remote,
                          uint64_t remote_offset, uint64_t len,
                          std::optional<std::string_view> notification = std::nullopt);
    // Many pieces as one transfer: done when all are, failed if any fails. A notification comes
    // after all of them. No pieces is a transfer that completes at once (still notifying).
    StatusOr<XferId> writev(PeerId peer, std::span<const IoVec> iov,
                            std::optional<std::string_view> notification = std::nullopt);
    StatusOr<XferId> readv(PeerId peer, std::span<const IoVec> iov,
                           std::optional<std::string_view> notification = std::nullopt);

    // Copies between this endpoint's own registrations — host or GPU memory, any mix — without
    // the network (memcpy / cudaMemcpy), synchronously: the bytes are in place when it returns.
    // Every piece is checked before any is copied; pieces must not overlap: a destination that
    // shares a byte with another piece's destination or source, or its own source (by address,
    // whatever registrations name them), is refused with kInvalidArgument naming both.
    Status copy(std::span<const LocalCopy> pieces);

    // A notification on its own. It has no transfer to wait for: once what waits to go out to
    // the peer (a slow wire, a peer still connecting, a peer whose application has not taken
    // MAX_QUEUED_NOTIFICATIONS of ours: it stops reading us until it does) passes
    // MAX_QUEUED_NOTIFICATION_BYTES it returns RESOURCE_EXHAUSTED, and a later call may succeed
    // once those bytes have gone. A peer that makes no room for PEER_TIMEOUT_MS ends the
    // connection.
    Status notify(PeerId peer, std::string_view payload);
    // Notifications received since the last call, each exactly once, in arrival order: all of
    // them, or the `max` oldest (the rest wait for the next call). Once returned they no longer
    // count against the bounds on notifications the application has not taken: a caller that
    // buffers them itself should take no more than it hands on (the C API takes one at a time).
    std::vector<Notification> get_notifications(size_t max = SIZE_MAX);

    // --- two-sided ---
    // A send matches the peer's first posted recv of the same tag (in posting order); the recv's
    // buffer must be at least as large. The send completes when its buffer may be reused, the
    // recv when the data is in it.
    StatusOr<XferId> send(PeerId peer, MemId mem, uint64_t offset, uint64_t len, uint64_t tag);
    StatusOr<XferId> recv(PeerId peer, MemId mem, uint64_t offset, uint64_t len, uint64_t tag);

    // Sessions and transfers as objects (the same operations).
    TcpxSession session(PeerId peer);

    // --- completion ---
    // poll() of a transfer still in flight, wait() and get_notifications() make progress in the
    // calling thread when the endpoint is free (with or without a progress thread, which stands
    // back while calls keep doing so; see docs/engine.md, Progress): polling in a loop is the
    // fast way to complete transfers.
    XferStatus poll(XferId xfer);
    // OK when done; the failure when it failed; kTimeout (transfer still in flight) when
    // `timeout` passed first. milliseconds::max() waits for ever. Done or failed, the transfer is
    // reported and its id unknown from then on. A transfer whose peer stopped answering
    // (PEER_TIMEOUT_MS) fails with kTimeout too: poll() tells the two apart (still in flight, or
    // INVALID_ARGUMENT: reported already).
    Status wait(XferId xfer, std::chrono::milliseconds timeout);
    // Cancels a transfer in progress. OK: it is cancelled. It fails with kCancelled (reported by
    // poll() or wait(), as any failure), nothing of it reads or writes our memory any more, and
    // it lets go of its regions (a dereg() no longer waits for it).
    // - A receive (recv) no send has matched yet: OK; a send with its tag that comes later meets
    //   another receive. One already matched, and a send, have their bytes on the wire and end on
    //   their own: kFailedPrecondition.
    // - A read (read, readv): what has not yet been posted into our memory lands in scratch
    //   instead, and the peer's application never gets its notification. OK when nothing was on
    //   its way into our memory; kUnavailable when chunks were: it is cancelled all the same,
    //   and reports kCancelled once they have landed (a window's worth at most), or the
    //   connection's error if it fails first.
    // - A write (write, writev): one still waiting for its connection is dropped, nothing sent
    //   (OK). Once its request is out, the peer waits for every byte it announced, so its data is
    //   sent whole and lands there, with its notification: OK once all of it has been sent
    //   (nothing of it reads our memory any more), else kUnavailable: it reports kCancelled once
    //   it has been (or the peer's error, if the connection fails first).
    // kFailedPrecondition for a transfer that has finished (poll() or wait() reports it), and
    // kInvalidArgument for an id unknown here or already reported.
    Status cancel(XferId xfer);

    class Impl;

 private:
    explicit Endpoint(std::unique_ptr<Impl> impl);
    std::unique_ptr<Impl> impl_;
};

// A transfer as an object: its endpoint and id.
class TCPX_API TcpxTransfer {
 public:
    TcpxTransfer(Endpoint* endpoint, XferId id) : endpoint_(endpoint), id_(id) {}
    XferId id() const { return id_; }
    XferStatus poll() { return endpoint_->poll(id_); }
    Status wait(std::chrono::milliseconds timeout = std::chrono::hours(24 * 365)) {
        return endpoint_->wait(id_, timeout);
    }

 private:
    Endpoint* endpoint_;
    XferId id_;
};

// A connection to one peer as an object.
class TCPX_API TcpxSession {
 public:
    TcpxSession(Endpoint* endpoint, PeerId peer) : endpoint_(endpoint), peer_(peer) {}
    PeerId peer() const { return peer_; }
    StatusOr<std::string> peer_name() const { return endpoint_->peer_name(peer_); }

    StatusOr<TcpxTransfer> send(MemId mem, uint64_t offset, uint64_t len, uint64_t tag);
    StatusOr<TcpxTransfer> recv(MemId mem, uint64_t offset, uint64_t len, uint64_t tag);
    StatusOr<TcpxTransfer> write(MemId mem, uint64_t offset, const RemoteMem& remote,
                                 uint64_t remote_offset, uint64_t len,
                                 std::optional<std::string_view> notification = std::nullopt);
    StatusOr<TcpxTransfer> read(MemId mem, uint64_t offset, const RemoteMem& remote,
                                uint64_t remote_offset, uint64_t len,
                                std::optional<std::string_view> notification = std::nullopt);
    Status notify(std::string_view payload) { return endpoint_->notify(peer_, payload); }
    Status close() { return endpoint_->disconnect(peer_); }

 private:
    Endpoint* endpoint_;
    PeerId peer_;
};

}  // namespace tcpx
