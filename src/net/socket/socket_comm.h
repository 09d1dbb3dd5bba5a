// Internals of the socket transport's comms: the send and receive sides of one connection and
// the sockets (Conns) they are made of. Private to src/net/socket.
//
// Threads and locks
// - Each Conn is served by one I/O pool thread (IoPool::Handler). Only that thread reads its
//   socket; writes come from that thread or, for the send side's control socket, from a posting
//   thread's fast path (Conn::io_mu arbitrates: the I/O thread locks, a poster only try-locks).
// - Comm::mu guards the comm's shared state: request slots, sequence numbers, the queues between
//   posters and conns, matching, failure. Lock order: Conn::io_mu, then Comm::mu, then the pool's
//   own mutexes. No syscall that moves payload runs under Comm::mu.
// - Kicks (asking a conn's thread to service it) are issued under Comm::mu only while the comm is
//   not closing, so once detach tasks are posted no new kick can reach a conn.
//
// Lifetime and failure
// - A comm is created with all its sockets connected and handshaken, then its conns are added to
//   the pool. fail() (any thread) marks the comm failed and posts a detach task for each conn to
//   its thread; when the last conn is detached, pending requests are marked failed. Only then can
//   a caller learn of the failure, so no thread still reads from or writes into the caller's
//   buffers when test() reports it.
// - close() detaches whatever is still attached and waits for a task on every conn's thread, so
//   nothing touches the comm when it is deleted.
#pragma once

#include <sys/uio.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/params.h"
#include "common/socket.h"
#include "net/net.h"
#include "net/socket/io_pool.h"
#include "net/socket/wire.h"
#include "tcpx/status.h"

namespace tcpx::net::socket_internal {

// The largest n accepted by irecv (NCCL's grouped receives use up to 8).
inline constexpr int kMaxRecvs = 8;

enum class ReqState : int { kFree = 0, kPending, kDone, kFailed };

// A message's memory: one buffer (isend/irecv) or segments back to back (isendv/irecvv). Owned
// by a request and reused with it, so steady traffic allocates nothing.
class MsgMemory {
 public:
    void set(uint8_t* data, uint64_t size) {
        segs_.assign(1, IoSeg{data, size});
        ends_.assign(1, size);
    }
    // False when the segments' total overflows.
    bool set(std::span<const IoSeg> segs);
    uint64_t size() const { return ends_.empty() ? 0 : ends_.back(); }
    // Up to `max` iovecs covering [off, off + len) (within size()); how many were filled. They
    // cover less than `len` when the range spans more than `max` segments.
    int iov(uint64_t off, uint64_t len, iovec* out, int max) const;
    // Copies `len` bytes from `src` to [off, off + len).
    void copy_in(uint64_t off, const uint8_t* src, uint64_t len) const;
    // Whether any segment shares a byte with [data, data + size).
    bool overlaps(const uint8_t* data, uint64_t size) const;

    // A device reads this memory right after the receive (Net::hint_device_reads): what the CPU
    // writes into it is written back out of its caches as it lands (copy_in, received()).
    void set_write_back(bool on) { write_back_ = on; }
    // The first `n` bytes of `iov` were just received into this memory.
    void received(const iovec* iov, int cnt, uint64_t n) const;

