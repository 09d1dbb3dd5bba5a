// One peer's control connection: a non-blocking TCP socket carrying framed messages
// (ctrl_wire.h). Writes queue and go out as the socket takes them; reads collect bytes until
// whole messages can be handed out. Not thread-safe: the engine's lock guards it.
#pragma once

#include <sys/uio.h>

#include <cstdint>
#include <deque>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

#include "common/socket.h"
#include "engine/ctrl_wire.h"
#include "tcpx/status.h"

namespace tcpx::engine {

// The room every peer's control connection draws on for a message larger than its own buffer
// (CtrlConn::kOwnBuffer) while that message arrives: MAX_CTRL_BUFFER_TOTAL. Each connection's
// bound (one maximal message) alone would multiply with the peers at once. Guarded by the
// engine's lock, as the connections are.
struct CtrlRoom {
    uint64_t limit = std::numeric_limits<uint64_t>::max();
    uint64_t used = 0;
};

class CtrlConn {
 public:
    // What a connection reads into without drawing on the shared room: four reads' worth.
    static constexpr size_t kOwnBuffer = 1 << 20;

    CtrlConn() = default;
    explicit CtrlConn(Fd fd) : fd_(std::move(fd)) {}
    CtrlConn(const CtrlConn&) = delete;
    CtrlConn& operator=(const CtrlConn&) = delete;
    ~CtrlConn() {
        release_room();
        release_replies();
    }

    // The shared room to draw on (none: a message takes what it needs). Set before reading; it
    // must outlive the connection.
    void set_room(CtrlRoom* room) { room_ = room; }
    // Where the replies queued (reply_bytes) are counted for all peers together, the same way.
    void set_reply_room(CtrlRoom* room) { reply_room_ = room; }
    // The last read() stopped because the message in front needs more room than is free:
    // nothing more is read until room_fits().
    bool starved() const { return starved_; }
    bool room_fits() const;
    // Room held beyond the own buffer: given back once what was read is handled. (A peer that
    // sends part of a large message and then nothing holds it until the engine fails the peer
    // for its silence: no message of its is handled meanwhile, PEER_TIMEOUT_MS.)
    uint64_t room_held() const { return reserved_; }
    // Bytes the message in front of what was read still lacks to be whole (0: whole, or
    // nothing there; its header's missing bytes while that is not all here).
    size_t front_lacks() const;

    int fd() const { return fd_.get(); }
    bool valid() const { return fd_.valid(); }
    void reset(Fd fd);
    void close() {
        fd_.reset();
        release_room();
        release_replies();
    }
    // Reads and drops what has arrived and was not read (up to 8 MiB), then closes: a socket
    // closed with bytes unread sends a reset, and a reset can destroy what we sent last (a BYE
    // with the reason) before the peer reads it.
    void close_after_draining_input();

    // The largest message body accepted from now on (kHandshakeMessage until the handshake is
    // done; at most MAX_CTRL_MESSAGE after), and how many more bytes a message flagged
    // kFlagInline may carry (a transfer's data, at most the inline limits' largest value,
    // wire::kMaxInlineData: 0 until the handshake is done). The sender counts only
    // the request itself against its limit, so a peer with a lower MAX_CTRL_MESSAGE still takes
    // small transfers inline.
    void set_max_message(uint32_t bytes, uint32_t inline_bytes = 0) {
        max_message_ = bytes;
        inline_allowance_ = inline_bytes;
    }

    // Queues a complete message (header included), or a message and its inline data (`tail`,
    // counted by its header: wire::end_message's `trailing`), which then go out back to back
    // without being copied into one buffer. Two buffers of half the size matter for a transfer's
    // inline bytes: one of a message and its bytes, allocated and freed for every transfer,
    // made malloc give the heap back and fault it in again each time (a 256 KiB inline write
    // took 1.5 ms instead of 0.1 on a VM).
    void queue(std::string msg, std::string tail = {});
    // The same for a reply to one of the peer's requests: counted by reply_bytes() until it has
    // gone out. A peer that asks without reading the answers would otherwise make us hold them
    // without bound (60 bytes of READ_REQ ask for 64 KiB of inline data).
    void queue_reply(std::string msg, std::string tail = {});
    // Bytes of replies queued and not yet written in full.
    uint64_t reply_bytes() const { return reply_bytes_; }
    // Bytes queued and not yet written, of every kind.
    uint64_t unsent() const { return queued_ - written_; }
    bool has_output() const { return !out_.empty(); }
    // Writes queued bytes until done or the socket is full.
    Status flush();

