// The transfer engine behind tcpx::Endpoint: one-sided READ/WRITE and two-sided send/recv over a
// two-sided, FIFO-ordered transport (net::Net).
//
// Per peer pair: one control connection (plain TCP, framed messages, ctrl_wire.h) and
// `channels` data channels in each direction (each a Net comm). One-sided requests travel on
// control; their data travels on the channels, cut into chunks of at most xfer_chunk_size, one
// Net request each. Nothing on a channel says which transfer a chunk belongs to: both sides
// derive it. Every control message that starts data flowing in one direction (WRITE_REQ and
// SEND_DATA from the data's sender, READ_RESP from the data's sender) assigns that data's chunks
// to channels round-robin with a per-direction counter, at the moment the message is queued; the
// receiving side, handling control messages in order, assigns its receives with its own copy of
// the counter. Net comms match sends and receives in posting order, so every chunk lands where
// its receive says.
//
// A write's data follows its WRITE_REQ without waiting (one round trip per write). The target
// validates every segment before posting any receive; a refused write is still received, into a
// scratch buffer, so the channels stay in step, and answered with the reason. Reads wait for the
// target's READ_RESP before posting receives, so a refused read moves no data at all; a read's
// notification leaves the initiator as a NOTIF once the read's last byte is in place. Small
// transfers travel inside their control messages.
//
// Threads: all engine state is guarded by one mutex. A progress thread (optional) drives the
// transport and the control connections; API calls also make progress while they hold the lock,
// and poll/wait do when they can take it. Transfer states are readable without the lock
// (xfer_table.h).
#pragma once

#include <sys/epoll.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "common/params.h"
#include "common/slot_fifo.h"
#include "common/socket.h"
#include "common/wakeup.h"
#include "cuda/device.h"
#include "engine/auth.h"
#include "engine/ctrl_conn.h"
#include "engine/packer.h"
#include "engine/reaper.h"
#include "engine/registry.h"
#include "engine/spin_score.h"
#include "engine/tag_queue.h"
#include "engine/xfer_table.h"
#include "net/net.h"
#include "tcpx/endpoint.h"

namespace tcpx::engine {

using Clock = std::chrono::steady_clock;

// now + timeout, saturating: a caller's "forever" (milliseconds::max()) must not overflow.
inline Clock::time_point deadline_after(std::chrono::milliseconds timeout) {
    const auto now = Clock::now();
    const auto room =
        std::chrono::duration_cast<std::chrono::milliseconds>(Clock::time_point::max() - now);
    if (timeout.count() < 0) return now;
    return timeout >= room ? Clock::time_point::max() : now + timeout;
}

struct Peer;

// Notifications held for the application, counted against a bound.
struct NotificationTally {
    uint64_t count = 0;
    uint64_t bytes = 0;
};

// The room a served write's notification takes in the endpoint-wide tally while the write's
// data arrives. It goes back when its transfer is deleted, however the transfer ends: delivered
// (the notification is in the queue, counted there, by then) or failed. Tied to the transfer's
// lifetime so that no path that ends a transfer can forget it.
class HeldNotificationRoom {
 public:
    HeldNotificationRoom() = default;
    HeldNotificationRoom(NotificationTally* tally, uint64_t bytes) : tally_(tally), bytes_(bytes) {
        ++tally_->count;
        tally_->bytes += bytes_;
    }
    HeldNotificationRoom(const HeldNotificationRoom&) = delete;
    HeldNotificationRoom& operator=(const HeldNotificationRoom&) = delete;
    HeldNotificationRoom& operator=(HeldNotificationRoom&& other) noexcept {
        release();
        tally_ = std::exchange(other.tally_, nullptr);
        bytes_ = other.bytes_;
        return *this;
    }
    ~HeldNotificationRoom() { release(); }

 private:
    void release() {
        if (tally_ == nullptr) return;
        --tally_->count;
        tally_->bytes -= bytes_;
        tally_ = nullptr;
    }
    NotificationTally* tally_ = nullptr;
    uint64_t bytes_ = 0;
};

// A transfer in progress: one the application posted (user_id != 0), or a peer's request being
// served. Holds a reference on every region it touches until it is destroyed.
struct Xfer {
    enum class Kind { kWrite, kRead, kSend, kRecv, kServeWrite, kServeRead };
    Kind kind = Kind::kWrite;
    // A peer's request we serve (counted in its Peer::served), not one of our own transfers.
    bool served() const { return kind == Kind::kServeWrite || kind == Kind::kServeRead; }
    Peer* peer = nullptr;
    XferId user_id = 0;     // slot in the XferTable; 0 for served requests
    uint64_t wire_id = 0;   // ours (initiator, receiver of a send) or the initiator's (served)
    uint64_t ops_left = 0;  // chunk requests not yet complete
    uint64_t chunk = 0;     // bytes per chunk of its data (the peer's agreed size, or less)
    bool waiting = false;   // for the peer's WRITE_ACK / READ_RESP / RECV_CTS / SEND_DATA
    Status result;          // the first failure
    // Local places, in transfer order: where a read/recv lands, where a write/send comes from,
    // what a served request touches.
    struct Piece {
        Region* region;
        uint64_t offset;
        uint64_t len;
    };
    std::vector<Piece> pieces;
    // The notification that follows the data: a served write delivers it to our application once
    // the data is in place here; a read sends it to the peer once the data is in place here.
    bool has_notification = false;
    std::string notification;
    // A served write's notification has its room in the peer's queue held from the request on,
    // so writes in flight cannot push the queue past its bound; and in the endpoint's.
    bool notification_held = false;
    // A read with a notification the target accepted (its READ_RESP was not an error): the
    // target holds the notification until our READ_DONE, owed once the read ends.
    bool read_done_owed = false;
    // A read whose READ_REQ asked for the data inline (all our pieces host memory): the target
    // may answer so with any number of pieces; unasked, with at most kMaxInlineGpuPieces.
    bool asked_inline = false;
    // cancel() asked (a read or write of ours): nothing more of it touches our memory (a read's
    // chunks not yet posted land in scratch, see make_op), and once nothing of it does (a read's
    // chunks on their way have landed, a write's data has all been sent) its id reports
    // CANCELLED and it lets go of its regions (detach_cancelled: user_id 0 from then on), while
    // what is left of it on the wire drains.
    bool cancelled = false;
    // Cancelled and reported, its id gone, but waiting for its peer's answer: counted in
    // Impl::detached_ (against MAX_TRANSFERS) until destroyed.
    bool detached() const { return cancelled && user_id == 0; }
    HeldNotificationRoom endpoint_notification_room;
    // A served request's pieces, counted in its peer's served_pieces until it is destroyed,
    // and its weight in the endpoint's served_weight_ (its pieces and kServedRecordWeight).
    uint64_t served_pieces = 0;
    uint64_t served_weight = 0;
    // Two-sided. A receive no send has met yet waits in its peer's posted_recvs at
    // posted_seq (with its tag).
    uint64_t tag = 0;
    uint64_t len = 0;
    uint64_t posted_seq = 0;
};

// How a chunk's bytes move, decided when it is queued from its memory and the channel.
enum class OpPath : uint8_t {
    kHost,    // host memory (or scratch), straight through the transport
    kDevice,  // GPU memory the transport takes itself (a send, or a receive without UNPACK)
    kStaged,  // GPU memory through the channel's pinned staging slots (host-only transports)
    kUnpack,  // a receive into GPU memory on an UNPACK comm: gathered by the unpack kernel
    // A chunk of several pieces (packer.h), through a staging slot of the channel: gathered
    // there by its sender, scattered from there by its receiver.
    // all in host memory: as a segment list where the transport takes one (scatter-gather I/O),
    // else through the channel's host slots, copied by the CPU
    kGather,
    kStagedGather,  // some in GPU memory: the channel's pinned gather ring (GPU copies, kernels)
    // all in GPU memory, to a transport that takes GPU memory: gathered into (scattered from) the
    // gather ring's GPU twin by one kernel, sent from (received into) there; over UNPACK comms
    // the unpack kernel lands the chunk in the twin first
    kDeviceGather,
};

// One chunk request: queued on a channel, in flight there, or (receives) finishing.
struct Op {
    Xfer* xfer;
    // The registration it reads or writes (its first piece's); null for a scratch receive (a
    // refused write being drained).
    Region* region;
    uint8_t* ptr;  // one piece: where its bytes are; null for several pieces and for scratch
    uint64_t len;
    OpPath path = OpPath::kHost;
    int slot = -1;  // the slot it holds (staging buffer, or unpack completion)
    // The transfer's pieces it covers, [first, end) of xfer->pieces (kGather, kStagedGather).
    uint32_t first = 0;
    uint32_t end = 0;
    // STAGE_TIMES (steady clock, ns; 0: not reached or not timed): cut into the channel's queue,
    // staging copy seen finished (tx), posted to the transport, the transport done (rx).
    uint64_t queued_ns = 0;
    uint64_t ready_ns = 0;
    uint64_t posted_ns = 0;
    uint64_t done_ns = 0;
};

// STAGE_TIMES' clock (Op's *_ns).
inline uint64_t stage_clock_ns() {
    return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                     std::chrono::steady_clock::now().time_since_epoch())
                                     .count());
}