 private:
    std::vector<IoSeg> segs_;
    std::vector<uint64_t> ends_;  // where each segment ends in the message
    bool write_back_ = false;
};

// What a net::Request* points to: a SendReq or a RecvReq, told apart by `kind`.
struct ReqBase {
    static constexpr uint32_t kSend = 0x53524551;  // "SREQ"
    static constexpr uint32_t kRecv = 0x52524551;  // "RREQ"
    explicit ReqBase(uint32_t k) : kind(k) {}
    const uint32_t kind;
};

// A comm's fixed set of request slots (its in-flight limit) and the free ones. Guarded by the
// owning comm's mu_.
template <typename Req>
class RequestPool {
 public:
    template <typename Owner>
    void init(Owner* owner, int n) {
        all_.reserve(static_cast<size_t>(n));
        for (int i = 0; i < n; ++i) {
            all_.push_back(std::make_unique<Req>(owner));
            free_.push_back(all_.back().get());
        }
    }
    // A free slot, or null when every slot is in flight.
    Req* take() {
        if (free_.empty()) return nullptr;
        Req* req = free_.back();
        free_.pop_back();
        return req;
    }
    void give(Req* req) {
        req->state.store(ReqState::kFree, std::memory_order_relaxed);
        free_.push_back(req);
    }
    size_t in_use() const { return all_.size() - free_.size(); }
    // Whether a pending request satisfies `pred`.
    template <typename Pred>
    bool any_pending(Pred pred) const {
        for (const auto& req : all_) {
            // (acquire: a request seen done is done with its memory)
            if (req->state.load(std::memory_order_acquire) == ReqState::kPending && pred(*req)) {
                return true;
            }
        }
        return false;
    }
    // Marks every pending request failed; returns how many.
    int fail_pending() {
        int failed = 0;
        for (auto& req : all_) {
            if (req->state.load(std::memory_order_relaxed) == ReqState::kPending) {
                req->state.store(ReqState::kFailed, std::memory_order_release);
                ++failed;
            }
        }
        return failed;
    }

 private:
    std::vector<std::unique_ptr<Req>> all_;
    std::vector<Req*> free_;
};

// A request taken from a pool for one post, given back when this goes out of scope unless kept
// (under the comm's lock, as the pool is): a post that ends early, refused or out of memory part
// way, leaves its slot free (give() never allocates).
template <typename Req>
class TakenRequest {
 public:
    TakenRequest(RequestPool<Req>& pool, Req* req) : pool_(pool), req_(req) {}
    ~TakenRequest() {
        if (!kept_) pool_.give(req_);
    }
    TakenRequest(const TakenRequest&) = delete;
    TakenRequest& operator=(const TakenRequest&) = delete;
    void keep() { kept_ = true; }

 private:
    RequestPool<Req>& pool_;
    Req* const req_;
    bool kept_ = false;
};

// Per-comm settings, copied from Settings when the comm is made.
struct CommConfig {
    uint64_t chunk_size = 0;
    uint64_t min_chunk_size = 0;
    uint64_t inline_threshold = 0;
    int max_requests = 0;
    uint64_t rcvlowat = 0;  // data sockets' SO_RCVLOWAT at most (RecvDataConn::wake_at)
};

class Comm;

class Conn : public IoPool::Handler {
 public:
    Conn(Comm* comm, Fd fd, int index) : comm_(comm), fd_(std::move(fd)), index_(index) {}
    int fd() const { return fd_.get(); }
    int index() const { return index_; }  // -1 for control, else the data socket's index
    bool is_data() const { return index_ >= 0; }
    // service() threw (out of memory): the comm fails, as on a socket error.
    void service_failed(Status why) override;

 protected:
    friend class Comm;
    friend class RecvComm;
    Comm* comm_;
    Fd fd_;
    int index_;
    std::mutex io_mu_;       // see the header comment
    bool detached_ = false;  // under io_mu_ (set on the owner thread)
    bool eof_ = false;       // the peer closed its side (owner thread)
    bool parked_ = false;    // under Comm::mu_: waiting for a bind or a receive, to be kicked
    uint64_t park_seq_ = 0;  // under Comm::mu_: the message it waits to bind
};

class Comm {
 public:
    static constexpr uint32_t kSendKind = 0x53434f4d;  // "SCOM"
    static constexpr uint32_t kRecvKind = 0x52434f4d;  // "RCOM"

    Comm(uint32_t kind, IoPool* pool, CommConfig config, std::string peer);
    virtual ~Comm();

    // kSendKind or kRecvKind: lets the Net entry points reject a comm of the wrong direction.
    uint32_t kind() const { return kind_; }
    const std::string& peer() const { return peer_; }
    IoPool* pool() const { return pool_; }

