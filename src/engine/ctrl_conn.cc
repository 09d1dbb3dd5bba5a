#include "engine/ctrl_conn.h"

#include <sys/socket.h>

#include <algorithm>
#include <cstring>

#include "common/status_util.h"
#include "common/strings.h"

namespace tcpx::engine {

namespace {
constexpr size_t kReadChunk = 256 * 1024;
constexpr int kMaxIov = 64;
}  // namespace

void CtrlConn::reset(Fd fd) {
    fd_ = std::move(fd);
    release_replies();
    out_.clear();
    out_offset_ = 0;
    queued_ = written_ = 0;
    in_.clear();
    begin_ = end_ = consumed_ = 0;
    shrink_buffer();
    starved_ = false;
}

bool CtrlConn::take_room(size_t capacity) {
    const uint64_t need = capacity > kOwnBuffer ? capacity - kOwnBuffer : 0;
    if (need <= reserved_) return true;
    if (room_ != nullptr) {
        const uint64_t more = need - reserved_;
        if (room_->used > room_->limit || more > room_->limit - room_->used) {
            starved_ = true;
            starved_need_ = need;
            return false;
        }
        room_->used += more;
    }
    reserved_ = need;
    return true;
}

bool CtrlConn::room_fits() const {
    if (!starved_ || room_ == nullptr || starved_need_ <= reserved_) return true;
    const uint64_t more = starved_need_ - reserved_;
    return room_->used <= room_->limit && more <= room_->limit - room_->used;
}

void CtrlConn::release_room() {
    if (room_ != nullptr) room_->used -= reserved_;
    reserved_ = 0;
}

void CtrlConn::shrink_buffer() {
    // A large message (up to MAX_CTRL_MESSAGE) grew the buffer: give it back once it is
    // handled, or every peer that ever sent one would keep that much for good.
    if (in_.capacity() > kOwnBuffer) std::vector<char>().swap(in_);
    release_room();
}

bool CtrlConn::compact(size_t capacity) {
    // (Only between messages: one handed out and not yet dropped points into the buffer.)
    if (consumed_ != 0) return false;
    const size_t left = end_ - begin_;
    // What the message in front takes whole, where its header is here: it needs that anyway.
    size_t whole = left;
    if (left >= sizeof(wire::Header)) {
        wire::Header h;
        std::memcpy(&h, in_.data() + begin_, sizeof(h));
        whole = std::max(left, sizeof(wire::Header) + size_t{h.length});
    }
    if (whole > capacity || in_.capacity() <= capacity) return false;
    std::vector<char> fresh;
    if (left > 0) {
        fresh.reserve(capacity);
        fresh.assign(in_.data() + begin_, in_.data() + end_);
    }
    in_.swap(fresh);
    begin_ = 0;
    end_ = left;
    release_room();
    return true;
}

void CtrlConn::trim() {
    // What is left of a burst (nothing, or part of the next message, when a peer trickles its
    // stream so that the buffer is never empty) goes into one read's worth.
    if (reserved_ == 0) (void)compact(kReadChunk);
}

void CtrlConn::queue(std::string msg, std::string tail) {
    // Counted as each goes in: out of memory between the two, queued_ still says what is there.
    out_.push_back(std::move(msg));
    queued_ += out_.back().size();
    if (!tail.empty()) {
        out_.push_back(std::move(tail));
        queued_ += out_.back().size();
    }
}

void CtrlConn::queue_reply(std::string msg, std::string tail) {
    const uint64_t size = msg.size() + tail.size();
    replies_.push_back(Reply{queued_ + size, size});  // (may throw: nothing queued yet)
    try {
        queue(std::move(msg), std::move(tail));
    } catch (...) {
        replies_.pop_back();
        throw;
    }
    reply_bytes_ += size;
    if (reply_room_ != nullptr) reply_room_->used += size;
}

void CtrlConn::release_replies() {
    if (reply_room_ != nullptr) reply_room_->used -= reply_bytes_;
    reply_bytes_ = 0;
    replies_.clear();
}

Status CtrlConn::flush() {
    while (!out_.empty()) {
        iovec iov[kMaxIov];
        int cnt = 0;
        size_t offset = out_offset_;
        for (auto it = out_.begin(); it != out_.end() && cnt < kMaxIov; ++it) {
            iov[cnt++] = {it->data() + offset, it->size() - offset};
            offset = 0;
        }
        TCPX_ASSIGN_OR_RETURN(size_t n, send_some(fd_.get(), iov, cnt));
        if (n == 0) return Status();  // full: later
        written_ += n;
        while (!replies_.empty() && replies_.front().end <= written_) {
            reply_bytes_ -= replies_.front().size;
            if (reply_room_ != nullptr) reply_room_->used -= replies_.front().size;
            replies_.pop_front();
        }
        while (n > 0) {
            const size_t left = out_.front().size() - out_offset_;
            if (n >= left) {
                n -= left;
                out_.pop_front();
                out_offset_ = 0;
            } else {
                out_offset_ += n;
                n = 0;
            }
        }
    }
    return Status();
}

void CtrlConn::close_after_draining_input() {
    if (!fd_.valid()) return;
    // Up to what a socket's receive buffer holds on Linux by default (tcp_rmem's largest,
    // 6 MiB): a peer whose reading we had paused has that much waiting.
    char sink[16 * 1024];
    for (size_t dropped = 0; dropped < (size_t{8} << 20);) {
        const ssize_t n = ::recv(fd_.get(), sink, sizeof(sink), MSG_DONTWAIT);
        if (n <= 0) break;  // nothing more now, the peer's end, or an error: close either way
        dropped += static_cast<size_t>(n);
    }
    fd_.reset();
    release_room();
    release_replies();
}

size_t CtrlConn::front_lacks() const {
    const size_t start = begin_ + consumed_;
    const size_t have = end_ - start;
    if (have < sizeof(wire::Header)) return sizeof(wire::Header) - have;
    wire::Header h;
    std::memcpy(&h, in_.data() + start, sizeof(h));
    const size_t whole = sizeof(wire::Header) + size_t{h.length};
    return whole > have ? whole - have : 0;
}

Status CtrlConn::read(bool* eof, bool* more) {
    *eof = false;
    if (more != nullptr) *more = false;
    starved_ = false;
    while (true) {
        // Drop what was handed out, then make room.
        begin_ += consumed_;
        consumed_ = 0;
        if (begin_ == end_) {
            begin_ = end_ = 0;
            shrink_buffer();
        } else if (reserved_ > 0) {
            (void)compact(kOwnBuffer - kReadChunk);  // (see next_message)
        }
        // A peer cannot make us buffer without bound: once a maximal message's bytes are here,
        // the message in front is whole, and is handled before more is read (TCP holds the rest
        // back). So the buffer holds at most one maximal message and one read's worth more.
        const size_t bound = sizeof(wire::Header) + max_message_ + inline_allowance_;
        if (end_ - begin_ >= bound || (end_ - begin_ >= kReadChunk && front_lacks() == 0)) {
            if (more != nullptr) *more = true;
            return Status();
        }
        if (in_.size() - end_ < kReadChunk) {
            if (begin_ > 0) {
                std::memmove(in_.data(), in_.data() + begin_, end_ - begin_);
                end_ -= begin_;
                begin_ = 0;
            }
            const size_t want = end_ + kReadChunk;
            if (in_.size() < want) {
                if (want > in_.capacity()) {
                    // Doubling up to the own buffer. A message larger than that (its header is
                    // here: the front is at 0 now) gets room for itself whole and a read past it
                    // at once, from the shared room, or nothing more is read until room frees;
                    // one its limit refuses gets none (next_message says why).
                    size_t capacity = std::max(want, std::min(2 * in_.capacity(), kOwnBuffer));
                    if (end_ >= sizeof(wire::Header)) {
                        wire::Header h;
                        std::memcpy(&h, in_.data(), sizeof(h));
                        if (h.magic != wire::kMagic || h.length > body_limit(h.flags)) {
                            return Status();
                        }
                        capacity = std::max(capacity, sizeof(wire::Header) + h.length + kReadChunk);
                    }
                    if (!take_room(capacity)) return Status();
                    in_.reserve(capacity);
                }
                in_.resize(want);
            }
        }
        // A read's worth, or what the message in front still lacks: the buffer may be larger
        // (a maximal message grew it), and reading into all of it would read ahead that much.
        const size_t room = std::min(in_.size() - end_, std::max(kReadChunk, front_lacks()));
        TCPX_ASSIGN_OR_RETURN(size_t n, recv_some(fd_.get(), in_.data() + end_, room, eof));
        if (*eof || n == 0) return Status();
        end_ += n;
    }
}

StatusOr<bool> CtrlConn::next_message(wire::Header* header, std::string_view* body) {
    begin_ += consumed_;
    consumed_ = 0;
    if (begin_ == end_) {
        // All handled: a buffer grown for a large message, and its room, go back now rather
        // than at the next read (which a quiet peer may not bring for a long time).
        begin_ = end_ = 0;
        if (reserved_ > 0) shrink_buffer();
        return false;
    }
    // A message that took shared room was handled, and what follows it fits the own buffer:
    // that goes there and the room back now. Kept until the buffer emptied, a peer sending the
    // next message a few bytes at a time (a heartbeat split so that a part of it is always
    // here) held the room for as long as it liked.
    if (reserved_ > 0) (void)compact(kOwnBuffer - kReadChunk);
    if (end_ - begin_ < sizeof(wire::Header)) return false;
    std::memcpy(header, in_.data() + begin_, sizeof(wire::Header));
    if (header->magic != wire::kMagic) {
        return protocol_error(strformat("corrupt control stream (magic 0x%08x)", header->magic));
    }
    const uint32_t limit = body_limit(header->flags);
    if (header->length > limit) {
        return protocol_error(strformat("control message of %u bytes exceeds the limit of %u",
                                        header->length, limit));
    }
    if (end_ - begin_ < sizeof(wire::Header) + header->length) return false;
    *body = std::string_view(in_.data() + begin_ + sizeof(wire::Header), header->length);
    consumed_ = sizeof(wire::Header) + header->length;
    return true;
}

}  // namespace tcpx::engine