// STAGE_TIMES: a channel's finished chunks and their time in each stage, summed (ns). tx:
// staging = queued until its staging copy was seen done (or 0), waiting = until posted,
// transport = until the send was done. rx: waiting = queued until posted (window, slots),
// transport = until the receive was done (the sender's time included), finishing = until its
// copy or unpack was done and it was handed back.
struct StageTimes {
    uint64_t chunks = 0;
    uint64_t staging = 0;
    uint64_t waiting = 0;
    uint64_t transport = 0;
    uint64_t finishing = 0;

    StageTimes& operator+=(const StageTimes& o) {
        chunks += o.chunks;
        staging += o.staging;
        waiting += o.waiting;
        transport += o.transport;
        finishing += o.finishing;
        return *this;
    }
};

// Staging buffers take up to this many chunks per chunk of their size (slot_fifo.h): chunks
// smaller than the agreed size hold only their bytes.
inline constexpr int kStagingRecordsPerSlot = 4;

// Host staging slots of one channel and direction, for chunks of several host pieces: `slots`
// chunks of `bytes`, or more smaller ones.
struct HostSlots : SlotFifo {
    HostSlots(size_t bytes, int slots)
        : SlotFifo(slots * kStagingRecordsPerSlot, bytes * static_cast<size_t>(slots)),
          mem(new uint8_t[bytes * static_cast<size_t>(slots)]) {}
    uint8_t* slot(int i) const { return mem.get() + offset(i); }
    uint8_t* next_slot(uint64_t len) const { return mem.get() + next_offset(len); }
    size_t bytes() const { return arena(); }
    std::unique_ptr<uint8_t[]> mem;
};

// A data channel: one transport comm and the requests on it. Sends and receives move through the
// same stages in order (FIFO, which the transports require):
//   queued --(tx staged: D2H copy into a slot, ahead)--> in flight (posted to the transport)
//   --(rx: H2D copy out of the slot / unpack kernel)--> finishing --> done (irecv_consumed)
// GPU work is tracked by the slot's event in the channel's copy ring, polled, never waited for.
struct Channel {
    net::SendComm* send = nullptr;  // tx channels
    net::RecvComm* recv = nullptr;  // rx channels
    std::deque<Op> queued;
    // tx: how many queued ops, from the front, have their staging copy enqueued (or need none).
    size_t staged_ahead = 0;
    struct Mr;
    struct InFlight {
        Op op;
        net::Request* req;
        const Mr* reg = nullptr;  // the registration of `mrs` it was posted with, if any
        // rx: its copy or unpack was enqueued (start_finishing returned). One on the finishing
        // list without it was cut short by an exception, and its bytes never moved.
        bool started = false;
    };
    std::deque<InFlight> inflight;
    // rx: received, waiting for their GPU work, then for irecv_consumed(); oldest first. Counts
    // against the window: the transport holds a request until it is consumed.
    std::deque<InFlight> finishing;
    StageTimes stages;                   // STAGE_TIMES
    bool scratch_busy = false;           // one scratch receive at a time per channel
    std::unique_ptr<uint8_t[]> scratch;  // chunk bytes, made when a drain needs them, freed after
    uint64_t scratch_len = 0;            // (counted in scratch_bytes_)
    // The transport's registrations of our regions with this channel's comm (ncclNet registers
    // memory per comm; Google's TCPX needs one for every buffer it moves), made on first use: by
    // region, then by window (reg_windows.h) where a region exceeds what one registration holds.
    // GPU registrations of a transport whose each holds a descriptor (gpu_regs_counted) count
    // against the process's budget of them: those no request uses are given up, least recently
    // used first, to make room (give_up_idle_registrations).
    struct Mr {
        net::MemHandle* mh = nullptr;
        uint64_t used = 0;     // Impl::mr_uses_ when it was last asked for
        bool counted = false;  // a GPU registration, counted (gpu_regs_counted)
    };
    std::unordered_map<Region*, std::map<size_t, Mr>> mrs;
    net::MemHandle* scratch_mr = nullptr;
    bool scratch_registered = false;  // (a transport may hand out a null handle)
    // Made on the first GPU op: staging slots (kStaged) or unpack completions (kUnpack).
    std::unique_ptr<cuda::CopyRing> ring;
    net::MemHandle* ring_mr = nullptr;  // the staging slots' registration with the comm
    // Made on the first chunk of several pieces: host slots (kGather), a pinned ring with
    // GPU gathers (kStagedGather); each registered with the comm as host memory.
    std::unique_ptr<HostSlots> hslots;
    net::MemHandle* hslots_mr = nullptr;
    std::unique_ptr<cuda::CopyRing> gring;
    net::MemHandle* gring_mr = nullptr;
    uint8_t* gtwin = nullptr;            // the gather ring's GPU twin (kDeviceGather)
    net::MemHandle* gtwin_mr = nullptr;  // its registration with the comm, as GPU memory
    // rx: the device handle accept() gave, and for UNPACK comms the plugin's unpack queue (device
    // addresses), read on first use.
    net::DeviceHandle dev_handle;
    cuda::UnpackHandle unpack{};
    // The queue's host address (where receives' descriptions are read), learned from the first
    // receive's and checked against unpack.meta; 0 until then.
    uintptr_t unpack_meta_host = 0;
    // How much of the bounce buffer is there to read, from its start: what the GPU has mapped
    // there, or (host memory, which only an emulation hands over) all a 32-bit offset reaches.
    uint64_t bounce_len = 0;

    // When a request on this channel last completed or was posted: a channel with requests in
    // flight that makes no progress for the peer timeout fails its peer (a lost chunk would
    // otherwise leave its transfer waiting forever while heartbeats keep the peer alive).
    Clock::time_point last_progress{};
    // Since when the transport has taken no request of this channel with none of ours in it
    // (the epoch when it took one): past the peer timeout the peer fails (step_peer).
    Clock::time_point refused_since{};
    // Since when chunks have waited with the window full (the epoch when they are not).
    Clock::time_point blocked_since{};

    // Staging it holds, by part, counted in Impl::staging_bytes_ (MAX_STAGING_BYTES_TOTAL): the
    // staging ring, the gather ring (with its GPU twin once that is counted), the host slots.
    struct Held {
        uint64_t ring = 0;
        uint64_t gather = 0;
        uint64_t host = 0;
        uint64_t total() const { return ring + gather + host; }
    } held;
    // Since when its next chunk has waited for a place for its registration with none of this
    // endpoint's in use (mr_for); the epoch when it does not.
    Clock::time_point reg_wait_since{};
    bool staging_wait = false;               // its next chunk waits for room in the staging total
    Clock::time_point staging_wait_since{};  // since when (while staging_wait)
    Clock::time_point held_since{};          // when it last took staging

    // Whether anything waits for this channel's progress.
    bool busy() const { return !queued.empty() || !inflight.empty() || !finishing.empty(); }
};