    // Adds the conns to the pool (their threads start serving them).
    Status start();
    // Marks the comm failed with `why` (first failure wins) and detaches every conn; pending
    // requests fail once all are detached. Any thread.
    void fail(Status why);
    void fail_locked(Status why);
    // Detaches every conn and waits until no pool thread can touch this comm. Caller's thread.
    void shut_down();
    // [data, data + size) is going away (its registration is being dropped). Where a pending
    // request's memory shares a byte with it, the pool threads would go on reading or writing
    // it once freed: NCCL deregisters only at teardown, an abort's included, with receives still
    // posted and a live peer still sending. Such a comm fails (its requests fail), and this
    // returns once no pool thread can touch it; true then. Caller's thread.
    bool drop_memory(const uint8_t* data, uint64_t size);

 protected:
    // Under mu_, once every conn is detached after a failure: fail the pending requests.
    virtual void fail_pending_locked() = 0;
    // Under mu_: whether a pending request's memory shares a byte with [data, data + size).
    virtual bool pending_on_locked(const uint8_t* data, uint64_t size) const = 0;
    // Makes the control conn and one data conn per data fd (before start()).
    template <typename ControlConn, typename DataConn>
    void add_conns(Fd control, std::vector<Fd> data, ControlConn** control_out,
                   std::vector<DataConn*>* data_out) {
        auto ctrl = std::make_unique<ControlConn>(this, std::move(control), -1);
        *control_out = ctrl.get();
        conns_.push_back(std::move(ctrl));
        for (size_t i = 0; i < data.size(); ++i) {
            auto conn = std::make_unique<DataConn>(this, std::move(data[i]), static_cast<int>(i));
            data_out->push_back(conn.get());
            conns_.push_back(std::move(conn));
        }
    }
    void kick_locked(Conn* conn);
    // The error callers see once the comm has failed (under mu_).
    Status error_locked(std::string_view op) const;
    // Runs on the conn's thread: unregisters it.
    void detach(Conn* conn);

    const uint32_t kind_;
    IoPool* const pool_;
    const CommConfig config_;
    const std::string peer_;  // "10.0.0.2:41234", for messages
    std::vector<std::unique_ptr<Conn>> conns_;

    std::mutex mu_;
    std::condition_variable cv_;
    bool closing_ = false;  // detach under way: no more kicks
    bool failed_ = false;
    Status error_;
    int attached_ = 0;
    int shutdown_tasks_ = 0;  // shut_down() tasks not yet run
};

// --- send side
// -------------------------------------------------------------------------------------

class SendComm;

struct SendReq : ReqBase {
    explicit SendReq(SendComm* c) : ReqBase(kSend), comm(c) {}
    SendComm* const comm;
    std::atomic<ReqState> state{ReqState::kFree};
    MsgMemory mem;
    uint64_t size = 0;
    uint64_t seq = 0;
    uint64_t chunk = 0;  // chunk length for data sockets; 0 when inline
    int tag = 0;
    std::atomic<uint32_t> parts_left{0};  // inline message or chunks still to be written
};

class SendControlConn final : public Conn {
 public:
    using Conn::Conn;
    void service(uint32_t events) override;
    // Writes queued messages until done or the socket is full. Requires io_mu_.
    void flush_locked();

 private:
    friend class SendComm;
    SendComm* send_comm() const;
    void read_locked();
    wire::HelloReply reply_{};
    size_t reply_got_ = 0;
};

class SendDataConn final : public Conn {
 public:
    using Conn::Conn;
    void service(uint32_t events) override;
    // Writes chunks until the socket is full or none is left. Requires io_mu_. With `one_chunk`
    // (a posting thread's fast path) it stops after the current chunk.
    void write_locked(bool one_chunk);

