#include "net/socket/socket_comm.h"

#include <sys/epoll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cstring>
#include <thread>

#include "common/cache_lines.h"
#include "common/log.h"
#include "common/status_util.h"
#include "common/strings.h"

namespace tcpx::net::socket_internal {
namespace {

// Bytes a conn moves in one service call before it yields to the other sockets of its thread.
constexpr uint64_t kServiceBudget = 8ULL << 20;
// Inline payloads at least this large are received straight into the destination buffer.
constexpr uint64_t kDirectInlineRecv = 4096;
// A lone one-chunk message is written by the posting thread itself only up to this size: a
// longer write holds the posting thread (an engine's progress thread) for longer than the thread
// handoff it spares costs. 128 KiB WRITEs through the engine, one chunk each, moved 11% less on
// two cores when their posting thread wrote them.
constexpr uint64_t kDirectWriteMax = 64 * 1024;
constexpr size_t kControlBufferSize = 64 * 1024;
constexpr size_t kScratchSize = 64 * 1024;

constexpr uint32_t kHangupEvents = EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR;

// Discarded payload (of a receive that failed) is read into this.
uint8_t* scratch_buffer() {
    thread_local std::unique_ptr<uint8_t[]> buf(new uint8_t[kScratchSize]);
    return buf.get();
}

// Conns are weighted by the traffic they carry when spread over pool threads, each lane (control,
// sending data, receiving data) on its own.
int conn_weight(const Conn& conn) { return conn.is_data() ? 4 : 1; }

IoPool::Lane conn_lane(const Comm& comm, const Conn& conn) {
    if (!conn.is_data()) return IoPool::Lane::kControl;
    return comm.kind() == Comm::kSendKind ? IoPool::Lane::kSendData : IoPool::Lane::kRecvData;
}

}  // namespace

// --- Comm ----------------------------------------------------------------------------------------

Comm::Comm(uint32_t kind, IoPool* pool, CommConfig config, std::string peer)
    : kind_(kind), pool_(pool), config_(config), peer_(std::move(peer)) {}

Comm::~Comm() = default;

Status Comm::start() {
    // Held throughout so that a conn failing as soon as it is added cannot start detaching the
    // comm before every conn is registered.
    std::lock_guard<std::mutex> lock(mu_);
    attached_ = static_cast<int>(conns_.size());
    for (size_t i = 0; i < conns_.size(); ++i) {
        Conn* conn = conns_[i].get();
        const int thread = pool_->assign_thread(conn_weight(*conn), conn_lane(*this, *conn));
        Status st = pool_->add(conn, conn->fd(), thread);
        if (!st.ok()) {
            pool_->unassign(thread, conn_weight(*conn), conn_lane(*this, *conn));
            // Conns not added count as detached; the added ones detach the usual way.
            attached_ -= static_cast<int>(conns_.size() - i);
            // No thread serves these yet; the detach tasks posted below are ordered after this.
            for (size_t j = i; j < conns_.size(); ++j) conns_[j]->detached_ = true;
            st.with_context("registering a socket with the I/O pool");
            fail_locked(st);
            return st;
        }
    }
    return Status();
}

void Comm::kick_locked(Conn* conn) {
    if (!closing_) pool_->kick(conn);
}

void Conn::service_failed(Status why) { comm_->fail(std::move(why)); }

void Comm::fail(Status why) {
    std::lock_guard<std::mutex> lock(mu_);
    fail_locked(std::move(why));
}

void Comm::fail_locked(Status why) {
    if (closing_) return;
    // Made before anything changes: out of memory here leaves the comm as it was, for a later
    // call to fail (closing_ set first would have made every later call return at once).
    Status error = std::move(why).with_context("connection with " + peer_);
    closing_ = true;
    failed_ = true;
    error_ = std::move(error);
    // A peer closing an idle connection is ordinary (fail_pending_locked() warns when requests
    // are lost); a peer breaking the protocol is not.
    // (Limited to a few a second with the other lines a stranger's connections cause: a peer
    // can break the protocol of comm after comm.)
    if (error_.code() == StatusCode::kProtocol) {
        if (may_log_stranger_event()) TCPX_WARN("%s", error_.to_string().c_str());
    } else {
        TCPX_DEBUG("%s", error_.to_string().c_str());
    }
    if (attached_ == 0) {
        fail_pending_locked();
        cv_.notify_all();
        return;
    }
    for (auto& conn : conns_) {
        Conn* c = conn.get();
        if (c->thread() >= 0) pool_->post(c->thread(), [this, c] { detach(c); });
    }
}

void Comm::detach(Conn* conn) {
    {
        std::lock_guard<std::mutex> io_lock(conn->io_mu_);
        if (conn->detached_) return;
        pool_->remove(conn, conn->fd());
        pool_->unassign(conn->thread(), conn_weight(*conn), conn_lane(*this, *conn));
        conn->detached_ = true;
    }
    std::lock_guard<std::mutex> lock(mu_);
    // A failed comm tells its peer at once (rather than leaving it to time out): its sockets
    // are shut down now, though closed only when the comm is.
    if (failed_) ::shutdown(conn->fd(), SHUT_RDWR);
    if (--attached_ == 0) {
        if (failed_) fail_pending_locked();
        cv_.notify_all();
    }
}

bool Comm::drop_memory(const uint8_t* data, uint64_t size) {
    {
        std::lock_guard<std::mutex> lock(mu_);
        if (!pending_on_locked(data, size)) return false;
        fail_locked(cancelled("memory deregistered while requests on it were pending"));
    }
    shut_down();
    return true;
}

void Comm::shut_down() {
    std::unique_lock<std::mutex> lock(mu_);
    closing_ = true;
    for (auto& conn : conns_) {
        Conn* c = conn.get();
        if (c->thread() < 0) continue;
        ++shutdown_tasks_;
        // Tasks run in posting order on each thread, so this one runs after any detach task
        // that a failure posted before; kicks issued before it are served before it.
        pool_->post(c->thread(), [this, c] {
            // Counted even when detaching throws (out of memory; the pool logs it): close
            // would wait for this task forever.
            struct Done {
                Comm* comm;
                ~Done() {
                    std::lock_guard<std::mutex> task_lock(comm->mu_);
                    --comm->shutdown_tasks_;
                    comm->cv_.notify_all();
                }
            } done{this};
            detach(c);
        });
    }
    if (pool_->driven()) {
        // No thread will run the tasks: run the rounds here (another caller may be running one,
        // then it runs ours).
        while (shutdown_tasks_ != 0) {
            lock.unlock();
            if (!pool_->drive()) std::this_thread::yield();
            lock.lock();
        }
        return;
    }
    cv_.wait(lock, [this] { return shutdown_tasks_ == 0; });
}

Status Comm::error_locked(std::string_view op) const {
    if (failed_) return Status(error_.code(), error_.message()).with_context(op);
    return failed_precondition(std::string(op) + ": connection is closed");
}

// --- SendComm ------------------------------------------------------------------------------------

SendComm::SendComm(IoPool* pool, CommConfig config, std::string peer, Fd control,
                   std::vector<Fd> data)
    : Comm(kSendKind, pool, config, std::move(peer)) {
    add_conns(std::move(control), std::move(data), &control_, &data_);
    reqs_.init(this, config_.max_requests);
}

uint64_t SendComm::chunk_size_for(uint64_t size) const {
    // Enough chunks to spread one message over every data socket, but no chunk so small that
    // headers and wakeups dominate, nor so large that one slow socket holds the message back.
    const uint64_t nsocks = data_.size();
    uint64_t chunk = (size + nsocks - 1) / nsocks;
    chunk = (chunk + 4095) & ~uint64_t{4095};
    return std::clamp(chunk, config_.min_chunk_size, config_.chunk_size);
}

Status SendComm::isend(const void* data, uint64_t size, int tag, SendReq** out) {
    const IoSeg seg{const_cast<void*>(data), size};
    return send_impl(std::span<const IoSeg>(&seg, 1), tag, out);
}

Status SendComm::isendv(std::span<const IoSeg> segs, int tag, SendReq** out) {
    return send_impl(segs, tag, out);
}

Status SendComm::send_impl(std::span<const IoSeg> segs, int tag, SendReq** out) {
    *out = nullptr;
    for (size_t i = 0; i < segs.size(); ++i) {
        if (segs[i].data == nullptr && segs[i].size > 0) {
            return invalid_argument(
                strformat("isend: null buffer of %zu bytes (segment %zu)", segs[i].size, i));
        }
    }
    bool fast = false;
    SendDataConn* direct = nullptr;
    SendReq* req = nullptr;
    // A socket this thread writes itself (taken with try_lock below), released however the
    // write ends: an exception (out of memory) must not leave it locked for its I/O thread.
    std::unique_lock<std::mutex> direct_io, fast_io;
    bool committed = false;  // the request queued: from then on it is the caller's
    try {
        {
            std::lock_guard<std::mutex> lock(mu_);
            if (closing_) return error_locked("isend");
            req = reqs_.take();
            if (req == nullptr) return Status();  // no room: the caller posts again later
            // All or nothing (a caller may post again what failed to post): out of memory for the
            // list or a queue's entry gives the slot back and takes no sequence number, which the
            // receiver would otherwise wait for with every later message behind it.
            TakenRequest<SendReq> taken(reqs_, req);
            if (!req->mem.set(segs)) {
                return invalid_argument("isend: the segments' sizes add up past 2^64");
            }
            const uint64_t size = req->mem.size();
            // Small messages (and empty ones) travel whole on the control socket; larger ones are
            // cut into chunks for the data sockets.
            const bool is_inline = size <= config_.inline_threshold || size == 0;
            req->size = size;
            req->seq = next_seq_;  // (taken once the request is queued)
            req->tag = tag;
            req->chunk = is_inline ? 0 : chunk_size_for(size);
            const uint64_t chunks = is_inline ? 0 : (size + req->chunk - 1) / req->chunk;
            req->parts_left.store(static_cast<uint32_t>(is_inline ? 1 : chunks),
                                  std::memory_order_relaxed);
            req->state.store(ReqState::kPending, std::memory_order_relaxed);

            if (!is_inline) {
                const bool queue_was_empty = chunk_queue_.empty();
                chunk_queue_.push_back(req);
                ++next_seq_;
                taken.keep();
                committed = true;
                // Latency path: a one-chunk message on an idle comm (no other request outstanding)
                // is written by this thread, on an idle data socket whose writer is free, sparing a
                // thread wakeup. Under load the I/O threads do the writing, in parallel (they pull
                // chunks as they drain); a posting thread writing them would serialize the comm.
                const bool comm_idle = reqs_.in_use() == 1;
                if (queue_was_empty && comm_idle && chunks == 1 && size <= kDirectWriteMax) {
                    for (SendDataConn* conn : data_) {
                        if (!conn->idle_) continue;
                        direct_io = std::unique_lock<std::mutex>(conn->io_mu_, std::try_to_lock);
                        if (direct_io.owns_lock()) {
                            next_chunk_locked(conn);
                            direct = conn;
                            break;
                        }
                    }
                }
                if (direct == nullptr) {
                    // Wake as many idle data sockets as there are new chunks; busy ones pull the
                    // next chunk themselves when they finish their current one.
                    uint64_t to_wake = chunks;
                    for (SendDataConn* conn : data_) {
                        if (to_wake == 0) break;
                        if (conn->idle_) {
                            conn->idle_ = false;
                            kick_locked(conn);
                            --to_wake;
                        }
                    }
                }
            } else {
                OutMsg msg{};
                msg.hdr = wire::MsgHeader{wire::kMsgMagic, 0, req->seq, size, tag, 0};
                msg.total = sizeof(wire::MsgHeader) + size;
                msg.req = req;
                out_.push_back(msg);
                ++next_seq_;
                taken.keep();
                committed = true;
                // Fast path: a lone message (nothing else of this comm outstanding) is written by
                // this thread when the control socket's writer is free, sparing a thread handoff on
                // the latency-critical path. Under load the I/O thread writes: a posting thread
                // that wrote every small message would serialize the comm on itself.
                if (reqs_.in_use() == 1 && out_.size() == 1 &&
                    (fast_io = std::unique_lock<std::mutex>(control_->io_mu_, std::try_to_lock))
                        .owns_lock()) {
                    fast = true;
                } else {
                    kick_locked(control_);
                }
            }
        }
        if (fast) {
            control_->flush_locked();
            fast_io.unlock();
        }
        if (direct != nullptr) {
            direct->write_locked(/*one_chunk=*/true);
            direct_io.unlock();
        }
    } catch (...) {
        if (!committed) throw;  // nothing posted: the caller may post again
        // Queued, and out of memory waking or writing its sockets: it may never go out, and
        // posting it again would send it twice. The comm fails, and the request with it.
        if (direct_io.owns_lock()) direct_io.unlock();
        if (fast_io.owns_lock()) fast_io.unlock();
        try {
            fail(resource_exhausted("isend: out of memory once the message was queued"));
        } catch (...) {
            // (no memory for that either: the caller's next post or test may find some)
        }
    }
    *out = req;
    return Status();
}

Status SendComm::test(SendReq* req, bool* done, size_t* size) {
    *done = false;
    if (req->state.load(std::memory_order_acquire) == ReqState::kPending) return Status();
    std::lock_guard<std::mutex> lock(mu_);
    // Read again under the lock: another thread testing the same request may have released it
    // meanwhile (testing may come from several threads), and releasing it twice would hand one
    // slot to two later posts.
    const ReqState state = req->state.load(std::memory_order_acquire);
    if (state == ReqState::kFree) {
        return failed_precondition("test: request is not in flight (already completed?)");
    }
    *done = true;
    if (size != nullptr) *size = req->size;
    reqs_.give(req);
    if (state == ReqState::kFailed) return error_locked("isend");
    return Status();
}

bool SendComm::pending_on_locked(const uint8_t* data, uint64_t size) const {
    return reqs_.any_pending([&](const SendReq& r) { return r.mem.overlaps(data, size); });
}

void SendComm::fail_pending_locked() {
    const int failed = reqs_.fail_pending();
    // The caller learns each failure from test(), with this status: no warning here.
    if (failed > 0) {
        TCPX_DEBUG("%d sends failed: %s", failed, error_.to_string().c_str());
        pool_->completions().notify();
    }
}

bool SendComm::next_chunk_locked(SendDataConn* conn) {
    if (chunk_queue_.empty()) {
        conn->idle_ = true;
        return false;
    }
    SendReq* req = chunk_queue_.front();
    const uint64_t len = std::min(req->chunk, req->size - chunk_offset_);
    conn->req_ = req;
    conn->hdr_ = wire::ChunkHeader{wire::kChunkMagic,
                                   static_cast<uint32_t>(len),
                                   req->seq,
                                   req->size,
                                   chunk_offset_,
                                   req->tag,
                                   0};
    conn->sent_ = 0;
    conn->idle_ = false;
    chunk_offset_ += len;
    if (chunk_offset_ == req->size) {
        chunk_queue_.pop_front();
        chunk_offset_ = 0;
    }
    return true;
}

void SendComm::part_done(SendReq* req) {
    if (req->parts_left.fetch_sub(1, std::memory_order_acq_rel) == 1) {
        req->state.store(ReqState::kDone, std::memory_order_release);
        pool_->completions().notify();
    }
}

// --- SendControlConn -----------------------------------------------------------------------------

SendComm* SendControlConn::send_comm() const { return static_cast<SendComm*>(comm_); }

void SendControlConn::service(uint32_t events) {
    std::lock_guard<std::mutex> lock(io_mu_);
    if (detached_) return;
    if (events == 0 || (events & kHangupEvents)) read_locked();
    flush_locked();
}

void SendControlConn::read_locked() {
    SendComm* comm = send_comm();
    while (reply_got_ < sizeof(reply_)) {
        bool eof = false;
        auto n = recv_some(fd(), reinterpret_cast<uint8_t*>(&reply_) + reply_got_,
                           sizeof(reply_) - reply_got_, &eof);
        if (!n.ok()) return comm->fail(n.status());
        if (eof) return comm->fail(unavailable("peer closed the connection during the handshake"));
        if (*n == 0) return;
        reply_got_ += *n;
        if (reply_got_ < sizeof(reply_)) continue;
        if (Status st = wire::check_hello_reply(reply_); !st.ok()) return comm->fail(std::move(st));
    }
    // After the reply the receiver sends nothing; anything readable is its close or garbage.
    uint8_t byte = 0;
    bool eof = false;
    auto n = recv_some(fd(), &byte, 1, &eof);
    if (!n.ok()) return comm->fail(n.status());
    if (eof) return comm->fail(unavailable("peer closed the connection"));
    if (*n > 0) return comm->fail(protocol_error("unexpected data from the receiving side"));
}

void SendControlConn::flush_locked() {
    if (detached_) return;
    SendComm* comm = send_comm();
    constexpr int kMaxIov = 64;
    iovec iov[kMaxIov];
    // Messages the write ended (each had an iovec in it): no allocation once bytes are out.
    SendReq* finished[kMaxIov];
    while (true) {
        int cnt = 0;
        {
            std::lock_guard<std::mutex> lock(comm->mu_);
            // Deque elements stay put while posters append, and only this writer pops, so the
            // iovecs may point into them after the lock is released.
            for (auto it = comm->out_.begin(); it != comm->out_.end() && cnt + 2 <= kMaxIov; ++it) {
                constexpr uint64_t kHdr = sizeof(wire::MsgHeader);
                if (it->sent < kHdr) {
                    iov[cnt++] = {reinterpret_cast<uint8_t*>(&it->hdr) + it->sent, kHdr - it->sent};
                }
                const uint64_t payload_sent = it->sent > kHdr ? it->sent - kHdr : 0;
                const uint64_t left = it->total - kHdr - payload_sent;
                if (left > 0) {
                    const int k = it->req->mem.iov(payload_sent, left, iov + cnt, kMaxIov - cnt);
                    uint64_t covered = 0;
                    for (int j = 0; j < k; ++j) covered += iov[cnt + j].iov_len;
                    cnt += k;
                    // The stream is in order: no later message before this one's last byte.
                    if (covered < left) break;
                }
            }
        }
        if (cnt == 0) return;
        auto n = send_some(fd(), iov, cnt);
        if (!n.ok()) return comm->fail(n.status());
        if (*n == 0) return;  // socket full: the EPOLLOUT edge resumes us
        uint64_t left = *n;
        int nfinished = 0;
        {
            std::lock_guard<std::mutex> lock(comm->mu_);
            while (left > 0) {
                SendComm::OutMsg& msg = comm->out_.front();
                const uint64_t take = std::min(left, msg.total - msg.sent);
                msg.sent += take;
                left -= take;
                if (msg.sent == msg.total) {
                    finished[nfinished++] = msg.req;
                    comm->out_.pop_front();
                }
            }
        }
        for (int i = 0; i < nfinished; ++i) comm->part_done(finished[i]);
    }
}

// --- SendDataConn --------------------------------------------------------------------------------

SendComm* SendDataConn::send_comm() const { return static_cast<SendComm*>(comm_); }

void SendDataConn::service(uint32_t events) {
    std::lock_guard<std::mutex> lock(io_mu_);
    if (detached_) return;
    SendComm* comm = send_comm();
    if (events & kHangupEvents) {
        // The receiving side never writes on data sockets but to refuse one (its reply, then a
        // close): readable means refused, closed or broken. A refusal fails the comm with the
        // listener's reason, whichever of its sockets tells first.
        wire::HelloReply reply{};
        bool eof = false;
        auto n = recv_some(fd(), reinterpret_cast<uint8_t*>(&reply), sizeof(reply), &eof);
        if (!n.ok()) return comm->fail(n.status());
        if (*n == sizeof(reply) && reply.magic == wire::kReplyMagic) {
            Status st = wire::check_hello_reply(reply);
            return comm->fail(!st.ok() ? std::move(st)
                                       : protocol_error("a second handshake reply, on a data "
                                                        "socket"));
        }
        if (eof && *n == 0) return comm->fail(unavailable("peer closed the connection"));
        if (*n > 0) return comm->fail(protocol_error("unexpected data from the receiving side"));
    }
    write_locked(/*one_chunk=*/false);
}

void SendDataConn::write_locked(bool one_chunk) {
    if (detached_) return;
    SendComm* comm = send_comm();
    uint64_t moved = 0;
    while (true) {
        if (req_ == nullptr) {
            std::lock_guard<std::mutex> comm_lock(comm->mu_);
            if (one_chunk) {
                // A posting thread wrote its chunk: leave the rest to this socket's I/O thread,
                // which must be woken if chunks arrived meanwhile (posters only wake idle ones).
                if (!comm->chunk_queue_.empty()) {
                    comm->kick_locked(this);
                } else {
                    idle_ = true;
                }
                return;
            }
            if (comm->closing_ || !comm->next_chunk_locked(this)) return;
        }
        constexpr uint64_t kHdr = sizeof(wire::ChunkHeader);
        const uint64_t total = kHdr + hdr_.length;
        constexpr int kMaxIov = 64;
        iovec iov[kMaxIov];
        int cnt = 0;
        if (sent_ < kHdr) iov[cnt++] = {reinterpret_cast<uint8_t*>(&hdr_) + sent_, kHdr - sent_};
        const uint64_t payload_sent = sent_ > kHdr ? sent_ - kHdr : 0;
        cnt += req_->mem.iov(hdr_.offset + payload_sent, hdr_.length - payload_sent, iov + cnt,
                             kMaxIov - cnt);
        auto n = send_some(fd(), iov, cnt);
        if (!n.ok()) return comm->fail(n.status());
        if (*n == 0) return;  // socket full: the EPOLLOUT edge resumes us on the I/O thread
        sent_ += *n;
        moved += *n;
        if (sent_ == total) {
            SendReq* req = req_;
            req_ = nullptr;
            comm->part_done(req);
        }
        if (moved >= kServiceBudget && req_ == nullptr && !one_chunk) {
            comm->pool()->continue_later(this);
            return;
        }
    }
}

// --- RecvComm ------------------------------------------------------------------------------------

RecvComm::RecvComm(IoPool* pool, CommConfig config, std::string peer, Fd control,
                   std::vector<Fd> data)
    : Comm(kRecvKind, pool, config, std::move(peer)) {
    add_conns(std::move(control), std::move(data), &control_, &data_);
    reqs_.init(this, config_.max_requests);
}

Status RecvComm::irecv(int n, void* const* data, const size_t* sizes, const int* tags,
                       RecvReq** out, unsigned write_back) {
    *out = nullptr;
    if (n < 1 || n > kMaxRecvs) {
        return invalid_argument(strformat("irecv: n = %d is outside [1, %d]", n, kMaxRecvs));
    }
    if (data == nullptr || sizes == nullptr || tags == nullptr) {
        return invalid_argument("irecv: null data, sizes or tags array");
    }
    IoSeg one[kMaxRecvs];
    std::span<const IoSeg> msgs[kMaxRecvs];
    for (int i = 0; i < n; ++i) {
        one[i] = IoSeg{data[i], sizes[i]};
        msgs[i] = std::span<const IoSeg>(&one[i], 1);
    }
    return recv_impl(n, msgs, tags, out, write_back);
}

Status RecvComm::irecvv(std::span<const IoSeg> segs, int tag, RecvReq** out) {
    *out = nullptr;
    return recv_impl(1, &segs, &tag, out, 0);
}

Status RecvComm::recv_impl(int n, const std::span<const IoSeg>* msgs, const int* tags,
                           RecvReq** out, unsigned write_back) {
    for (int i = 0; i < n; ++i) {
        for (size_t k = 0; k < msgs[i].size(); ++k) {
            if (msgs[i][k].data == nullptr && msgs[i][k].size > 0) {
                return invalid_argument(
                    strformat("irecv: buffer %d is null but has %zu bytes", i, msgs[i][k].size));
            }
        }
    }
    std::lock_guard<std::mutex> lock(mu_);
    if (closing_) return error_locked("irecv");
    RecvReq* req = reqs_.take();
    if (req == nullptr) return Status();      // no room: the caller posts again later
    TakenRequest<RecvReq> taken(reqs_, req);  // (all or nothing, as isend)
    for (int i = 0; i < n; ++i) {
        RecvReq::Slot& slot = req->slots[i];
        if (!slot.mem.set(msgs[i])) {
            return invalid_argument("irecv: the segments' sizes add up past 2^64");
        }
        slot.mem.set_write_back((write_back >> i & 1u) != 0);
        slot.capacity = slot.mem.size();
        slot.tag = tags[i];
        slot.used = false;
        slot.size = 0;
    }
    req->n = n;
    req->first_seq = next_post_seq_;
    req->unmatched = n;
    req->incomplete = n;
    req->error = Status();
    req->state.store(ReqState::kPending, std::memory_order_relaxed);
    posted_.push_back(req);
    taken.keep();
    next_post_seq_ += static_cast<uint64_t>(n);
    outstanding_.store(static_cast<int>(reqs_.in_use()), std::memory_order_relaxed);
    try {
        wake_parked_locked();
    } catch (...) {
        // Posted: a socket parked for it and not woken would leave it waiting; the comm fails,
        // and the request with it (as isend once its message is queued).
        try {
            fail_locked(resource_exhausted("irecv: out of memory once the receive was posted"));
        } catch (...) {
        }
    }
    *out = req;
    return Status();
}

Status RecvComm::test(RecvReq* req, bool* done, size_t* sizes) {
    *done = false;
    ReqState state = req->state.load(std::memory_order_acquire);
    if (state == ReqState::kPending && outstanding_.load(std::memory_order_relaxed) == 1 &&
        control_->io_mu_.try_lock()) {
        // Progress in test(), as NCCL's own socket transport does: a caller polling for a lone
        // small message reads it on its own core the moment it arrives, instead of waiting for
        // an I/O thread to wake up and hand it over. Only the control socket (whole small
        // messages), only while this is the one receive outstanding (under load the I/O thread
        // reads: a polling thread reading everything would serialize the comm on itself), and
        // not while its I/O thread holds it (that thread is already at work).
        {
            std::lock_guard<std::mutex> io(control_->io_mu_, std::adopt_lock);
            control_->service_locked();
        }
        state = req->state.load(std::memory_order_acquire);
    }
    if (state == ReqState::kPending) return Status();
    std::lock_guard<std::mutex> lock(mu_);
    state = req->state.load(std::memory_order_acquire);  // (again under the lock: as SendComm's)
    if (state == ReqState::kFree) {
        return failed_precondition("test: request is not in flight (already completed?)");
    }
    *done = true;
    if (sizes != nullptr) {
        for (int i = 0; i < req->n; ++i) sizes[i] = req->slots[i].size;
    }
    Status result;
    if (state == ReqState::kFailed) {
        result = req->error.ok() ? error_locked("irecv") : Status(req->error).with_context("irecv");
    }
    reqs_.give(req);
    outstanding_.store(static_cast<int>(reqs_.in_use()), std::memory_order_relaxed);
    return result;
}

bool RecvComm::pending_on_locked(const uint8_t* data, uint64_t size) const {
    return reqs_.any_pending([&](const RecvReq& r) {
        for (int i = 0; i < r.n && i < kMaxRecvs; ++i) {
            if (r.slots[i].mem.overlaps(data, size)) return true;
        }
        return false;
    });
}

void RecvComm::fail_pending_locked() {
    const int failed = reqs_.fail_pending();
    if (failed > 0) {
        TCPX_DEBUG("%d receives failed: %s", failed, error_.to_string().c_str());
        pool_->completions().notify();
    }
}

RecvComm::Bind RecvComm::bind_locked(Conn* conn, uint64_t seq, uint64_t size, int tag, RecvMsg* msg,
                                     Status* error) {
    if (seq < bound_upto_) {
        *error = protocol_error(
            strformat("message %llu arrived twice", static_cast<unsigned long long>(seq)));
        return Bind::kError;
    }
    if (seq > bound_upto_ || posted_.empty()) {
        // An earlier message is still unbound (its first bytes are on another socket), or no
        // receive is posted yet.
        park_locked(conn, seq);
        return Bind::kPark;
    }
    RecvReq* req = posted_.front();
    *msg = RecvMsg{};
    msg->req = req;
    msg->size = size;
    int slot = -1;
    for (int i = 0; i < req->n; ++i) {
        if (!req->slots[i].used && req->slots[i].tag == tag) {
            slot = i;
            break;
        }
    }
    // A message that cannot land is read and dropped (the comm stays usable), but only so much
    // of it: its size is the peer's word, and a peer could otherwise keep us reading and
    // dropping (up to 2^64 bytes) while every later receive waits behind it.
    const bool lands = slot >= 0 && size <= req->slots[slot].capacity;
    if (!lands && size > wire::kMaxDropBytes) {
        *error = protocol_error(strformat(
            "a message of %llu bytes cannot land in the receive (%s), and is more than the "
            "%llu bytes dropped of one",
            static_cast<unsigned long long>(size),
            slot < 0 ? "no unfilled buffer has its tag" : "larger than its buffer",
            static_cast<unsigned long long>(wire::kMaxDropBytes)));
        return Bind::kError;
    }
    if (slot < 0) {
        if (req->error.ok()) {
            req->error = invalid_argument(strformat(
                "a message of %llu bytes with tag %d matches no unfilled buffer of the receive",
                static_cast<unsigned long long>(size), tag));
        }
    } else {
        RecvReq::Slot& s = req->slots[slot];
        s.used = true;
        if (size > s.capacity) {
            if (req->error.ok()) {
                req->error = out_of_range(strformat(
                    "a message of %llu bytes does not fit receive buffer %d of %llu bytes",
                    static_cast<unsigned long long>(size), slot,
                    static_cast<unsigned long long>(s.capacity)));
            }
        } else {
            s.size = size;
            msg->dest = &s.mem;
            const uint64_t units = (size + wire::kChunkAlign - 1) / wire::kChunkAlign;
            msg->covered.assign((units + 63) / 64, 0);
        }
    }
    ++bound_upto_;
    if (--req->unmatched == 0) posted_.pop_front();
    wake_parked_locked();
    return Bind::kBound;
}

void RecvComm::park_locked(Conn* conn, uint64_t seq) {
    conn->park_seq_ = seq;
    if (!conn->parked_) {
        conn->parked_ = true;
        parked_.push_back(conn);
    }
    fail_if_stuck_locked();
}

void RecvComm::fail_if_stuck_locked() {
    // A sender puts messages on each socket in order: a socket whose next chunk (or message) is
    // of message p carries nothing of an earlier one any more. The oldest message still needed
    // is the oldest one bound with bytes missing, else the next to bind. Once every socket has
    // reached its end of stream or waits on a later message than that, it can never come, and
    // the receives would wait for ever: with the peer gone (killed while one socket was ahead of
    // the others), or with a peer that skipped a message or sent less than it announced. A
    // waiting socket reads no more, so it would not even see its own end of stream.
    uint64_t needed = bound_upto_;
    for (const auto& [seq, msg] : chunked_) needed = std::min(needed, seq);
    size_t ahead = 0;
    for (const Conn* conn : parked_) {
        if (conn->park_seq_ > needed) ++ahead;
    }
    if (ahead == 0 || static_cast<size_t>(eofs_) + ahead < conns_.size()) return;
    fail_locked(unavailable(strformat(
        "peer closed or stalled every socket while message %llu can no longer arrive (each "
        "socket is past it)",
        static_cast<unsigned long long>(needed))));
}

void RecvComm::wake_parked_locked() {
    // Only conns that can now proceed: their message is the next to bind (and a receive may have
    // been posted) or already bound. Waking the others would only have them park again.
    auto keep = parked_.begin();
    for (Conn* conn : parked_) {
        if (conn->park_seq_ <= bound_upto_) {
            conn->parked_ = false;
            kick_locked(conn);
        } else {
            *keep++ = conn;
        }
    }
    parked_.erase(keep, parked_.end());
}

bool RecvMsg::claim(uint64_t offset, uint64_t length) {
    if (offset % wire::kChunkAlign != 0 ||
        (length % wire::kChunkAlign != 0 && offset + length != size)) {
        return false;
    }
    if (claimed + length > size) return false;
    if (dest != nullptr) {
        // Alignment makes the chunk's units whole: the last may be partial only at the end.
        const uint64_t first = offset / wire::kChunkAlign;
        const uint64_t end = (offset + length + wire::kChunkAlign - 1) / wire::kChunkAlign;
        for (uint64_t u = first; u < end; ++u) {
            if (covered[u / 64] & (uint64_t{1} << (u % 64))) return false;
        }
        for (uint64_t u = first; u < end; ++u) covered[u / 64] |= uint64_t{1} << (u % 64);
    }
    claimed += length;
    return true;
}

void RecvComm::complete_locked(const RecvMsg& msg) {
    RecvReq* req = msg.req;
    if (--req->incomplete == 0) {
        req->state.store(req->error.ok() ? ReqState::kDone : ReqState::kFailed,
                         std::memory_order_release);
        pool_->completions().notify();
    }
}

void RecvComm::eof_locked() {
    if (++eofs_ == static_cast<int>(conns_.size())) {
        fail_locked(unavailable("peer closed the connection"));
        return;
    }
    fail_if_stuck_locked();
}

// --- MsgMemory ---------------------------------------------------------------------------------

bool MsgMemory::set(std::span<const IoSeg> segs) {
    segs_.assign(segs.begin(), segs.end());
    ends_.resize(segs.size());
    uint64_t at = 0;
    for (size_t i = 0; i < segs.size(); ++i) {
        if (segs[i].size > UINT64_MAX - at) return false;
        at += segs[i].size;
        ends_[i] = at;
    }
    return true;
}

int MsgMemory::iov(uint64_t off, uint64_t len, iovec* out, int max) const {
    // The first segment ending past `off` (segments of no bytes end where the last one did).
    size_t i =
        static_cast<size_t>(std::upper_bound(ends_.begin(), ends_.end(), off) - ends_.begin());
    int n = 0;
    while (len > 0 && n < max && i < segs_.size()) {
        const uint64_t start = ends_[i] - segs_[i].size;
        const uint64_t in = off - start;
        const uint64_t take = std::min<uint64_t>(segs_[i].size - in, len);
        out[n++] = {static_cast<uint8_t*>(segs_[i].data) + in, take};
        off += take;
        len -= take;
        ++i;
    }
    return n;
}

bool MsgMemory::overlaps(const uint8_t* data, uint64_t size) const {
    const auto lo = reinterpret_cast<uintptr_t>(data);
    for (const IoSeg& seg : segs_) {
        const auto at = reinterpret_cast<uintptr_t>(seg.data);
        if (seg.size > 0 && size > 0 && at < lo + size && lo < at + seg.size) return true;
    }
    return false;
}

void MsgMemory::received(const iovec* iov, int cnt, uint64_t n) const {
    if (!write_back_) return;
    for (int j = 0; j < cnt && n > 0; ++j) {
        const uint64_t len = std::min<uint64_t>(n, iov[j].iov_len);
        write_back_lines(iov[j].iov_base, len);
        n -= len;
    }
}

void MsgMemory::copy_in(uint64_t off, const uint8_t* src, uint64_t len) const {
    constexpr int kMaxIov = 16;
    iovec to[kMaxIov];
    while (len > 0) {
        const int n = iov(off, len, to, kMaxIov);
        if (n == 0) return;
        for (int j = 0; j < n; ++j) {
            std::memcpy(to[j].iov_base, src, to[j].iov_len);
            if (write_back_) write_back_lines(to[j].iov_base, to[j].iov_len);
            src += to[j].iov_len;
            off += to[j].iov_len;
            len -= to[j].iov_len;
        }
    }
}

// --- RecvControlConn -----------------------------------------------------------------------------

RecvControlConn::RecvControlConn(Comm* comm, Fd fd, int index)
    : Conn(comm, std::move(fd), index), buf_(new uint8_t[kControlBufferSize]) {}

RecvComm* RecvControlConn::recv_comm() const { return static_cast<RecvComm*>(comm_); }

bool RecvControlConn::fill() {
    RecvComm* comm = recv_comm();
    if (begin_ > 0) {
        std::memmove(buf_.get(), buf_.get() + begin_, avail());
        end_ -= begin_;
        begin_ = 0;
    }
    bool eof = false;
    auto n = recv_some(fd(), buf_.get() + end_, kControlBufferSize - end_, &eof);
    if (!n.ok()) {
        comm->fail(n.status());
        return false;
    }
    if (eof) {
        if (have_hdr_ || avail() > 0) {
            comm->fail(unavailable("peer closed the connection in the middle of a message"));
        } else if (!eof_) {
            eof_ = true;
            std::lock_guard<std::mutex> lock(comm->mu_);
            comm->eof_locked();
        }
        return false;
    }
    end_ += *n;
    return *n > 0;
}

void RecvControlConn::service(uint32_t events) {
    std::lock_guard<std::mutex> lock(io_mu_);
    service_locked();
}

void RecvControlConn::service_locked() {
    if (detached_ || eof_) return;
    RecvComm* comm = recv_comm();
    uint64_t moved = 0;
    while (true) {
        if (!have_hdr_) {
            if (avail() < sizeof(wire::MsgHeader)) {
                if (!fill()) return;
                continue;
            }
            std::memcpy(&hdr_, buf_.get() + begin_, sizeof(hdr_));
            begin_ += sizeof(hdr_);
            if (hdr_.magic != wire::kMsgMagic) {
                return comm->fail(protocol_error(
                    strformat("corrupt control stream (message magic 0x%08x)", hdr_.magic)));
            }
            if (hdr_.size > wire::kMaxInlineSize) {
                return comm->fail(protocol_error(strformat(
                    "control message %llu of %llu bytes: no sender puts more than %llu there",
                    static_cast<unsigned long long>(hdr_.seq),
                    static_cast<unsigned long long>(hdr_.size),
                    static_cast<unsigned long long>(wire::kMaxInlineSize))));
            }
            have_hdr_ = true;
            bound_ = false;
        }
        if (!bound_) {
            std::lock_guard<std::mutex> comm_lock(comm->mu_);
            Status error;
            switch (comm->bind_locked(this, hdr_.seq, hdr_.size, hdr_.tag, &msg_, &error)) {
                case RecvComm::Bind::kPark:
                    return;  // kicked when it can bind
                case RecvComm::Bind::kError:
                    comm->fail_locked(std::move(error));
                    return;
                case RecvComm::Bind::kBound:
                    break;
            }
            bound_ = true;
            got_ = 0;
        }
        while (got_ < hdr_.size) {
            const uint64_t want = hdr_.size - got_;
            if (avail() == 0) {
                if (msg_.dest != nullptr && want >= kDirectInlineRecv) {
                    bool eof = false;
                    constexpr int kMaxIov = 64;
                    iovec iov[kMaxIov];
                    const int cnt = msg_.dest->iov(got_, want, iov, kMaxIov);
                    auto n = recv_some_iov(fd(), iov, cnt, &eof);
                    if (!n.ok()) return comm->fail(n.status());
                    msg_.dest->received(iov, cnt, *n);
                    if (eof) {
                        return comm->fail(
                            unavailable("peer closed the connection in the middle of a message"));
                    }
                    if (*n == 0) return;
                    got_ += *n;
                    continue;
                }
                if (!fill()) return;
                continue;
            }
            const uint64_t take = std::min<uint64_t>(want, avail());
            if (msg_.dest != nullptr) msg_.dest->copy_in(got_, buf_.get() + begin_, take);
            begin_ += take;
            got_ += take;
        }
        {
            std::lock_guard<std::mutex> comm_lock(comm->mu_);
            comm->complete_locked(msg_);
        }
        have_hdr_ = false;
        moved += sizeof(wire::MsgHeader) + hdr_.size;
        if (moved >= kServiceBudget) {
            comm->pool()->continue_later(this);
            return;
        }
    }
}

// --- RecvDataConn --------------------------------------------------------------------------------

RecvComm* RecvDataConn::recv_comm() const { return static_cast<RecvComm*>(comm_); }

void RecvDataConn::wake_at(uint64_t bytes) {
    // On a wire slower than the reader, a socket is readable after every few packets: one wakeup
    // and one read per 20-30 KiB at 1 Gbit/s and a 1500-byte MTU. Asking for readiness only once
    // a good part of the chunk is there cuts both by about 3x there (docs/socket-transport.md);
    // where the reader is the slower, the bytes are there anyway and nothing changes. The kernel
    // still wakes the reader at end of stream, on an error, and when its receive window or memory
    // runs short, so a peer that stops mid-chunk is seen as before.
    const uint64_t cap = recv_comm()->config_.rcvlowat;
    if (cap == 0 || !lowat_works_) return;
    const int want = static_cast<int>(std::clamp<uint64_t>(std::min(bytes, cap), 1, INT32_MAX));
    if (want == lowat_) return;
    if (::setsockopt(fd(), SOL_SOCKET, SO_RCVLOWAT, &want, sizeof(want)) == 0) {
        lowat_ = want;
    } else {
        // Back to waking on every arrival (correct, only more wakeups), and never again.
        lowat_works_ = false;
        const int one = 1;
        if (lowat_ != 1 && ::setsockopt(fd(), SOL_SOCKET, SO_RCVLOWAT, &one, sizeof(one)) == 0) {
            lowat_ = 1;
        }
    }
}

void RecvDataConn::service(uint32_t events) {
    std::lock_guard<std::mutex> lock(io_mu_);
    if (detached_ || eof_) return;
    RecvComm* comm = recv_comm();
    uint64_t moved = 0;
    while (true) {
        if (!have_hdr_) {
            if (hdr_got_ < sizeof(hdr_)) {
                bool eof = false;
                auto n = recv_some(fd(), reinterpret_cast<uint8_t*>(&hdr_) + hdr_got_,
                                   sizeof(hdr_) - hdr_got_, &eof);
                if (!n.ok()) return comm->fail(n.status());
                if (eof) {
                    if (hdr_got_ > 0) {
                        return comm->fail(
                            unavailable("peer closed the connection in the middle of a chunk"));
                    }
                    eof_ = true;
                    std::lock_guard<std::mutex> comm_lock(comm->mu_);
                    comm->eof_locked();
                    return;
                }
                if (*n == 0) {
                    wake_at(1);
                    return;
                }
                hdr_got_ += *n;
                if (hdr_got_ < sizeof(hdr_)) continue;
            }
            if (hdr_.magic != wire::kChunkMagic || hdr_.length == 0) {
                return comm->fail(
                    protocol_error(strformat("corrupt data stream (chunk magic 0x%08x, length %u)",
                                             hdr_.magic, hdr_.length)));
            }
            have_hdr_ = true;
            bound_ = false;
            got_ = 0;
        }
        if (!bound_) {
            std::lock_guard<std::mutex> comm_lock(comm->mu_);
            if (hdr_.seq >= comm->bound_upto_) {
                // The first chunk of its message seen anywhere: bind the message here.
                RecvMsg msg;
                Status error;
                switch (comm->bind_locked(this, hdr_.seq, hdr_.size, hdr_.tag, &msg, &error)) {
                    case RecvComm::Bind::kPark:
                        return;  // kicked when it can bind
                    case RecvComm::Bind::kError:
                        comm->fail_locked(std::move(error));
                        return;
                    case RecvComm::Bind::kBound:
                        // Moved in: its bitmap is not copied.
                        comm->chunked_.emplace(hdr_.seq, std::move(msg));
                        break;
                }
            }
            auto it = comm->chunked_.find(hdr_.seq);
            if (it == comm->chunked_.end() || hdr_.size != it->second.size ||
                hdr_.offset + hdr_.length < hdr_.offset ||
                hdr_.offset + hdr_.length > it->second.size) {
                comm->fail_locked(protocol_error(strformat(
                    "chunk [%llu, +%u) of message %llu does not belong to a message in flight",
                    static_cast<unsigned long long>(hdr_.offset), hdr_.length,
                    static_cast<unsigned long long>(hdr_.seq))));
                return;
            }
            if (!it->second.claim(hdr_.offset, hdr_.length)) {
                comm->fail_locked(protocol_error(strformat(
                    "chunk [%llu, +%u) of message %llu overlaps another of its chunks or is not "
                    "aligned to %llu bytes",
                    static_cast<unsigned long long>(hdr_.offset), hdr_.length,
                    static_cast<unsigned long long>(hdr_.seq),
                    static_cast<unsigned long long>(wire::kChunkAlign))));
                return;
            }
            dest_ = it->second.dest;
            bound_ = true;
        }
        size_t lookahead = 0;  // bytes of the next chunk's header read with this payload
        while (got_ < hdr_.length) {
            const uint64_t want = hdr_.length - got_;
            bool eof = false;
            StatusOr<size_t> n = size_t{0};
            if (dest_ != nullptr) {
                // The payload's tail and the next header in one call: one syscall per chunk
                // saved while chunks stream in.
                constexpr int kMaxIov = 64;
                iovec iov[kMaxIov];
                int cnt = dest_->iov(hdr_.offset + got_, want, iov, kMaxIov - 1);
                uint64_t covered = 0;
                for (int j = 0; j < cnt; ++j) covered += iov[j].iov_len;
                // The next header only right behind this payload's last byte.
                if (covered == want) iov[cnt++] = {next_hdr_, sizeof(next_hdr_)};
                n = recv_some_iov(fd(), iov, cnt, &eof);
                // (The next header, past `want`, is not the message's.)
                if (n.ok()) dest_->received(iov, cnt, std::min<uint64_t>(*n, want));
            } else {
                n = recv_some(fd(), scratch_buffer(), std::min<uint64_t>(want, kScratchSize), &eof);
            }
            if (!n.ok()) return comm->fail(n.status());
            if (eof) {
                return comm->fail(
                    unavailable("peer closed the connection in the middle of a chunk"));
            }
            if (*n == 0) {
                wake_at(want);
                return;
            }
            if (*n > want) {
                lookahead = *n - want;
                got_ = hdr_.length;
                moved += want;
                break;
            }
            got_ += *n;
            moved += *n;
            if (moved >= kServiceBudget && got_ < hdr_.length) {
                comm->pool()->continue_later(this);
                return;
            }
        }
        {
            std::lock_guard<std::mutex> comm_lock(comm->mu_);
            auto it = comm->chunked_.find(hdr_.seq);
            if (it == comm->chunked_.end()) {
                // Cannot happen: the message completes only once every chunk claimed has been
                // read in full, this one included. Refuse rather than trust it.
                comm->fail_locked(
                    protocol_error(strformat("chunk of message %llu finished after its message",
                                             static_cast<unsigned long long>(hdr_.seq))));
                return;
            }
            it->second.received += hdr_.length;
            if (it->second.received == it->second.size) {
                comm->complete_locked(it->second);
                comm->chunked_.erase(it);
            }
        }
        std::memcpy(&hdr_, next_hdr_, lookahead);
        hdr_got_ = lookahead;
        have_hdr_ = false;
        bound_ = false;
        if (moved >= kServiceBudget) {
            comm->pool()->continue_later(this);
            return;
        }
    }
}

}  // namespace tcpx::net::socket_internal