// The parts of a channel's staging, each made on first need and freed together.
enum class StagingPart { kRing, kGather, kHost };

// A transfer whose chunk requests are not all made yet: chunks are cut from its pieces
// (packer.h) as the channels' windows take them, so memory per transfer grows with the window,
// not its length.
struct Extent {
    Xfer* xfer;
    packer::Cursor at;  // where the next chunk starts
};

// What a served request's own record weighs against MAX_SERVED_PIECES_TOTAL, in pieces of 24
// bytes, beside its pieces: its Xfer is a few hundred bytes.
inline constexpr uint64_t kServedRecordWeight = 16;

// Requests posted to one peer while its connection is being made (connect_async), at most.
inline constexpr size_t kMaxDeferred = 65536;

// Inline bytes in replies to one peer queued and not yet taken by its control socket, at most:
// past it, a read we would answer inline is served through the data channels instead, which read
// the region as they send and hold no copy. So a peer with thousands of small reads in flight is
// answered whole, however many arrive in one pass (their inline replies would be 8 KiB each).
inline constexpr uint64_t kInlineReplyBudget = 8 << 20;

// Replies to a peer's requests queued and not yet taken by its control socket, at most
// (Impl::max_queued_replies_): a peer past it asks faster than it reads the answers, and is
// disconnected. One that reads them stays under it whatever it has in flight: the inline budget,
// plus the replies without data (30-60 bytes each) of as many requests as MAX_TRANSFERS, at
// kReplyRoom bytes each and no less than 8 MiB (16 MiB in all at the default MAX_TRANSFERS).
inline constexpr uint64_t kReplyRoom = 128;
inline constexpr uint64_t kMinReplyRoomTotal = 8 << 20;
// How long the listener rests after an accept that failed (out of descriptors or memory): the
// connection waits in the kernel's queue meanwhile.
inline constexpr std::chrono::milliseconds kListenPause{100};
// While chunks wait for staging (MAX_STAGING_BYTES_TOTAL), a channel that has held its staging
// this long, with the longest waiting chunk waiting as long, takes no new chunks onto it: what it
// has in flight finishes, and the staging goes to the waiting ones (a time slice, not a chunk:
// making staging costs an allocation and a registration).
inline constexpr std::chrono::milliseconds kStagingQuantum{20};

// A peer's life (engine_handshake.cc drives all but the last two):
//   outbound: kConnecting -> [kAuthChallenge] -> kHello -> kChannels -> kReady
//   inbound:  [kAuthInit -> kAuthProof] ->        kHello -> kChannels -> kReady
// (bracketed: with a shared secret), and from any of them kFailed. Before kReady a peer may send
// nothing but the handshake's messages, each at most kHandshakeMessage bytes.
struct Peer {
    enum class State {
        kConnecting,     // TCP connect in progress
        kAuthInit,       // inbound: waiting for the connector's AUTH_INIT
        kAuthChallenge,  // outbound: AUTH_INIT sent, waiting for AUTH_CHALLENGE
        kAuthProof,      // inbound: AUTH_CHALLENGE sent, waiting for AUTH_PROOF
        kHello,          // waiting for the peer's HELLO
        kChannels,       // data channels connecting
        kReady,
        kFailed,
    };
    PeerId id = 0;
    std::string name;  // the peer's own name, from its HELLO (until then, its address)
    Status no_room;    // its last data-channel connect that found no room in the socket budget
    // Set by another peer's wait for staging this one holds and moves nothing with (a stalled
    // channel, under contention): failed with it at its next step.
    Status evict;
    std::string expected_name;    // outbound: the name its metadata gave
    uint64_t expected_nonce = 0;  // outbound: the endpoint's nonce its metadata gave (0: none)
    bool outbound = false;
    State state = State::kConnecting;
    bool authenticated = false;    // proved the shared secret
    std::string nonce_c, nonce_l;  // the authentication's nonces
    auth::Bytes session_key{};     // authenticated: the connection's (its HELLOs' MACs)
    Clock::time_point deadline;    // the handshake's
    CtrlConn ctrl;
    SocketAddress address;
    Clock::time_point started, last_recv, last_send;
    Clock::time_point channels_since;  // when it began setting up its data channels
    int channels = 0;
    std::vector<net::ListenComm*> listens;  // ours, until our receive channels are accepted
    std::vector<net::Handle> listen_handles;
    std::vector<net::Handle> remote_handles;  // where to connect our send channels
    std::vector<Channel> tx, rx;
    bool ready_sent = false;
    bool ready_received = false;
    bool said_bye = false;  // our BYE is queued: nothing more goes out
    // fail_peer's teardown: not begun (or cut short by an exception: to be finished), under
    // way, waiting for the transport's requests in flight (see fail_peer), finished.
    enum class Teardown { kNone, kRunning, kDraining, kDone } teardown = Teardown::kNone;
    Clock::time_point drain_until{};  // kDraining: when the requests still in flight are dropped
    std::optional<std::string> bye;   // the BYE's reason, said when the teardown finishes
    uint64_t chunk = 0;               // bytes per chunk, agreed in HELLO
    uint64_t tx_seq = 0;              // chunks assigned to our send channels so far
    uint64_t rx_seq = 0;              // chunks assigned to our receive channels so far
    std::unordered_map<uint64_t, Xfer*> awaiting;  // our transfers waiting for a reply, by wire id
    // Of `awaiting`, those the peer owes a prompt answer (all but sends waiting for the receive
    // to be posted, which may wait as long as the peer's application likes), and when the peer
    // last answered one of ours or moved data (see step_peer's answer deadline).
    uint64_t answers_owed = 0;
    Clock::time_point last_answer{};
    Clock::time_point last_tick{};  // our last liveness check of the peer
    // Chunks moved on our channels with the peer (each completion), the count our last PING
    // told it and when; the count its last PING told us.
    uint64_t moved = 0;
    uint64_t moved_reported = 0;
    Clock::time_point reported_at{};
    uint64_t peer_moved = 0;
    std::unordered_set<Xfer*> xfers;       // every transfer with this peer
    engine::TagQueue<Xfer*> posted_recvs;  // receives not yet matched
    struct Rts {
        uint64_t send_xfer;
        uint64_t tag;
        uint64_t len;
    };
    engine::TagQueue<Rts> unexpected;  // the peer's sends not yet matched
    // Extents not yet cut into chunk requests, per direction, in the order they were queued.
    std::deque<Extent> tx_pending, rx_pending;
    // Notifications from this peer that our application has not taken yet (those held for its
    // reads and writes in flight included).
    uint64_t notif_count = 0;
    uint64_t notif_returned_in = 0;  // the get_notifications() call that last returned one
    uint64_t notif_bytes = 0;
    // The notifications of this peer's reads we served, held (in notif_count and notif_bytes,
    // and in the endpoint's held tally) until its READ_DONE says the data reached it; keyed by
    // its transfer id. As many as MAX_QUEUED_NOTIFICATIONS at most, with the queue.
    struct HeldReadNotification {
        std::string payload;
        HeldNotificationRoom room;
        Clock::time_point gone{};  // when the read's data left us (zero: not yet)
    };
    std::unordered_map<uint64_t, HeldReadNotification> read_notifs;
    // Of those, the reads whose data has left us, oldest first (gone, id): each READ_DONE is due
    // within twice PEER_TIMEOUT_MS of it, counted from read_done_clock when that is later (while
    // the peer is not read, or we were away, its READ_DONE may wait unread). The answer deadline
    // below does not bound it: a peer answering other requests, or whose heartbeats claim chunks
    // moved, would hold the notification's room for ever.
    std::set<std::pair<Clock::time_point, uint64_t>> read_done_due;
    Clock::time_point read_done_clock{};
    // Reading this peer's control connection has stopped: a notification it sent on its own
    // (NOTIF, `paused_note` bytes) found no room in what we hold for the application, and
    // waits there, unread, with everything behind it (TCP holds the rest back at the sender)
    // until the application takes notifications, for PEER_TIMEOUT_MS at most (then the peer is
    // failed, as it was at once before).
    bool ctrl_paused = false;
    // Paused for another reason: the message in front of its control connection is larger
    // than the connection's own buffer and found no room in what all peers share for such
    // messages (MAX_CTRL_BUFFER_TOTAL, CtrlConn::starved), for PEER_TIMEOUT_MS at most.
    bool paused_for_room = false;
    // Paused, and its socket reported an error or a hangup: out of the epoll set (it would be
    // reported on every pass); the whole messages already read are still handled as room
    // comes, and the connection fails once they are.
    bool ctrl_broken = false;
    // Messages already read wait to be handled: its last read_control() stopped after as many
    // copies between GPU memory and our buffers as one call may make (kSyncCopiesPerRead,
    // each a synchronous copy under the engine's lock), and the next pass goes on with them
    // (its socket may have nothing new to say so).
    bool ctrl_backlog = false;
    // A ready peer's control socket is watched for room to write (EPOLLOUT) once what we queued
    // for it has waited for the socket kWatchOutputAfter (a peer that reads slowly, or stopped
    // reading us while our notes wait for room at its end): the progress thread sleeps until
    // then instead of polling. Shorter waits stay polled, with no epoll_ctl on the busy path.
    bool watch_out = false;
    Clock::time_point out_blocked_since{};  // zero: nothing waits for the socket
    uint64_t paused_note = 0;
    Clock::time_point paused_since{};
    // What this peer, paused, will need of the endpoint-wide room before it can go on: its
    // note, and the room held for its reads (which only READ_DONEs behind the note free).
    NotificationTally paused_need;
    // Pieces of this peer's requests being served (MAX_SERVED_PIECES at most).
    uint64_t served_pieces = 0;
    // This peer's requests being served (MAX_TRANSFERS at most): of `xfers`, the kServe ones.
    uint64_t served = 0;
    // Posts made while the connection was still being made (connect_async), issued in order the
    // moment it is ready; their transfers are already in `xfers` (so failing the peer fails
    // them). At most kMaxDeferred.
    std::deque<std::function<void()>> deferred;
    uint64_t deferred_notif_bytes = 0;  // of notify()'s among them
    uint64_t failed_seq = 0;            // when it failed, in the endpoint's count of failures
    Status error;                       // why it failed
    Stats stats;                        // its counters (Impl::count adds to the endpoint's too)
    bool known_to_user = false;         // returned by connect() or accept()
    bool in_accept_queue = false;
};

}  // namespace tcpx::engine