 private:
    friend class SendComm;
    SendComm* send_comm() const;
    // The chunk being written.
    SendReq* req_ = nullptr;
    wire::ChunkHeader hdr_{};
    uint64_t sent_ = 0;  // bytes of header + payload written (the payload is req_'s at
                         // hdr_.offset)
    bool idle_ = true;   // under Comm::mu_: waiting for chunks, needs a kick when some arrive
};

class SendComm final : public Comm {
 public:
    SendComm(IoPool* pool, CommConfig config, std::string peer, Fd control, std::vector<Fd> data);

    Status isend(const void* data, uint64_t size, int tag, SendReq** out);
    Status isendv(std::span<const IoSeg> segs, int tag, SendReq** out);
    Status test(SendReq* req, bool* done, size_t* size);

 private:
    friend class SendControlConn;
    friend class SendDataConn;

    struct OutMsg {
        wire::MsgHeader hdr;
        uint64_t total;  // header + payload bytes (the payload is req's memory)
        uint64_t sent;
        SendReq* req;
    };

    void fail_pending_locked() override;
    bool pending_on_locked(const uint8_t* data, uint64_t size) const override;
    // isend and isendv: one message of `segs`.
    Status send_impl(std::span<const IoSeg> segs, int tag, SendReq** out);
    uint64_t chunk_size_for(uint64_t size) const;
    // Under mu_: gives `conn` its next chunk; false when there is none (conn goes idle).
    bool next_chunk_locked(SendDataConn* conn);
    void part_done(SendReq* req);

    SendControlConn* control_ = nullptr;
    std::vector<SendDataConn*> data_;
    RequestPool<SendReq> reqs_;         // under mu_
    uint64_t next_seq_ = 0;             // under mu_
    std::deque<OutMsg> out_;            // under mu_; only the control conn's writer pops
    std::deque<SendReq*> chunk_queue_;  // under mu_: messages with chunks left to hand out
    uint64_t chunk_offset_ = 0;         // under mu_: next offset in chunk_queue_.front()
};

// --- receive side
// ----------------------------------------------------------------------------------

class RecvComm;

struct RecvReq : ReqBase {
    explicit RecvReq(RecvComm* c) : ReqBase(kRecv), comm(c) {}
    RecvComm* const comm;
    std::atomic<ReqState> state{ReqState::kFree};
    int n = 0;
    uint64_t first_seq = 0;
    int unmatched = 0;   // under mu_: messages not yet bound
    int incomplete = 0;  // under mu_: messages not yet fully received
    struct Slot {
        MsgMemory mem;
        uint64_t capacity = 0;
        int tag = 0;
        bool used = false;
        uint64_t size = 0;
    } slots[kMaxRecvs];
    Status error;  // under mu_: why the request failed (first error)
};

// A message bound to a receive, whose payload is still arriving.
struct RecvMsg {
    RecvReq* req = nullptr;
    const MsgMemory* dest = nullptr;  // null: discard (the receive failed for this message)
    uint64_t size = 0;
    uint64_t received = 0;  // bytes of chunks read in full
    uint64_t claimed = 0;   // bytes of chunks bound to it: read in full or still arriving
    // With a destination: one bit per wire::kChunkAlign bytes of the message, set once a chunk
    // has claimed them (one bit per 4 KiB: 2 KiB for a 64 MiB message).
    std::vector<uint64_t> covered;

    // Claims [offset, offset + length) for a chunk about to be read: false when the chunk is not
    // aligned as wire::kChunkAlign says or overlaps bytes claimed before. The caller has checked
    // that it lies within the message. So received == size only once every byte has arrived and
    // no chunk of the message is still being read.
    bool claim(uint64_t offset, uint64_t length);
};

class RecvControlConn final : public Conn {
 public:
    RecvControlConn(Comm* comm, Fd fd, int index);
    void service(uint32_t events) override;
    // Reads and delivers what has arrived. Requires io_mu_; any thread (RecvComm::test).
    void service_locked();

 private:
    friend class RecvComm;
    RecvComm* recv_comm() const;
    // Reads more bytes into buf_; false when nothing more can be read now.
    bool fill();
    size_t avail() const { return end_ - begin_; }