    // Reads what has arrived, or enough of it: it stops once the message in front is whole and
    // a read's worth (256 KiB) is here, so that what a peer streams at us is handled as it
    // comes rather than read ahead by the megabyte (and a peer whose reading is paused leaves
    // the rest in its socket, where TCP holds it back). *eof: the peer closed its side. *more
    // (optional): it stopped so, and more may be waiting in the socket.
    Status read(bool* eof, bool* more = nullptr);
    // The next complete message, or false. `body` stays valid until the next read() or
    // next_message(). A bad header is an error.
    StatusOr<bool> next_message(wire::Header* header, std::string_view* body);
    // The message next_message() handed out last is handed out again by the next call (it
    // could not be acted on yet: the engine stops reading meanwhile).
    void unread_message() { consumed_ = 0; }
    // Bytes read but not yet handed out (a partial message at EOF means the peer broke off).
    size_t buffered() const { return end_ - begin_; }
    // Memory held for what the peer sends: at most one maximal message and one read (256 KiB).
    size_t buffer_capacity() const { return in_.capacity(); }
    // Gives back a buffer grown past one read's worth (up to the connection's own 1 MiB while
    // messages came faster than they were handled), keeping what is buffered (nothing, or part
    // of a message that fits one read's worth) in one of that size: the engine calls it on its
    // timer tick, so that a peer that once sent a burst does not keep 1 MiB for good (MAX_PEERS
    // times), even one that never lets the buffer empty, while a busy connection keeps its
    // buffer between reads (freed and made again for every read, it halved 64 KiB reads on two
    // cores).
    void trim();

 private:
    // The largest body accepted for a message with these flags (max_message_, and the inline
    // allowance for one flagged kFlagInline).
    uint32_t body_limit(uint16_t flags) const {
        return max_message_ + ((flags & wire::kFlagInline) ? inline_allowance_ : 0);
    }
    // Room for a buffer of `capacity` bytes; false (starved_) when the shared room lacks it.
    bool take_room(size_t capacity);
    // Drops the read buffer past its own size, and the room it held.
    void shrink_buffer();
    // Moves what is buffered, if the message in front fits `capacity` whole, into a buffer of
    // that capacity and gives the shared room back; false when it does not (or a message handed
    // out still points into the buffer, or the buffer is no larger).
    bool compact(size_t capacity);
    void release_room();
    // What is queued will not go out: no longer counted.
    void release_replies();

    Fd fd_;
    std::deque<std::string> out_;
    size_t out_offset_ = 0;  // bytes of out_.front() already written
    uint64_t queued_ = 0;    // bytes ever queued
    uint64_t written_ = 0;   // bytes ever written
    // Each reply not yet written in full: where it ends in the output (as queued_ counts) and
    // its size.
    struct Reply {
        uint64_t end;
        uint64_t size;
    };
    std::deque<Reply> replies_;
    uint64_t reply_bytes_ = 0;
    std::vector<char> in_;
    size_t begin_ = 0;
    size_t end_ = 0;
    size_t consumed_ = 0;  // bytes of the message handed out last, dropped at the next call
    uint32_t max_message_ = wire::kHandshakeMessage;
    uint32_t inline_allowance_ = 0;
    CtrlRoom* room_ = nullptr;
    CtrlRoom* reply_room_ = nullptr;  // counts reply_bytes_
    uint64_t reserved_ = 0;           // of room_, for in_ past kOwnBuffer
    uint64_t starved_need_ = 0;       // what reserved_ must become for the read that starved
    bool starved_ = false;
};

}  // namespace tcpx::engine