namespace tcpx {

class Endpoint::Impl {
 public:
    static StatusOr<std::unique_ptr<Impl>> create(const Config& config, std::string name);
    ~Impl();

    const std::string& name() const { return name_; }
    std::string metadata() const;

    StatusOr<PeerId> connect(std::string_view metadata);
    StatusOr<PeerId> connect_async(std::string_view metadata);
    StatusOr<PeerId> accept(std::chrono::milliseconds timeout);
    Status disconnect(PeerId peer);
    StatusOr<std::string> peer_name(PeerId peer);
    Status peer_matches(PeerId peer, std::string_view metadata);
    Status peer_status(PeerId peer);
    Stats stats();
    StatusOr<Stats> peer_stats(PeerId peer);

    StatusOr<MemId> reg(void* ptr, size_t len);
    Status dereg(MemId mem);
    StatusOr<RemoteMem> describe(MemId mem);

    StatusOr<XferId> write(PeerId peer, std::span<const IoVec> iov,
                           std::optional<std::string_view> notification);
    StatusOr<XferId> read(PeerId peer, std::span<const IoVec> iov,
                          std::optional<std::string_view> notification);
    Status copy(std::span<const LocalCopy> pieces);
    Status notify(PeerId peer, std::string_view payload);
    std::vector<Notification> get_notifications(size_t max);
    StatusOr<XferId> send(PeerId peer, MemId mem, uint64_t offset, uint64_t len, uint64_t tag);
    StatusOr<XferId> recv(PeerId peer, MemId mem, uint64_t offset, uint64_t len, uint64_t tag);

    XferStatus poll(XferId xfer);
    Status wait(XferId xfer, std::chrono::milliseconds timeout);
    Status cancel(XferId xfer);

 private:
    using Clock = engine::Clock;
    using Peer = engine::Peer;
    using Xfer = engine::Xfer;
    using Channel = engine::Channel;

    Impl() = default;
    Status init(const Config& config, std::string name);

    // The engine lock for an API call. The progress thread, which takes the lock over and over,
    // yields it to callers that announce themselves here (std::mutex is not fair).
    std::unique_lock<std::mutex> api_lock() {
        api_waiting_.fetch_add(1);
        std::unique_lock<std::mutex> lock(mu_);
        api_waiting_.fetch_sub(1);
        return lock;
    }