    std::unique_ptr<uint8_t[]> buf_;
    size_t begin_ = 0;
    size_t end_ = 0;
    bool have_hdr_ = false;
    bool bound_ = false;
    wire::MsgHeader hdr_{};
    RecvMsg msg_;  // the message being copied
    uint64_t got_ = 0;
};

class RecvDataConn final : public Conn {
 public:
    using Conn::Conn;
    void service(uint32_t events) override;

 private:
    friend class RecvComm;
    RecvComm* recv_comm() const;
    wire::ChunkHeader hdr_{};
    size_t hdr_got_ = 0;
    uint8_t next_hdr_[sizeof(wire::ChunkHeader)];  // read ahead with a payload's tail
    bool have_hdr_ = false;                        // hdr_ is complete and checked
    bool bound_ = false;
    const MsgMemory* dest_ = nullptr;  // null: discard (else the chunk lands at hdr_.offset)
    uint64_t got_ = 0;
    // Before waiting for readiness again: `bytes` are sure to come (the rest of the chunk being
    // received; 1 between chunks), so readiness is asked for once that many, at most
    // CommConfig::rcvlowat, have arrived. Never more than will come: the socket would not wake.
    void wake_at(uint64_t bytes);
    int lowat_ = 1;            // the socket's SO_RCVLOWAT
    bool lowat_works_ = true;  // false after a failed setsockopt: not tried again
};

class RecvComm final : public Comm {
 public:
    RecvComm(IoPool* pool, CommConfig config, std::string peer, Fd control, std::vector<Fd> data);

    // Bit i of `write_back`: buffer i is read by a device next (MsgMemory::set_write_back).
    Status irecv(int n, void* const* data, const size_t* sizes, const int* tags, RecvReq** out,
                 unsigned write_back = 0);
    Status irecvv(std::span<const IoSeg> segs, int tag, RecvReq** out);
    Status test(RecvReq* req, bool* done, size_t* sizes);

 private:
    friend class RecvControlConn;
    friend class RecvDataConn;

    enum class Bind { kBound, kPark, kError };
    void fail_pending_locked() override;
    bool pending_on_locked(const uint8_t* data, uint64_t size) const override;
    // irecv and irecvv: `n` messages, message i into the segments msgs[i].
    Status recv_impl(int n, const std::span<const IoSeg>* msgs, const int* tags, RecvReq** out,
                     unsigned write_back);
    // Under mu_: binds message `seq` to the oldest posted receive. kPark when an earlier message is
    // not bound yet or no receive is posted: `conn` is parked and kicked when that changes.
    Bind bind_locked(Conn* conn, uint64_t seq, uint64_t size, int tag, RecvMsg* msg, Status* error);
    void park_locked(Conn* conn, uint64_t seq);
    // Under mu_: kicks every parked conn to try again.
    void wake_parked_locked();
    // Under mu_: fails the comm when the oldest message still needed (bound with bytes missing,
    // else the next to bind) can no longer arrive: every conn at its end of stream or parked on
    // a later message.
    void fail_if_stuck_locked();
    // Under mu_: `msg` has all its bytes.
    void complete_locked(const RecvMsg& msg);
    // Under mu_: a conn reached end-of-stream cleanly; the comm fails once all have.
    void eof_locked();

    RecvControlConn* control_ = nullptr;
    std::vector<RecvDataConn*> data_;
    RequestPool<RecvReq> reqs_;        // under mu_
    std::atomic<int> outstanding_{0};  // reqs_.in_use(), readable without mu_ (test() fast path)
    std::deque<RecvReq*> posted_;      // under mu_: receives with messages still to bind
    uint64_t next_post_seq_ = 0;       // under mu_: first seq of the next receive
    uint64_t bound_upto_ = 0;          // under mu_: every seq below is bound
    std::unordered_map<uint64_t, RecvMsg> chunked_;  // under mu_: bound, chunks still arriving
    std::vector<Conn*> parked_;                      // under mu_
    int eofs_ = 0;                                   // under mu_
};

}  // namespace tcpx::net::socket_internal