namespace tcpx::net::wire {

const char* reply_status_text(ReplyStatus status) {
    switch (status) {
        case ReplyStatus::kAccepted:
            return "accepted";
        case ReplyStatus::kVersionMismatch:
            return "protocol version mismatch";
        case ReplyStatus::kWrongListener:
            return "the handle belongs to another listener";
        case ReplyStatus::kBadHello:
            return "malformed handshake";
        case ReplyStatus::kBusy:
            return "the listener is setting up as many connections as it takes";
    }
    return "unknown reason";
}

std::optional<ReplyStatus> check_hello(const Hello& h, uint64_t listen_nonce, uint16_t nsocks) {
    if (h.magic != kHelloMagic) return std::nullopt;
    if (h.version != kVersion) return ReplyStatus::kVersionMismatch;
    if (h.listen_nonce != listen_nonce) return ReplyStatus::kWrongListener;
    // A connector opens at most its own NSOCKS of the sockets a handle offers: any count from 1
    // to the listener's is a comm of that many.
    if (h.nsocks < 1 || h.nsocks > nsocks ||
        (h.role == static_cast<uint16_t>(Role::kControl) && h.index != 0) ||
        (h.role == static_cast<uint16_t>(Role::kData) && h.index >= h.nsocks) ||
        (h.role != static_cast<uint16_t>(Role::kControl) &&
         h.role != static_cast<uint16_t>(Role::kData))) {
        return ReplyStatus::kBadHello;
    }
    return ReplyStatus::kAccepted;
}

Status check_hello_reply(const HelloReply& reply) {
    if (reply.magic != kReplyMagic) {
        return protocol_error("the peer is not a tcpx-p2p socket endpoint");
    }
    const auto status = static_cast<ReplyStatus>(reply.status);
    if (status != ReplyStatus::kAccepted) {
        return unavailable(
            strformat("peer refused the connection: %s (peer protocol version %u, ours %u)",
                      reply_status_text(status), reply.version, kVersion));
    }
    return Status();
}

}  // namespace tcpx::net::wire