    // --- progress (all under mu_) ---
    // `sleeper`: called by the progress thread, the only one that drains its wakeups (wake() and
    // the transport's completion wakeup): another thread draining one could take a wakeup meant
    // for the sleeping progress thread, and leave it asleep with work to do.
    bool progress_once(bool sleeper = false);  // progress_pass, letting no exception out
    bool progress_pass(bool sleeper);
    // An API call's progress (poll, wait, get_notifications): passes while they move something,
    // a few at most. One pass often only starts what the next finishes (a READ_RESP posts the
    // receive whose data is already in the socket; a WRITE_REQ the receives of the chunks behind
    // it), and the caller may not call again for a while. With a progress thread, it notes the
    // time (the thread stands back while calls keep doing this, run_progress_thread) and wakes
    // the thread when it started something: transport requests whose completion wakeup the
    // thread has not armed. Requires mu_.
    void api_progress();
    // `ready`: its control socket has something for us; `tick`: time to check its timers. An
    // exception while serving the peer (out of memory) fails the peer instead of leaving.
    bool progress_peer(Peer& p, bool ready, bool tick);
    bool step_peer(Peer& p, bool ready, bool tick);
    // Whether a peer needs attention on every pass (not only when its socket or a timer says so).
    bool needs_polling(const Peer& p) const;
    // Whether all a peer that needs polling waits for is transport requests finishing (host
    // chunks in flight, and chunks queued behind them for room): a transport that signals
    // completions (Net::completion_wakeup) then wakes the progress thread, which can sleep.
    bool waits_on_transport_only(const Peer& p) const;
    // Both sides' channels are up: the peer takes requests from now on.
    void become_ready(Peer& p);
    bool progress_channel(Peer& p, Channel& ch, bool tx);
    // STAGE_TIMES: a chunk finished at `end_ns` (its send done; its receive handed back), and
    // the peer's averages in the log when it goes.
    void time_stages(Channel& ch, const engine::Op& op, bool tx, uint64_t end_ns);
    void log_stage_times(const Peer& p) const;
    bool read_control(Peer& p);
    // Whether p has more replies queued than it may: its own bound, or (all peers' together
    // past MAX_QUEUED_REPLIES_TOTAL) its share.
    bool replies_past_bound(const Peer& p) const;
    // The epoll interest of a ready peer's control socket: input unless `paused`, output if
    // `out` (which watch_out records). False: epoll_ctl failed (errno), nothing changed.
    bool set_interest(Peer& p, bool paused, bool out);
    // After a flush: starts or stops watching the socket for room (Peer::watch_out).
    void watch_output(Peer& p, Clock::time_point now);
    // Stops reading p's control connection (Peer::ctrl_paused) while its NOTIF of `note`
    // bytes waits for room, or (pause_for_ctrl_room) while its next message waits for buffer
    // room; resume_control starts again (false: the peer failed). Paused peers are served
    // again by their ticks, and by get_notifications (resume_paused_peers).
    Status pause_control(Peer& p, uint64_t note);
    Status pause_for_ctrl_room(Peer& p);
    // Whether what a paused peer waits for is there.
    bool pause_can_end(const Peer& p) const;
    bool resume_control(Peer& p);
    void unpause(Peer& p) noexcept;  // the bookkeeping of both of the above
    void resume_paused_peers();
    // A paused peer's turn: resumes it when there is room, fails it when its wait is over or
    // its socket broke. False: it stays paused.
    bool step_paused(Peer& p, bool ready, bool tick, Clock::time_point now);
    Status dispatch(Peer& p, const engine::wire::Header& h, std::string_view body);
    void accept_inbound();
    // Takes the listener out of the epoll set for kListenPause (listen_paused_until_), and puts
    // it back once that has passed.
    void pause_listener();
    void resume_listener_when_due(Clock::time_point now);
    // Closes the oldest inbound handshake of a peer that has not authenticated; false when none.
    // `limit` names the bound reached (the log line and the closed peer's error say it);
    // `except` (the peer the room is for) is never the one closed; `before_hello` only closes
    // connections that have not sent their HELLO (those setting up channels have spoken the
    // protocol: without a secret, as much as any peer proves).
    bool evict_stalest_handshake(const char* limit, const Peer* except = nullptr,
                                 bool before_hello = false);
    // At the socket budget (MAX_SOCKETS): the oldest connection that has not sent its HELLO
    // makes way (for a newcomer, or for `except`'s sockets), if it has had kSocketBudgetMinAge
    // to send it.
    bool evict_for_sockets(const Peer* except = nullptr) {
        return evict_stalest_handshake("MAX_SOCKETS", except, /*before_hello=*/true);
    }
    // Places of the socket budget the endpoint's listener leaves free for newcomers: what one
    // peer's data channels take (a comm of NSOCKS + 1 sockets per channel and direction, and a
    // listener per channel while they connect).
    uint64_t channel_sockets() const {
        return static_cast<uint64_t>(config_.channels) *
               (2 * (static_cast<uint64_t>(config_.nsocks) + 1) + 1);
    }
    // Connections that have not sent their HELLO (or proved the secret) yet.
    static bool before_hello(const Peer& p) {
        return p.state == Peer::State::kAuthInit || p.state == Peer::State::kAuthProof ||
               p.state == Peer::State::kHello;
    }
    void run_progress_thread();
    // Logs the exception being handled that a progress pass let out (never throws).
    void report_progress_exception() noexcept;
    void wake();
    // Makes progress from the calling thread until `done()` (called under mu_) or `deadline`;
    // takes the lock itself. True when done() became true. `learn`: whether the wait teaches
    // the spin heuristics (wait_spin_) how long waits are (a teardown's is not a reply's).
    bool drive(const std::function<bool()>& done, Clock::time_point deadline, bool learn = true);
    // The teardowns of `ids` (failed peers) finished: their graces waited for without the lock
    // (`lock` released meanwhile, held again on return), what is left settled under it. Peers
    // gone meanwhile are skipped.
    void settle_peers(std::unique_lock<std::mutex>& lock, const std::vector<PeerId>& ids);
    void reap_peers();
    // Before a peer leaves peers_: records who it was in gone_ while its notifications are
    // queued or were returned by the last get_notifications() (peer_matches() answers for them).
    void remember_gone(const Peer& p);
    // Whether GPU work of `p`'s rings is still queued or running (asked without waiting).
    bool gpu_work_left(Peer& p);
    // Whether `p` has failed and let go of its connection: a record of its error, no more.
    static bool gone(const Peer& p) {
        return p.state == Peer::State::kFailed && p.teardown == Peer::Teardown::kDone;
    }
    // Peers that hold a connection, or are making one: what MAX_PEERS bounds.
    size_t live_peers() const;

    // --- peers ---
    StatusOr<Peer*> ready_peer(PeerId id);
    // A peer requests may be posted to: ready, or still being made by connect_async() (the
    // post is then deferred, see Peer::deferred). Its error once failed.
    StatusOr<Peer*> postable_peer(PeerId id);
    // RESOURCE_EXHAUSTED when `p` is still connecting and kMaxDeferred posts wait for it
    // (checked before a post creates anything).
    Status check_deferrable(const Peer& p) const;
    // Issues `issue` now if `p` is ready, else keeps it for when it is (api lock held).
    void issue_or_defer(Peer& p, std::function<void()> issue);
    // Queues a message (and its inline data, after it: CtrlConn::queue).
    void send_ctrl(Peer& p, std::string msg, std::string tail = {});
    // The same for a reply to the peer's request (bounded by max_queued_replies_: read_control).
    void send_reply(Peer& p, std::string msg, std::string tail = {});
    // Fails `p` with `why` and tears it down: its channels' requests end, its transfers fail,
    // its connection closes. Over a transport whose close does not release what its requests
    // hold (ncclNet plugins), requests still in flight first get a grace (kDraining) that later
    // passes finish (drain_peer), so that one failing peer holds up no other.
    void fail_peer(Peer& p, Status why);
    // kDraining: finishes the teardown once the requests have ended or their grace is over;
    // `now_or_never` waits for that here (the caller is about to forget the peer).
    void drain_peer(Peer& p, bool now_or_never);
    // Whatever teardown `p` has left, done before it is erased (a failed peer only).
    void settle_peer(Peer& p);
    // Last resort where a teardown could not finish (no memory): the comms closed, so that the
    // transport touches none of the peer's buffers once it is freed. Never throws.
    void close_comms(Peer& p) noexcept;
    // The end of a teardown: comms closed, transfers failed, the control connection closed.
    void finish_teardown(Peer& p);
    // From a catch block: fails `p` with the exception being handled (out of memory), `where`
    // saying what was under way. Never throws (a failure cut short is finished by a later pass).
    void fail_peer_for_exception(Peer& p, const char* where) noexcept;
    // Runs what a post does once its transfer exists and the caller has its id. An exception
    // there (out of memory) would leave the transfer half issued (a request sent, its reply
    // unexpected), so it fails the peer instead, with the transfer: the post still returns the
    // id, and its wait() reports the error.
    template <typename F>
    void guard_post(Peer& p, F&& post) {
        try {
            post();
        } catch (...) {
            fail_peer_for_exception(p, "posting a transfer");
        }
    }
    // Queues BYE (with `reason`, when an error ends the connection) and sends what it can now.
    void say_bye(Peer& p, std::string_view reason);
    // Adds a peer on a control socket and watches it (for writability too while connecting).
    StatusOr<Peer*> add_peer(Fd fd, bool outbound, const SocketAddress& address);
    Status watch(const Peer& p, bool writable);

    // --- the handshake (engine_handshake.cc) ---
    static bool in_handshake(const Peer& p) {
        return p.state != Peer::State::kReady && p.state != Peer::State::kFailed;
    }
    // Connect done (outbound): the first message goes out.
    Status start_handshake(Peer& p);
    bool progress_handshake(Peer& p);
    Status dispatch_handshake(Peer& p, engine::wire::MsgType type, std::string_view body);
    Status on_auth_init(Peer& p, std::string_view body);
    Status on_auth_challenge(Peer& p, std::string_view body);
    Status on_auth_proof(Peer& p, std::string_view body);
    Status on_auth_fail(Peer& p, std::string_view body);
    Status send_hello(Peer& p);
    // Our HELLO to `p`, with its MAC where `p` is authenticated.
    std::string encode_hello(const Peer& p, engine::wire::Hello hello) const;
    // The endpoint's GPU made current for the caller's scope (where it has a usable one), for
    // transports that allocate on or record the current GPU; the caller's own is put back after.
    void serve_gpu(std::optional<cuda::ScopedGpu>* gpu) const;
    Status start_channels(Peer& p, int channels);
    Status handle_hello(Peer& p, std::string_view body);
    // The peer's handles are checked by the transport before any is used.
    Status check_handles(Peer& p, std::vector<net::Handle>* handles);
    // Refuses the peer: tells it why (best effort), fails it.
    void refuse(Peer& p, Status why);

    // --- transfers ---
    StatusOr<std::vector<engine::Region*>> resolve_pieces(const char* op,
                                                          std::span<const IoVec> iov);
    StatusOr<Xfer*> new_xfer(Xfer::Kind kind, Peer& p, bool user_visible);
    // What a write, read or notify is refused before anything else: a notification larger than
    // the peer accepts (it would fail the connection), a request that would not fit one control
    // message. Errors start with `op`.
    Status check_notification_to_send(const char* op, size_t size) const;
    Status check_request_fits(const char* op, size_t pieces,
                              std::optional<std::string_view> notification) const;
    // Whether a one-sided transfer touches GPU memory on either side (remote: by its descriptor).
    static bool touches_gpu(std::span<const IoVec> iov,
                            const std::vector<engine::Region*>& regions);
    // Whether every region is host memory (a READ's inline-alone rule, each side its own).
    static bool all_host(const std::vector<engine::Region*>& regions) {
        return gpu_pieces(regions) == 0;
    }
    // How many of the regions are GPU memory (wire::kMaxInlineGpuPieces).
    static size_t gpu_pieces(const std::vector<engine::Region*>& regions) {
        return static_cast<size_t>(
            std::count_if(regions.begin(), regions.end(),
                          [](const engine::Region* r) { return r->kind == MemKind::kCuda; }));
    }
    void hold(Xfer* x, engine::Region* r, uint64_t offset, uint64_t len);
    // Holds every piece of a WRITE or READ for `x` (regions[i] is iov[i]'s local region); the
    // pieces' remote side, for the request.
    std::vector<engine::wire::Segment> hold_pieces(Xfer* x, std::span<const IoVec> iov,
                                                   const std::vector<engine::Region*>& regions);
    // Queues x's pieces, cut into chunk requests on p's channels (packer.h); pieces with no
    // region drain into scratch.
    void queue_chunks(Peer& p, bool tx, Xfer* x);
    // Cuts pending extents into chunk requests while the direction's channels have room.
    void refill(Peer& p, bool tx);
    engine::Op make_op(const Channel& ch, bool tx, Xfer* x, const engine::packer::Cut& cut) const;
    engine::OpPath path_for(const Channel& ch, bool tx, const engine::Region* region) const;
    // The pieces of a chunk of several (seg_buf_ holds them until the next call).
    std::span<const cuda::Seg> segments(const engine::Op& op);
    // The same as a transport's segment list (ioseg_buf_ holds it until the next call).
    std::span<const net::IoSeg> io_segments(const engine::Op& op);
    // A chunk of several host pieces: gathered into, or scattered from, a host slot.
    void copy_host_segments(const engine::Op& op, uint8_t* slot, bool gather);
    // The channel's host slots or gather ring, made (and registered) on first need. The
    // ensure_* of staging say false, with nothing made, while the staging total has no room for
    // it (take_staging): the chunk waits.
    StatusOr<bool> ensure_host_slots(Peer& p, Channel& ch, bool tx);
    StatusOr<bool> ensure_gather_ring(Peer& p, Channel& ch, bool tx, const engine::Op& op);
    // The gather ring with its GPU twin registered (kDeviceGather), and for receives on an
    // UNPACK comm the plugin's unpack queue read.
    StatusOr<bool> ensure_gather_twin(Peer& p, Channel& ch, bool tx, const engine::Op& op);
    // (ensure_gather_ring's check of the path; the GPU a gather ring for `op` is made on; the
    // channel's gather ring registered with its comm)
    Status check_gather_path(const engine::Op& op) const;
    int gather_device(const engine::Op& op) const;
    Status register_gather_ring(Channel& ch, bool tx);
    // The staging an op's path uses (made already): its GPU ring, its slots (host or ring), and
    // whether the work on the slot the op holds is done.
    cuda::CopyRing& ring_for(Channel& ch, const engine::Op& op);
    SlotFifo& slots_for(Channel& ch, const engine::Op& op);
    StatusOr<bool> slot_ready(Channel& ch, const engine::Op& op);
    // The registration a direct op is posted with, made on first use; `later`: none can be
    // made now (the descriptor budget is full and no registration of ours can make way), the op
    // waits.
    struct MrPick {
        net::MemHandle* mh = nullptr;
        const Channel::Mr* reg = nullptr;  // its entry in Channel::mrs (none for the scratch)
        bool later = false;                // none can be made now: the op waits
    };
    StatusOr<MrPick> mr_for(Channel& ch, bool tx, const engine::Op& op, uint64_t scratch_len);
    // Deregisters up to `want` counted registrations (Channel::Mr) no request in flight uses,
    // least recently used first; how many went. `*in_use` (if given): whether some counted
    // registration is in use (it will be free once its requests end).
    size_t give_up_idle_registrations(size_t want, bool* in_use = nullptr);
    // Room in the descriptor budget for a counted registration of ch: true when there is (an
    // idle registration of ours given up for it if need be); false when the op waits for one
    // (later passes try again); the budget's error once waiting has no end in sight. `refused`:
    // the transport refused one just now (the places went meanwhile): it waits, nothing given up.
    StatusOr<bool> room_for_registration(Channel& ch, bool refused = false);
    // The channel's copy ring for `op` (a GPU op), made on first need.
    StatusOr<bool> ensure_ring(Peer& p, Channel& ch, bool tx, const engine::Op& op);
    // A receive came in: enqueue its GPU work (copy out of staging, unpack), if any.
    Status start_finishing(Channel& ch, Channel::InFlight& f);
    // Copies between a region and host memory, whatever memory the region is.
    Status read_region(const engine::Region* r, uint64_t offset, uint64_t len, void* out);
    Status write_region(engine::Region* r, uint64_t offset, const void* src, uint64_t len);
    // Appends [offset, +len) of `r` to a control message.
    Status append_region(std::string* msg, const engine::Region* r, uint64_t offset, uint64_t len);
    // Deregisters every registration of the channel; `after_close`: its comm is closed already
    // (Properties::dereg_after_close).
    void drop_mrs(Channel& ch, bool tx, bool after_close = false);
    void forget_region(engine::Region* r);
    void op_done(const engine::Op& op);
    // Whether a cancelled transfer of ours no longer touches our memory (see Xfer::cancelled).
    bool cancel_settled(const Xfer& x) const;
    // Reports a cancelled transfer that no longer touches our memory (CANCELLED) and lets go of
    // its regions; it lives on, unseen, until what it has on the wire is done.
    void detach_cancelled(Xfer* x);
    // A cancelled read's READ_DONE (not delivered), if the target holds its notification.
    void let_read_notification_go(Xfer* x);
    void maybe_finish(Xfer* x);
    void destroy(Xfer* x);
    uint64_t inline_limit() const { return config_.xfer_inline_threshold; }
    // A WRITE's, before it is posted to `p`: more for host memory, XFER_INLINE_BUSY, and when
    // nothing else is in flight with the peer, XFER_INLINE_ALONE if larger (the data then rides
    // in the request, one message on one socket; otherwise the data channels, which spread over
    // sockets, carry it).
    uint64_t inline_limit(const Peer& p, bool gpu) const {
        if (gpu) return config_.xfer_inline_threshold;
        const uint64_t host = std::max(config_.xfer_inline_threshold, config_.xfer_inline_busy);
        return p.xfers.empty() ? std::max(host, config_.xfer_inline_alone) : host;
    }

    Status check_serving_limit(const Peer& p) const;
    // RESOURCE_EXHAUSTED when serving a request of `pieces` more would take `p` past
    // MAX_SERVED_PIECES, or all peers past MAX_SERVED_PIECES_TOTAL (served_room); else counts
    // them for `x` (destroy() gives them back).
    Status served_room(const Peer& p, uint64_t pieces) const;
    Status hold_served_pieces(Peer& p, Xfer* x, uint64_t pieces);
    // Takes `weight` of MAX_SERVED_PIECES_TOTAL (served_weight_), or says it is past it.
    Status total_served_room(uint64_t weight) const;
    Status take_served_weight(uint64_t weight);
    // A request's chunk size (wire::WriteReq::chunk): 0 (the agreed one) or at most that.
    Status check_request_chunk(const Peer& p, uint64_t chunk, const char* what) const;
    // Whether a notification of `size` bytes is one we accept at all (MAX_NOTIFICATION_SIZE).
    Status check_notification_size(uint64_t size) const;
    // Whether a notification of `size` bytes from `p` fits what we hold for the application:
    // within its peer's bound and the endpoint's.
    Status notification_room(const Peer& p, uint64_t size) const;
    // Whether `size` more bytes (one more notification) stay within the per-peer bounds, or the
    // endpoint-wide ones, with `held` already held; and what the endpoint holds now.
    bool within_peer_bound(engine::NotificationTally held, uint64_t size) const noexcept;
    bool within_endpoint_bound(engine::NotificationTally held, uint64_t size) const noexcept;
    engine::NotificationTally endpoint_held() const noexcept;
    // notification_room as a yes or no, allocating nothing (a paused peer asks on every pass).
    bool fits_notification(const Peer& p, uint64_t size) const noexcept;
    // Whether it would fit once the application has taken every notification it can: what
    // stays is the room held for p's reads, freed only by their READ_DONEs, which come on the
    // control connection behind it (a wait for those could never end).
    bool fits_once_taken(const Peer& p, uint64_t size) const noexcept;
    // The room held for p's reads whose READ_DONE has not come.
    static engine::NotificationTally read_room(const Peer& p) noexcept;
    Status on_read_done(Peer& p, std::string_view body);
    // Ends a receive taken out of its peer's posted_recvs (no send matched it) with `why`.
    void end_unmatched_recv(Xfer* x, Status why);
    static Status check_copy_overlaps(
        std::span<const LocalCopy> pieces,
        const std::vector<std::pair<engine::Region*, engine::Region*>>& held);
    // Lets every notification held for the peer's reads go (its connection is torn down).
    void drop_read_notifications(Peer& p);
    // The data of the peer's read `xfer` has left us (inline in the reply, or its last chunk
    // sent): its READ_DONE is due from now, if we hold its notification.
    void read_data_gone(Peer& p, uint64_t xfer);
    // `held`: its room was taken already (a served write's).
    void queue_notification(Peer& p, std::string payload, bool held);
    // A transfer of ours starts waiting for the peer's reply (and counts toward the answers
    // owed); take_awaiting() takes it out when the reply comes.
    void await_reply(Peer& p, Xfer* x);
    StatusOr<Xfer*> take_awaiting(Peer& p, uint64_t wire_id, Xfer::Kind kind, const char* what);
    Status on_write_req(Peer& p, uint16_t flags, std::string_view body);
    Status on_write_ack(Peer& p, std::string_view body);
    Status on_read_req(Peer& p, uint16_t flags, std::string_view body);
    Status on_read_resp(Peer& p, uint16_t flags, std::string_view body);
    Status on_send_rts(Peer& p, std::string_view body);
    Status on_recv_cts(Peer& p, std::string_view body);
    Status on_send_data(Peer& p, uint16_t flags, std::string_view body);
    void match(Peer& p, Xfer* recv, const Peer::Rts& rts);

    std::mutex mu_;
    Config config_;
    std::string name_;
    std::unique_ptr<net::Net> net_;
    net::Properties props_;
    uint64_t chunk_ = 0;  // the chunk size we offer (XFER_CHUNK_SIZE, within the transport's limit)
    int staging_slots_ = 8;
    int dev_ = 0;  // the transport's device: the GPU's NIC (net/nic_select.h), or 0
    // The devices a peer's channels are spread over (channel i on rails_[i % size]): every
    // interface of the socket transport when peers are authenticated, else just dev_.
    std::vector<int> rails_{0};
    int rail(int channel) const { return rails_[static_cast<size_t>(channel) % rails_.size()]; }
    void choose_rails();
    int window_ = 1;
    SocketAddress listen_addr_;
    Fd listen_fd_;
    // Set while the listener is out of the epoll set: an accept found no descriptor or memory
    // for a connection (EMFILE, ENFILE, ENOBUFS, ENOMEM), which stays pending and would keep the
    // listener readable, the progress thread spinning. Looked at again from then on (ticks).
    std::optional<Clock::time_point> listen_paused_until_;
    size_t paused_peers_ = 0;                // peers with ctrl_paused
    engine::NotificationTally paused_need_;  // their paused_need, summed
    PeerId last_resumed_ = 0;                // resume_paused_peers goes round from the one after it
    uint64_t nonce_ = 0;
    engine::Registry registry_;
    std::unique_ptr<engine::XferTable> xfers_;
    // Staging rings of peers torn down, freed on a thread of their own (reaper.h): freeing GPU
    // and pinned memory waits for every kernel on the device, which under the lock stalled every
    // peer and API call, and on the progress thread every peer's progress, behind the
    // application's kernels. Its destructor frees what is left, with the endpoint.
    engine::Reaper<cuda::CopyRing> reaper_;
    uint64_t failures_ = 0;  // peers failed so far (Peer::failed_seq)
    // What all peers' requests hold, counted against MAX_SERVED_PIECES_TOTAL: each served request
    // its pieces and kServedRecordWeight, each send waiting for its receive (Peer::unexpected)
    // one. Each peer's own bounds alone would multiply with MAX_PEERS.
    uint64_t served_weight_ = 0;
    // Synchronous copies between GPU memory and host memory made so far (read_region,
    // write_region: inline data of GPU memory), which read_control() bounds per call.
    uint64_t sync_copies_ = 0;
    // Staging held by all peers' channels (Channel::held), against MAX_STAGING_BYTES_TOTAL
    // with what the reaper still frees: at the defaults a peer's channels could make some 200
    // MiB of pinned and GPU memory each, MAX_PEERS times, kept until the peer went.
    uint64_t staging_bytes_ = 0;
    uint64_t staging_peak_ = 0;                  // the most staging_in_use() has been
    uint64_t passes_ = 0;                        // progress passes so far
    uint64_t staging_scan_pass_ = ~uint64_t{0};  // the last pass that looked for unused staging
    bool staging_warned_ = false;
    // When the longest waiting chunk began to wait, among those that waited in the last pass
    // (max: none did) and in this pass so far: while chunks wait, room goes to the longest
    // waiting first, and channels that have held theirs for a while take no new chunks onto it
    // (staging_yields), so that a busy peer cannot keep its staging while others wait.
    Clock::time_point oldest_wait_prev_ = Clock::time_point::max();
    Clock::time_point oldest_wait_cur_ = Clock::time_point::max();
    // Whether `ch`, holding staging, leaves it to chunks that wait (see above).
    bool staging_yields(const Channel& ch) const;
    uint64_t staging_in_use() const { return staging_bytes_ + reaper_.pending(); }
    // One staging ring's (or host slots') bytes, and a gather ring's GPU twin's.
    uint64_t staging_ring_bytes() const;
    uint64_t staging_twin_bytes() const;
    // Room for `bytes` more of `part` on `ch` within the total: taken (true) when they fit,
    // after freeing staging no request uses (other channels' first, at most one look a pass;
    // then ch's own other parts); false: the chunk waits (counted the first time).
    // For a ring part, `want` says which ring would do (its GPU; whether it needs its GPU
    // twin counted): a ring in the pool that does is handed over in want->ring (its bytes
    // counted already, and now the channel's) rather than room for a new one.
    struct RingWant {
        RingWant(int d, bool t) : device(d), twin(t) {}
        int device;
        bool twin;
        std::unique_ptr<cuda::CopyRing> ring;  // out: from the pool (null: make one)
    };
    bool take_staging(Peer& p, Channel& ch, bool tx, engine::StagingPart part, uint64_t bytes,
                      RingWant* want = nullptr);
    // Takes a pooled ring that does for `want` (true), its bytes into ch's `part`.
    bool take_pooled(Channel& ch, engine::StagingPart part, RingWant* want);
    // Gives `part` of ch's staging up when no request holds a slot of it and its GPU work is
    // done (its registration first): a ring to the pool, host slots freed. The bytes it held.
    uint64_t free_unused_staging(Channel& ch, bool tx, engine::StagingPart part);
    // Frees pooled rings (through the reaper) until `bytes` more fit, or all of them.
    void drop_pooled(uint64_t bytes = ~uint64_t{0});
    // Rings channels gave up while others waited, still made (counted in staging_bytes_): a
    // waiting channel takes one rather than make its own (making and freeing a ring of pinned
    // and GPU memory costs milliseconds, and freeing waits for the device; with a ring made
    // and freed at every hand-over, eight peers sharing half the staging they wanted moved a
    // tenth of what they did without a bound). Freed when nothing waited for a second, or when
    // room is needed for something they do not fit.
    struct PooledRing {
        std::unique_ptr<cuda::CopyRing> ring;
        uint64_t bytes = 0;  // counted: its buffer, and its twin where that was counted
    };
    std::vector<PooledRing> staging_pool_;
    Clock::time_point staging_pool_changed_{};
    // Bytes of drain scratch buffers held by all peers' channels (MAX_SCRATCH_BYTES_TOTAL).
    uint64_t scratch_bytes_ = 0;
    uint64_t mr_uses_ = 0;  // registrations asked for (mr_for), the clock of Channel::Mr::used
    // Frees `ch`'s scratch buffer (its registration first) once no drain of its needs it.
    void release_scratch(Channel& ch, bool tx);
    // The buffer itself, and its count (nothing may write it any more).
    void free_scratch(Channel& ch);
    // What the peers' control connections share for messages larger than their own buffers
    // (before peers_: their connections give it back as they go).
    engine::CtrlRoom ctrl_room_;
    // The replies queued for all peers together (MAX_QUEUED_REPLIES_TOTAL), and what a peer
    // must have left unread to be disconnected for asking past it (read_control).
    engine::CtrlRoom reply_room_;
    uint64_t reply_share_ = 0;
    std::map<PeerId, std::unique_ptr<Peer>> peers_;
    PeerId next_peer_ = 1;
    std::deque<PeerId> accept_queue_;
    // Who inbound peers reaped with notifications still queued, or returned by the last
    // get_notifications() call, were, until the application has taken those and called
    // get_notifications() once more (peer_matches() judges a notification's sender by it
    // meanwhile): at most one entry per notification queued or taken by the last call, so
    // bounded as they are.
    struct GoneIdentity {
        std::string name;
        SocketAddress address;
        bool authenticated = false;
        uint64_t notifications = 0;  // of the queue's, still to be taken
    };
    std::unordered_map<PeerId, GoneIdentity> gone_;
    uint64_t notification_calls_ = 0;  // get_notifications() calls so far (Peer::notif_returned_in)
    struct QueuedNotification {
        PeerId peer;
        Notification notification;
    };
    // The notifications waiting for the application, with their size: what the endpoint-wide
    // bound counts, whoever sent them (a peer that is gone leaves its notifications here for the
    // application, and they must still count). get_notifications() moves the payloads out from
    // the front.
    class NotificationQueue {
     public:
        void push_back(QueuedNotification q) {
            const uint64_t size = q.notification.payload.size();
            entries_.push_back(std::move(q));
            bytes_ += size;
        }
        size_t size() const { return entries_.size(); }
        uint64_t bytes() const { return bytes_; }
        QueuedNotification pop_front() noexcept {
            QueuedNotification q = std::move(entries_.front());
            entries_.pop_front();
            bytes_ -= q.notification.payload.size();
            return q;
        }

     private:
        std::deque<QueuedNotification> entries_;
        uint64_t bytes_ = 0;
    };
    NotificationQueue notifications_;
    // The room served writes in flight hold (Xfer::endpoint_notification_room): with the queue,
    // what MAX_QUEUED_NOTIFICATIONS_TOTAL / _BYTES_TOTAL bound.
    engine::NotificationTally held_notifications_;
    engine::auth::Secrets secrets_;
    std::vector<epoll_event> events_;  // room for every watched socket
    Clock::time_point next_tick_{};
    uint64_t next_wire_id_ = 1;
    uint64_t active_ops_ = 0;  // chunk requests queued or in flight, all peers
    Stats totals_;             // the endpoint's counters (every peer's, gone ones included)
    // Adds `n` to a counter of peer `p` and of the endpoint (under mu_).
    void count(Peer& p, uint64_t Stats::*field, uint64_t n = 1) {
        p.stats.*field += n;
        totals_.*field += n;
    }
    // Bytes a finished transfer moved, by its direction, and its outcome.
    void count_finished(const Xfer& x);
    std::vector<cuda::Seg> seg_buf_;
    std::vector<uint32_t> unpack_scratch_;  // check_unpacked_bytes' sort
    // A receive's description, copied out of the plugin's memory once (snapshot_unpack): what
    // is checked is what the unpack follows, whatever that memory holds meanwhile.
    std::vector<cuda::LoadMeta> unpack_copy_;
    size_t detached_ = 0;  // Xfer::detached() ones alive
    std::vector<net::IoSeg> ioseg_buf_;

    int epfd_ = -1;
    Fd wake_fd_;
    // The transport's completion wakeup, watched by the progress thread's epoll; null where the
    // transport signals none (its requests are polled) or no progress thread runs.
    Wakeup* completions_ = nullptr;
    // API calls sleeping in drive() (under mu_) until what they wait for happens, and what
    // wakes them.
    int progress_waiters_ = 0;
    std::condition_variable progress_cv_;
    // Under mu_, whichever pass or call made it happen: a transfer finishes, a peer becomes
    // ready (or joins the accept queue) or fails; and while wait_spin_ pays, after every pass of
    // the progress thread that moved something (not on a slow wire: there that is every few KiB,
    // each a wakeup of every waiter for nothing).
    void wake_waiters() {
        if (progress_waiters_ > 0) progress_cv_.notify_all();
    }
    std::thread progress_thread_;
    std::atomic<bool> stop_{false};
    std::atomic<bool> sleeping_{false};
    // When an API call in a loop last made progress itself (api_progress); the clock's epoch
    // once a caller hands progress back (hand_back_progress). While the progress thread stands
    // back for callers it says so in standing_back_, and wake_fd_ ends that early: the two pair
    // up as posted_ and sleeping_ do (each writes its own, then reads the other's).
    std::atomic<Clock::time_point> caller_progress_at_{};
    std::atomic<bool> standing_back_{false};
    Clock::time_point caller_last_pass_{};   // the last api_progress(), looping or not (under mu_)
    Clock::duration caller_progress_for_{};  // how long the thread stands back (by the cores)
    bool spin_when_quiet_ = false;  // the progress thread spins after work with nothing in flight
    // A caller that made progress is going to sleep (drive()): the progress thread takes over
    // now rather than when the caller's last pass grows old.
    void hand_back_progress();
    // The progress thread's stand-back: while a caller made progress within caller_progress_for_,
    // sleep until that grows old or the caller hands back; true if it stood back (then look at
    // everything again).
    bool stand_back_for_callers();
    // Whether drive()'s spin pays: most of the endpoint's recent waits were short.
    engine::SpinScore wait_spin_;
    std::atomic<uint64_t> posted_{0};  // bumped by wake(): work the progress thread must see
    std::atomic<int> api_waiting_{0};  // API calls waiting for mu_
    bool own_progress_thread_ = false;
    bool stage_times_ = false;  // STAGE_TIMES=on
    // The transport plugin places bytes of a devmem receive in the receive's buffer itself,
    // leaving them out of its entries (Google's does with data the NIC left in host memory): its
    // properties say so (PLUGIN_PLACES_BYTES), or it has been seen doing it. Receives are then
    // not posted to be unpacked straight into their pieces with no room of their own for such
    // bytes (send_queued's `direct`).
    bool plugin_places_bytes_ = false;
    void note_placed_bytes(uint64_t bytes);
    // A devmem receive's description (its unpack queue slot on GPU `gpu`), copied into
    // unpack_copy_ and checked there; the bytes the plugin placed in the buffer itself.
    StatusOr<uint64_t> take_receive_description(Channel& ch, const Channel::InFlight& f, int gpu);
    // Replies to one peer queued at most (kReplyRoom, above): set by init from MAX_TRANSFERS.
    uint64_t max_queued_replies_ = 0;
};

}  // namespace tcpx
