// Randomized mixed traffic between two endpoints in one process, under several engine settings:
// writes, reads and their vector forms (random pieces, unaligned, straddling chunks), tagged
// send/recv in either order, notifications on their own and on transfers, cancels at random
// moments, waits that time out and polls, from threads on both sides at once. Every transfer that
// completes has its bytes checked, and the bytes around its pieces that it must not touch; every
// notification arrives exactly once, or never for a read that was cancelled; nothing outside the
// registered regions changes. Each thread's choices come from a seed printed on failure
// (TCPX_STRESS_SEED runs with that one again).
//
// One source, three builds: tcpx_engine_stress_tests runs it on host memory under five settings;
// tcpx_engine_device_tests (TCPX_STRESS_DEVICE_SETTINGS) with GPU memory on one side or both, on
// the device emulation, over the socket net (staging) and the emulated TCPX plugin (unpack);
// tcpx_gpu_tests (TCPX_TEST_REAL_GPU) the same on real GPUs, skipping where there is none.
//
// TCPX_STRESS_SECONDS sets each setting's run time (default 1.5 s, as CI runs it); a longer run
// is the way to look for rare interleavings, e.g. under TSan:
//   TCPX_STRESS_SECONDS=120 build/tsan/tests/tcpx_engine_stress_tests
#include <dirent.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <optional>
#include <ostream>
#include <random>
#include <set>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "tests/support/engine_test_util.h"
#include "tests/support/host_device.h"
#include "tests/support/net_test_util.h"
#include "tests/support/test_buffer.h"
#if TCPX_TEST_REAL_GPU
#include "cuda/device.h"
#endif

// (Its own namespace: the device binaries build it in one unit with engine_device_test.cc.)
namespace tcpx::testing::stress {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

constexpr int kThreadsPerSide = 2;
constexpr int kThreads = 2 * kThreadsPerSide;
// Each region: a read-only area the peer reads from, then one slot per thread of either side and
// purpose. A slot is as large as the largest transfer.
constexpr uint64_t kStatic = 2 << 20;
constexpr uint64_t kSlot = 1 << 20;
enum SlotKind { kSource = 0, kReadInto = 1, kWrittenInto = 2, kSlotKinds = 3 };
constexpr uint64_t kRegion = kStatic + uint64_t{kThreads} * kSlotKinds * kSlot;
constexpr uint8_t kSentinel = 0xee;

uint64_t slot_offset(int thread, SlotKind kind) {
    return kStatic + (uint64_t(thread) * kSlotKinds + kind) * kSlot;
}

// Sockets among this process's descriptors.
int count_open_sockets() {
    int n = 0;
    DIR* dir = ::opendir("/proc/self/fd");
    if (dir == nullptr) return -1;
    while (dirent* e = ::readdir(dir)) {
        char link[64];
        const std::string path = std::string("/proc/self/fd/") + e->d_name;
        const ssize_t len = ::readlink(path.c_str(), link, sizeof(link) - 1);
        if (len > 0 && std::string_view(link, size_t(len)).starts_with("socket:")) ++n;
    }
    ::closedir(dir);
    return n;
}

double run_seconds() {
    if (const char* s = std::getenv("TCPX_STRESS_SECONDS"); s != nullptr && *s != '\0') {
        const double v = std::atof(s);
        if (v > 0) return v;
    }
    return 1.5;
}

// Where a side's region lives.
enum class Mem { kHost, kGpu };

struct Setting {
    const char* name;
    Config (*make)();
    Mem a = Mem::kHost;
    Mem b = Mem::kHost;
    bool fake_tcpx = false;  // over the emulated TCPX plugin (GPU memory: its unpack path)
    // Its transport breaks connections on purpose (TCPX_P2P_FAULT): operations may fail once
    // the peer is reported gone, and must then all end, none hanging.
    bool peer_fails = false;
};

Config base_config() {
    Config c = engine_test_config();
    c.peer_timeout_ms = 20000;
    return c;
}

Config small_chunks() {
    Config c = base_config();
    c.xfer_chunk_size = 64 * 1024;
    c.window = 2;
    c.nsocks = 3;
    c.chunk_size = 32 * 1024;
    c.min_chunk_size = 4 * 1024;
    c.inline_threshold = 1024;
    c.xfer_inline_threshold = 1024;
    c.staging_slots = 2;
    // Authenticated peers, too.
    c.auth_secret = "stress-test-secret-0123456789";
    return c;
}

// Completions held back at random moments: transfers end out of order, and all end well.
Config injected_delays() {
    Config c = base_config();
    std::string spec;
    const char* ops[] = {"test", "isend", "irecv"};
    for (int i = 1; i <= 60; ++i) {
        if (!spec.empty()) spec += ",";
        spec += "delay:" + std::string(ops[i % 3]) + ":" + std::to_string(i * 17) + ":" +
                std::to_string(1 + (i * 7) % 15) + "ms";
    }
    c.fault = spec;
    return c;
}

// The 40th chunk completed breaks its connection: the peer fails on both sides mid-traffic (and
// then the endpoints connect again and go on).
Config connection_reset() {
    Config c = base_config();
    c.fault = "reset:test:40";
    return c;
}

Config no_progress_thread() {
    Config c = base_config();
    c.progress_thread = "off";
    c.socket_io = "caller";
    return c;
}

#if TCPX_TEST_REAL_GPU || TCPX_STRESS_DEVICE_SETTINGS
const Setting kSettings[] = {
    {"GpuBothSides", [] { return base_config(); }, Mem::kGpu, Mem::kGpu},
    {"GpuBothSidesSmallChunks", small_chunks, Mem::kGpu, Mem::kGpu},
    {"GpuToHostNoProgressThread", no_progress_thread, Mem::kGpu, Mem::kHost},
    {"HostToGpuOverFakeTcpx", [] { return base_config(); }, Mem::kHost, Mem::kGpu, true},
    {"GpuBothSidesOverFakeTcpxSmallChunks", small_chunks, Mem::kGpu, Mem::kGpu, true},
    {"GpuToHostInjectedDelays", injected_delays, Mem::kGpu, Mem::kHost},
    {"GpuBothSidesConnectionReset", connection_reset, Mem::kGpu, Mem::kGpu, false, true},
};
#else
const Setting kSettings[] = {
    {"Defaults", [] { return base_config(); }},
    {"SmallChunksNarrowWindow", small_chunks},
    {"NoProgressThreadIoInCaller", no_progress_thread},
    {"ProgressThreadIoInCallerQuietSpin",
     [] {
         Config c = base_config();
         c.socket_io = "caller";
         c.progress_quiet_spin = "on";
         return c;
     }},
    {"IoThreadsOneChannelLargeInline",
     [] {
         Config c = base_config();
         c.socket_io = "threads";
         c.channels = 1;
         c.xfer_inline_threshold = 64 * 1024;
         c.xfer_inline_alone = 256 * 1024;
         c.xfer_inline_alone_read = 256 * 1024;
         return c;
     }},
    {"InjectedDelays", injected_delays},
    {"ConnectionReset", connection_reset, Mem::kHost, Mem::kHost, false, true},
};
#endif

// (gtest prints a parameter with this: its name, not its bytes.)
void PrintTo(const Setting& setting, std::ostream* os) { *os << setting.name; }

class EngineStress : public ::testing::TestWithParam<Setting> {};

// One endpoint as the threads see it. Its region is host or GPU memory: read and written only
// through upload()/download().
struct Side {
    Endpoint* ep = nullptr;
    PeerId to_peer = 0;  // its id for the other side
    MemId mem = 0;
    RemoteMem desc;  // its region, as the other side addresses it
    TestBuffer* buf = nullptr;
    std::vector<uint8_t> read_only;  // what its read-only area holds
};

// Notifications: those the threads expect (registered before the post that carries them) and
// those each side's collector has seen. A payload seen twice, or one nobody sent, is a failure.
class NotificationBook {
 public:
    void expect(const std::string& payload) {
        std::lock_guard<std::mutex> g(mu_);
        expected_.insert(payload);
        if (strict_) must_.insert(payload);
    }
    // From now on every notification expected must arrive, whatever problems() is told (the
    // connection that failed is behind us).
    void set_strict() {
        std::lock_guard<std::mutex> g(mu_);
        strict_ = true;
    }
    // The post failed, or the transfer was cancelled before it could carry the notification.
    void forbid(const std::string& payload) {
        std::lock_guard<std::mutex> g(mu_);
        expected_.erase(payload);
        forbidden_.insert(payload);
    }
    void seen(const std::string& payload, std::vector<std::string>* errors) {
        std::lock_guard<std::mutex> g(mu_);
        if (++seen_[payload] > 1) errors->push_back("notification seen twice: " + payload);
    }
    bool has_seen(const std::string& payload) {
        std::lock_guard<std::mutex> g(mu_);
        return seen_.count(payload) != 0;
    }
    bool all_seen() {
        std::lock_guard<std::mutex> g(mu_);
        for (const std::string& p : expected_) {
            if (seen_.count(p) == 0) return false;
        }
        return true;
    }
    bool all_required_seen() {
        std::lock_guard<std::mutex> g(mu_);
        for (const std::string& p : must_) {
            if (seen_.count(p) == 0) return false;
        }
        return true;
    }
    // `missing_ok`: the peer failed, and what it had not delivered by then is lost.
    std::vector<std::string> problems(bool missing_ok) {
        std::lock_guard<std::mutex> g(mu_);
        std::vector<std::string> out;
        for (const std::string& p : expected_) {
            if (seen_.count(p) == 0 && (!missing_ok || must_.count(p) != 0)) {
                out.push_back("notification never seen: " + p);
            }
        }
        for (const auto& [p, n] : seen_) {
            if (forbidden_.count(p) != 0) {
                out.push_back("notification of a cancelled read or failed post seen: " + p);
            } else if (expected_.count(p) == 0) {
                out.push_back("notification nobody sent: " + p);
            }
        }
        return out;
    }
    size_t expected_count() {
        std::lock_guard<std::mutex> g(mu_);
        return expected_.size();
    }

 private:
    std::mutex mu_;
    std::set<std::string> expected_;
    std::set<std::string> forbidden_;
    std::set<std::string> must_;
    bool strict_ = false;
    std::map<std::string, int> seen_;
};

// One piece: where it reads from (in the source region) and lands (in the destination region).
struct Piece {
    uint64_t src = 0;
    uint64_t dst = 0;
    uint64_t len = 0;
};

// Up to `max_pieces` pieces laid out in a window of `span` bytes of the destination, in order
// with random gaps, each read from a random place of a source window of the same size (source
// pieces may overlap one another: only destinations must not).
std::vector<Piece> random_pieces(std::mt19937_64& rng, uint64_t span, int max_pieces) {
    const int n = 1 + static_cast<int>(rng() % max_pieces);
    std::vector<uint64_t> cuts;
    for (int i = 0; i < 2 * n; ++i) cuts.push_back(rng() % (span + 1));
    std::sort(cuts.begin(), cuts.end());
    std::vector<Piece> out;
    for (int i = 0; i < n; ++i) {
        const uint64_t start = cuts[2 * i], end = cuts[2 * i + 1];
        if (end == start) continue;
        Piece p;
        p.dst = start;
        p.len = end - start;
        p.src = rng() % (span - p.len + 1);
        out.push_back(p);
    }
    if (out.empty()) out.push_back(Piece{0, 0, 1 + rng() % span});
    return out;
}

// A transfer size: mostly small (inline, one chunk), sometimes around chunk bounds, sometimes
// up to a slot.
uint64_t random_span(std::mt19937_64& rng) {
    switch (rng() % 6) {
        case 0:
            return 1 + rng() % 512;
        case 1:
            return 1 + rng() % (16 << 10);
        case 2:
            return (64 << 10) - 64 + rng() % 128;  // around a small chunk's size
        case 3:
            return (256 << 10) - 64 + rng() % 128;  // around the engine tests' chunk size
        case 4:
            return 1 + rng() % (256 << 10);
        default:
            return 1 + rng() % kSlot;
    }
}

// One thread of one side: posts transfers toward the other side and checks what they did.
class Worker {
 public:
    Worker(int id, Side* me, Side* other, NotificationBook* other_book, uint64_t seed,
           Clock::time_point deadline)
        : id_(id),
          me_(me),
          other_(other),
          other_book_(other_book),
          rng_(seed),
          seed_(seed),
          deadline_(deadline) {}

    void run() {
        // Where the peer is to fail, on until it has (however slow the machine), within bounds.
        const auto end = peer_may_fail_ ? deadline_ + 30s : deadline_;
        while (errors_.empty() && !peer_down_ &&
               (Clock::now() < deadline_ || (peer_may_fail_ && Clock::now() < end))) {
            ++step_;
            switch (rng_() % 15) {
                case 0:
                case 1:
                case 2:
                case 3:
                    do_write();
                    break;
                case 4:
                case 5:
                case 6:
                case 7:
                    do_read();
                    break;
                case 8:
                case 9:
                case 10:
                case 11:
                    do_send_recv();
                    break;
                case 12:
                    do_dereg_in_flight();
                    break;
                default:
                    do_notify();
                    break;
            }
        }
    }

    const std::vector<std::string>& errors() const { return errors_; }
    int completed() const { return completed_; }
    int cancelled() const { return cancelled_; }
    int refused() const { return refused_; }
    bool peer_down() const { return peer_down_; }
    void set_peer_may_fail() { peer_may_fail_ = true; }
    void set_phase(int phase) { phase_ = phase; }

 private:
    // This thread's slot of a kind, in a side's region: filled and read back through the buffer.
    void fill(Side* side, SlotKind kind, const std::vector<uint8_t>& bytes) {
        side->buf->upload(slot_offset(id_, kind), bytes.data(), bytes.size());
    }
    void fill_sentinel(Side* side, SlotKind kind, uint64_t len) {
        fill(side, kind, std::vector<uint8_t>(len, kSentinel));
    }
    std::vector<uint8_t> contents(Side* side, SlotKind kind, uint64_t len) {
        return side->buf->download(slot_offset(id_, kind), len);
    }
    static std::vector<uint8_t> pattern(uint64_t len, uint64_t seed) {
        std::vector<uint8_t> v(len);
        fill_pattern(v.data(), len, seed);
        return v;
    }
    // The first byte of `v` from `from` on that is not the sentinel, or -1.
    static int64_t not_sentinel(const std::vector<uint8_t>& v, uint64_t from = 0) {
        for (uint64_t i = from; i < v.size(); ++i) {
            if (v[i] != kSentinel) return static_cast<int64_t>(i);
        }
        return -1;
    }

    // An operation failed. Where the setting breaks connections on purpose, that is the peer's
    // failure once the endpoint reports the peer gone: the thread stops there. Anything else is
    // an error. (What a transfer that completed left in memory is checked either way.)
    void op_failed(const std::string& what) {
        if (peer_may_fail_ && peer_gone()) {
            peer_down_ = true;
            return;
        }
        fail(what);
    }

    // Either endpoint reports the other gone, now or within a moment (the side whose transport
    // broke knows first; an op on the other side's endpoint may fail first).
    bool peer_gone() {
        return eventually(
            [&] {
                return !me_->ep->peer_status(me_->to_peer).ok() ||
                       !other_->ep->peer_status(other_->to_peer).ok();
            },
            5s);
    }

    void fail(const std::string& what) {
        errors_.push_back("phase " + std::to_string(phase_) + ", thread " + std::to_string(id_) +
                          " (seed " + std::to_string(seed_) + ", step " + std::to_string(step_) +
                          "): " + what);
    }

    std::string unique(const char* what) {
        return std::string(what) + ":" + std::to_string(phase_) + ":" + std::to_string(id_) + ":" +
               std::to_string(step_);
    }

    // Waits for a transfer the way an application might: one wait, short waits that time out,
    // or polls; and now and then cancels it first. Returns the final status; *cancel_status
    // what cancel() said, if it was called.
    Status complete(XferId x, bool may_cancel, std::optional<Status>* cancel_status) {
        if (may_cancel && rng_() % 6 == 0) {
            // Sometimes right away, sometimes after the transfer had a moment.
            if (rng_() % 2 == 0)
                std::this_thread::sleep_for(std::chrono::microseconds(rng_() % 300));
            *cancel_status = me_->ep->cancel(x);
        }
        const auto give_up = Clock::now() + 30s;
        switch (rng_() % 3) {
            case 0:
                return me_->ep->wait(x, 30s);
            case 1:
                while (Clock::now() < give_up) {
                    Status st = me_->ep->wait(x, std::chrono::milliseconds(rng_() % 2));
                    if (st.code() != StatusCode::kTimeout) return st;
                }
                break;
            default:
                while (Clock::now() < give_up) {
                    XferStatus st = me_->ep->poll(x);
                    if (st.state == XferState::kDone) return Status();
                    if (st.state == XferState::kFailed) return st.error;
                }
                break;
        }
        fail("a transfer did not end in 30 s");
        return Status(StatusCode::kTimeout, "the transfer did not end in 30 s");
    }

    // A transfer's end: done, or cancelled by us (only when we asked). Anything else fails.
    bool ended_well(const char* op, const Status& st, const std::optional<Status>& cancel) {
        if (st.ok()) {
            ++completed_;
            return true;
        }
        if (st.code() == StatusCode::kCancelled && cancel.has_value() &&
            cancel->code() != StatusCode::kFailedPrecondition) {
            ++cancelled_;
            return false;
        }
        op_failed(std::string(op) + " ended with " + st.to_string() +
                  (cancel ? " (cancel said " + cancel->to_string() + ")" : ""));
        return false;
    }

    // The pieces landed; every other byte of the window kept the sentinel.
    void check_window(const char* op, const std::vector<uint8_t>& dst, const uint8_t* src,
                      const std::vector<Piece>& pieces) {
        const uint64_t span = dst.size();
        std::vector<bool> covered(span, false);
        for (size_t i = 0; i < pieces.size(); ++i) {
            const Piece& p = pieces[i];
            if (std::memcmp(dst.data() + p.dst, src + p.src, p.len) != 0) {
                fail(std::string(op) + ": piece " + std::to_string(i) + " of " +
                     std::to_string(pieces.size()) + " (" + std::to_string(p.len) + " bytes at " +
                     std::to_string(p.dst) + ") differs");
                return;
            }
            std::fill(covered.begin() + p.dst, covered.begin() + p.dst + p.len, true);
        }
        for (uint64_t i = 0; i < span; ++i) {
            if (!covered[i] && dst[i] != kSentinel) {
                fail(std::string(op) + ": byte " + std::to_string(i) +
                     " outside every piece changed");
                return;
            }
        }
    }

    std::vector<IoVec> iovecs(const std::vector<Piece>& pieces, uint64_t src_base,
                              uint64_t dst_base, bool write) {
        std::vector<IoVec> out;
        for (const Piece& p : pieces) {
            IoVec v;
            v.mem = me_->mem;
            v.remote = other_->desc;
            v.len = p.len;
            if (write) {
                v.offset = src_base + p.src;
                v.remote_offset = dst_base + p.dst;
            } else {
                v.offset = dst_base + p.dst;
                v.remote_offset = src_base + p.src;
            }
            out.push_back(v);
        }
        return out;
    }

    // A cancelled write of ours still lands at the peer, in its own time: our window there is
    // not ours to write or check again until its notification says it has.
    bool window_there_landing() {
        if (poisoned_ && !other_book_->has_seen(*poisoned_)) return true;
        poisoned_.reset();
        return false;
    }

    // One time in `one_in`, a notification for the transfer about to be posted, expected at the
    // peer from now on.
    std::optional<std::string> maybe_note(const char* kind, uint64_t one_in) {
        if (rng_() % one_in != 0) return std::nullopt;
        std::string note = unique(kind);
        other_book_->expect(note);
        return note;
    }

    // A write (from our `src_base`, to the peer's `dst_base`) or a read (from the peer's
    // `src_base` into our `dst_base`) of `pieces`: half the time a single piece goes through the
    // one-piece call, else through the vector one.
    StatusOr<XferId> post_one_sided(bool write, const std::vector<Piece>& pieces, uint64_t src_base,
                                    uint64_t dst_base, const std::optional<std::string>& note) {
        const auto notification = note ? std::optional<std::string_view>(*note) : std::nullopt;
        if (pieces.size() == 1 && rng_() % 2 == 0) {
            const Piece& p = pieces[0];
            return write ? me_->ep->write(me_->to_peer, me_->mem, src_base + p.src, other_->desc,
                                          dst_base + p.dst, p.len, notification)
                         : me_->ep->read(me_->to_peer, me_->mem, dst_base + p.dst, other_->desc,
                                         src_base + p.src, p.len, notification);
        }
        const std::vector<IoVec> iov = iovecs(pieces, src_base, dst_base, write);
        return write ? me_->ep->writev(me_->to_peer, iov, notification)
                     : me_->ep->readv(me_->to_peer, iov, notification);
    }

    void do_write() {
        if (window_there_landing()) return do_read();
        const uint64_t span = random_span(rng_);
        std::vector<Piece> pieces = random_pieces(rng_, span, rng_() % 3 == 0 ? 40 : 1);
        const std::vector<uint8_t> src = pattern(span, seed_ * 1000003 + step_);
        fill(me_, kSource, src);
        fill_sentinel(other_, kWrittenInto, span);
        const std::optional<std::string> note = maybe_note("w", 3);
        const uint64_t src_base = slot_offset(id_, kSource);
        const uint64_t dst_base = slot_offset(id_, kWrittenInto);
        StatusOr<XferId> x = post_one_sided(true, pieces, src_base, dst_base, note);
        if (!x.ok()) {
            op_failed("write: " + x.status().to_string());
            if (note) other_book_->forbid(*note);
            return;
        }
        std::optional<Status> cancel;
        // Only a write with a notification is cancelled: it tells us when its bytes are in.
        const Status st = complete(*x, note.has_value(), &cancel);
        if (me_->ep->poll(*x).error.code() != StatusCode::kInvalidArgument) {
            fail("write: its id is still known after it was reported");
        }
        if (ended_well("write", st, cancel)) {
            check_window("write", contents(other_, kWrittenInto, span), src.data(), pieces);
        } else if (st.code() == StatusCode::kCancelled) {
            poisoned_ = *note;
        }
    }

    void do_read() {
        const uint64_t span = random_span(rng_);
        std::vector<Piece> pieces = random_pieces(rng_, span, rng_() % 3 == 0 ? 40 : 1);
        // From anywhere in the peer's read-only area.
        const uint64_t src_base = rng_() % (kStatic - span + 1);
        const uint8_t* src = other_->read_only.data() + src_base;
        fill_sentinel(me_, kReadInto, span);
        const uint64_t dst_base = slot_offset(id_, kReadInto);
        const std::optional<std::string> note = maybe_note("r", 4);
        StatusOr<XferId> x = post_one_sided(false, pieces, src_base, dst_base, note);
        if (!x.ok()) {
            op_failed("read: " + x.status().to_string());
            if (note) other_book_->forbid(*note);
            return;
        }
        std::optional<Status> cancel;
        const Status st = complete(*x, true, &cancel);
        if (ended_well("read", st, cancel)) {
            check_window("read", contents(me_, kReadInto, span), src, pieces);
        } else if (st.code() == StatusCode::kCancelled) {
            // A read that failed never notifies.
            if (note) other_book_->forbid(*note);
            // Nothing of a read lands in our memory once it is reported: a byte that did would
            // show in the window within a moment.
            fill_sentinel(me_, kReadInto, span);
            std::this_thread::sleep_for(std::chrono::microseconds(rng_() % 500));
            if (int64_t at = not_sentinel(contents(me_, kReadInto, span)); at != -1) {
                fail("read: byte " + std::to_string(at) +
                     " of the window changed after the read was reported cancelled");
            }
        }
    }

    // A tagged message from us to the peer (or, half the time, from the peer to us), the receive
    // posted before or after the send; now and then a receive is posted and cancelled first, and
    // must not take the message.
    void do_send_recv() {
        if (window_there_landing()) return do_read();
        const bool outbound = rng_() % 2 == 0;
        Side* sender = outbound ? me_ : other_;
        Side* receiver = outbound ? other_ : me_;
        const SlotKind into = outbound ? kWrittenInto : kReadInto;
        // The cancelled receive's buffer: the receiver's slot of ours that nothing else uses.
        const SlotKind decoy_into = outbound ? kReadInto : kWrittenInto;
        const uint64_t len = std::min(random_span(rng_), kSlot - 64);
        const uint64_t room = len + rng_() % 64;  // a receive may be larger than the message
        const uint64_t tag = (uint64_t(id_) << 40) | step_;
        const std::vector<uint8_t> src = pattern(len, seed_ * 7919 + step_);
        fill(sender, kSource, src);
        fill_sentinel(receiver, into, room);

        // A receive cancelled before any send: it must give the message up to the next one, and
        // nothing may land in its buffer.
        const bool decoy = rng_() % 5 == 0;
        if (decoy) {
            fill_sentinel(receiver, decoy_into, room);
            auto r0 = receiver->ep->recv(receiver->to_peer, receiver->mem,
                                         slot_offset(id_, decoy_into), room, tag);
            if (!r0.ok()) {
                op_failed("recv (to cancel): " + r0.status().to_string());
                return;
            }
            const Status c = receiver->ep->cancel(*r0);
            if (!c.ok()) op_failed("cancel of an unmatched recv: " + c.to_string());
            const Status w = receiver->ep->wait(*r0, 10s);
            if (w.code() != StatusCode::kCancelled) {
                op_failed("a cancelled recv ended with " + w.to_string());
            }
        }
        StatusOr<XferId> r = Status(StatusCode::kInternal, "not posted");
        StatusOr<XferId> sent = r;
        auto post_recv = [&] {
            r = receiver->ep->recv(receiver->to_peer, receiver->mem, slot_offset(id_, into), room,
                                   tag);
        };
        auto post_send = [&] {
            sent =
                sender->ep->send(sender->to_peer, sender->mem, slot_offset(id_, kSource), len, tag);
        };
        if (rng_() % 2 == 0) {
            post_recv();
            post_send();
        } else {
            post_send();
            post_recv();
        }
        if (!r.ok() || !sent.ok()) {
            op_failed("send/recv post: " + (r.ok() ? sent.status() : r.status()).to_string());
            return;
        }
        const Status ss = sender->ep->wait(*sent, 30s);
        const Status rs = receiver->ep->wait(*r, 30s);
        if (!ss.ok() || !rs.ok()) {
            op_failed("send/recv: send " + ss.to_string() + ", recv " + rs.to_string());
            return;
        }
        completed_ += 2;
        const std::vector<uint8_t> got = contents(receiver, into, room);
        if (std::memcmp(got.data(), src.data(), len) != 0) {
            fail("recv: the message differs (" + std::to_string(len) + " bytes)");
            return;
        }
        if (int64_t at = not_sentinel(got, len); at != -1) {
            fail("recv: byte " + std::to_string(at) + " past the message changed");
            return;
        }
        if (decoy) {
            if (int64_t at = not_sentinel(contents(receiver, decoy_into, room)); at != -1) {
                fail("a cancelled recv's buffer changed at byte " + std::to_string(at));
            }
        }
    }

    // A registration made for one transfer and deregistered while it is in flight: here (the
    // write's source or the read's destination), and dereg() waits for the transfer, which ends
    // well; or at the peer (the write's destination), and the write either lands whole before
    // dereg() returns or is refused there, landing nothing. Either way nothing touches the
    // memory once dereg() has returned, and the registration is gone.
    void do_dereg_in_flight() {
        if (window_there_landing()) return do_read();
        const uint64_t len = random_span(rng_);
        switch (rng_() % 3) {
            case 0: {  // a write whose source goes
                const std::vector<uint8_t> src = pattern(len, seed_ * 31 + step_);
                fill(me_, kSource, src);
                fill_sentinel(other_, kWrittenInto, len);
                auto tmp = me_->ep->reg(me_->buf->data() + slot_offset(id_, kSource), len);
                if (!tmp.ok()) return op_failed("reg: " + tmp.status().to_string());
                auto x = me_->ep->write(me_->to_peer, *tmp, 0, other_->desc,
                                        slot_offset(id_, kWrittenInto), len);
                if (!x.ok()) return op_failed("write: " + x.status().to_string());
                const Status d = me_->ep->dereg(*tmp);
                if (!d.ok()) return op_failed("dereg of a write's source: " + d.to_string());
                // dereg() waited for it: it has ended, and ended well.
                const Status st = me_->ep->wait(*x, 0ms);
                if (!st.ok())
                    return op_failed("a write whose source was deregistered: " + st.to_string());
                ++completed_;
                check_window("write (source deregistered)", contents(other_, kWrittenInto, len),
                             src.data(), {Piece{0, 0, len}});
                if (me_->ep
                        ->write(me_->to_peer, *tmp, 0, other_->desc, slot_offset(id_, kWrittenInto),
                                len)
                        .ok()) {
                    fail("a write from a deregistered region was posted");
                }
                return;
            }
            case 1: {  // a read whose destination goes
                const uint64_t src_base = rng_() % (kStatic - len + 1);
                fill_sentinel(me_, kReadInto, len);
                auto tmp = me_->ep->reg(me_->buf->data() + slot_offset(id_, kReadInto), len);
                if (!tmp.ok()) return op_failed("reg: " + tmp.status().to_string());
                auto x = me_->ep->read(me_->to_peer, *tmp, 0, other_->desc, src_base, len);
                if (!x.ok()) return op_failed("read: " + x.status().to_string());
                const Status d = me_->ep->dereg(*tmp);
                if (!d.ok()) return op_failed("dereg of a read's destination: " + d.to_string());
                const Status st = me_->ep->wait(*x, 0ms);
                if (!st.ok()) {
                    return op_failed("a read whose destination was deregistered: " +
                                     st.to_string());
                }
                ++completed_;
                check_window("read (destination deregistered)", contents(me_, kReadInto, len),
                             other_->read_only.data() + src_base, {Piece{0, 0, len}});
                return;
            }
            default: {  // a write whose destination goes at the peer
                const std::vector<uint8_t> src = pattern(len, seed_ * 37 + step_);
                fill(me_, kSource, src);
                fill_sentinel(other_, kWrittenInto, len);
                auto tmp =
                    other_->ep->reg(other_->buf->data() + slot_offset(id_, kWrittenInto), len);
                if (!tmp.ok()) return op_failed("reg at the peer: " + tmp.status().to_string());
                auto desc = other_->ep->describe(*tmp);
                if (!desc.ok()) return op_failed("describe: " + desc.status().to_string());
                auto x = me_->ep->write(me_->to_peer, me_->mem, slot_offset(id_, kSource), *desc, 0,
                                        len);
                if (!x.ok()) return op_failed("write: " + x.status().to_string());
                if (rng_() % 2 == 0) {
                    std::this_thread::sleep_for(std::chrono::microseconds(rng_() % 200));
                }
                const Status d = other_->ep->dereg(*tmp);
                if (!d.ok()) return op_failed("dereg at the peer: " + d.to_string());
                // From here on nothing lands there: what is there now stays.
                const std::vector<uint8_t> after_dereg = contents(other_, kWrittenInto, len);
                const Status st = me_->ep->wait(*x, 30s);
                std::this_thread::sleep_for(std::chrono::microseconds(rng_() % 300));
                const std::vector<uint8_t> later = contents(other_, kWrittenInto, len);
                if (later != after_dereg) {
                    return fail("bytes landed in a region after its dereg() returned");
                }
                if (st.ok()) {
                    ++completed_;
                    check_window("write (destination deregistered)", later, src.data(),
                                 {Piece{0, 0, len}});
                } else if (st.code() == StatusCode::kTimeout) {
                    op_failed("a write into a region deregistered at the peer: " + st.to_string());
                } else if (peer_may_fail_ && peer_gone()) {
                    peer_down_ = true;  // (part of it may have landed before the connection broke)
                } else if (int64_t at = not_sentinel(later); at != -1) {
                    fail("a write refused at the peer (" + st.to_string() + ") changed byte " +
                         std::to_string(at));
                } else {
                    ++refused_;
                }
                return;
            }
        }
    }

    void do_notify() {
        const std::string note = unique("n");
        other_book_->expect(note);
        Status st = me_->ep->notify(me_->to_peer, note);
        if (!st.ok()) {
            other_book_->forbid(note);
            op_failed("notify: " + st.to_string());
        }
    }

    int id_;
    Side* me_;
    Side* other_;
    NotificationBook* other_book_;
    std::mt19937_64 rng_;
    uint64_t seed_;
    Clock::time_point deadline_;
    uint64_t step_ = 0;
    // The notification of a cancelled write whose bytes may still be landing in our window at
    // the peer.
    std::optional<std::string> poisoned_;
    std::vector<std::string> errors_;
    int completed_ = 0;
    int cancelled_ = 0;
    int refused_ = 0;  // writes into a region deregistered at the peer before they arrived
    bool peer_may_fail_ = false;
    bool peer_down_ = false;
    int phase_ = 1;  // (in notifications' payloads: each phase's are its own)
};

TEST_P(EngineStress, MixedTrafficFromBothSidesLandsExactly) {
    const Setting& setting = GetParam();
    Config config = setting.make();
    int gpus = 2;
    std::optional<ScopedHostDevice> emu;
#if TCPX_TEST_REAL_GPU
    gpus = cuda::device_count();
    if (gpus == 0) GTEST_SKIP() << "no GPU";
#elif TCPX_STRESS_DEVICE_SETTINGS
    emu.emplace(2);
#endif
    HostDevice* emulation = emu ? &emu->get() : nullptr;
    bool fake_tcpx_memory_set = false;
    if (setting.fake_tcpx) {
#ifdef TCPX_FAKE_TCPX_PATH
        config.net_plugin = TCPX_FAKE_TCPX_PATH;
        if (emulation != nullptr) {
            // The emulated plugin's "GPU" memory is then host memory too.
            ::setenv("FAKETCPX_MEMORY", "host", 1);
            fake_tcpx_memory_set = true;
        }
#else
        GTEST_SKIP() << "no emulated TCPX plugin in this build";
#endif
    }
    // Sockets only: CUDA and a loaded plugin keep descriptors of their own for the life of the
    // process, opened on first use.
    const int sockets_before = count_open_sockets();
    // Fresh each run, or TCPX_STRESS_SEED's (each thread's choices follow from it; how the
    // threads interleave does not).
    uint64_t base_seed = std::random_device{}();
    if (const char* seed = std::getenv("TCPX_STRESS_SEED"); seed != nullptr && *seed != '\0') {
        base_seed = std::strtoull(seed, nullptr, 10);
    }
    SCOPED_TRACE("base seed " + std::to_string(base_seed));
    std::vector<std::string> errors;
    int completed = 0, cancelled = 0, refused = 0;
    {
        // a's region on GPU 0 or in host memory, b's on the last GPU or in host memory; each
        // endpoint serves the GPU its region is on.
        auto make_buffer = [&](Mem mem, int gpu) {
            return mem == Mem::kGpu ? device_buffer(kRegion, gpu, emulation) : host_buffer(kRegion);
        };
        std::unique_ptr<TestBuffer> abuf = make_buffer(setting.a, 0);
        std::unique_ptr<TestBuffer> bbuf = make_buffer(setting.b, gpus - 1);
        ASSERT_TRUE(abuf && bbuf);
        Side sa, sb;
        sa.buf = abuf.get();
        sb.buf = bbuf.get();
        for (Side* side : {&sa, &sb}) {
            side->buf->upload(0, std::vector<uint8_t>(kRegion, kSentinel).data(), kRegion);
            side->read_only.resize(kStatic);
            fill_pattern(side->read_only.data(), kStatic, side == &sa ? 1 : 2);
            side->buf->upload(0, side->read_only.data(), kStatic);
        }
        Config a_config = config, b_config = config;
        // A reset breaks a's transport only: each endpoint's rule fires once, and b's would
        // otherwise break the connection made again after a's did.
        if (setting.peer_fails) b_config.fault.clear();
        if (setting.a == Mem::kGpu || setting.b == Mem::kGpu) {
            a_config.gpu_index = 0;
            b_config.gpu_index = gpus - 1;
        }
        auto a = make_endpoint("stress-a", a_config);
        auto b = make_endpoint("stress-b", b_config);
        ASSERT_TRUE(a && b);
        // Connected so that neither side needs a progress thread: b's accept drives b while
        // this thread drives a (get_notifications makes progress).
        auto connect_pair = [&](Link* l) {
            auto to_b = a->connect_async(b->metadata());
            ASSERT_TRUE(to_b.ok()) << to_b.status().to_string();
            l->a_to_b = *to_b;
            StatusOr<PeerId> to_a = Status(StatusCode::kInternal, "not accepted");
            std::thread acceptor([&] { to_a = b->accept(10s); });
            const bool ready = eventually([&] {
                (void)a->get_notifications();
                return a->peer_status(l->a_to_b).ok();
            });
            acceptor.join();
            ASSERT_TRUE(to_a.ok()) << to_a.status().to_string();
            ASSERT_TRUE(ready) << a->peer_status(l->a_to_b).to_string();
            l->b_to_a = *to_a;
        };
        Link l;
        ASSERT_NO_FATAL_FAILURE(connect_pair(&l));
        sa.ep = a.get();
        sb.ep = b.get();
        sa.to_peer = l.a_to_b;
        sb.to_peer = l.b_to_a;
        auto am = a->reg(abuf->data(), kRegion);
        auto bm = b->reg(bbuf->data(), kRegion);
        ASSERT_TRUE(am.ok() && bm.ok()) << am.status().to_string() << bm.status().to_string();
        sa.mem = *am;
        sb.mem = *bm;
        sa.desc = *a->describe(sa.mem);
        sb.desc = *b->describe(sb.mem);
        NotificationBook book_a, book_b;  // what a's and b's application receive

        std::atomic<bool> stop{false};
        std::mutex errors_mu;
        auto collector = [&](Endpoint* ep, NotificationBook* book) {
            std::vector<std::string> mine;
            while (!stop.load()) {
                for (Notification& n : ep->get_notifications()) book->seen(n.payload, &mine);
                std::this_thread::sleep_for(200us);
            }
            for (Notification& n : ep->get_notifications()) book->seen(n.payload, &mine);
            std::lock_guard<std::mutex> g(errors_mu);
            errors.insert(errors.end(), mine.begin(), mine.end());
        };
        std::thread ca(collector, a.get(), &book_a), cb(collector, b.get(), &book_b);

        // One phase of the workers, on the connection the sides name now; `peer_fails`: the
        // transport breaks it on purpose. Returns whether a worker saw the peer go.
        auto run_phase = [&](int phase, bool peer_fails, uint64_t seed) {
            const auto deadline =
                Clock::now() + std::chrono::microseconds(int64_t(run_seconds() * 1e6));
            std::vector<std::unique_ptr<Worker>> workers;
            for (int t = 0; t < kThreads; ++t) {
                const bool on_a = t < kThreadsPerSide;
                workers.push_back(std::make_unique<Worker>(t, on_a ? &sa : &sb, on_a ? &sb : &sa,
                                                           on_a ? &book_b : &book_a, seed + 7 * t,
                                                           deadline));
                workers.back()->set_phase(phase);
                if (peer_fails) workers.back()->set_peer_may_fail();
            }
            std::vector<std::thread> threads;
            for (auto& w : workers) threads.emplace_back([&w] { w->run(); });
            for (auto& t : threads) t.join();
            bool went_down = false;
            for (auto& w : workers) {
                went_down = went_down || w->peer_down();
                errors.insert(errors.end(), w->errors().begin(), w->errors().end());
                completed += w->completed();
                cancelled += w->cancelled();
                refused += w->refused();
            }
            return went_down;
        };
        if (setting.peer_fails) {
            if (!run_phase(1, true, base_seed)) {
                errors.push_back("the injected fault never took the peer down");
            }
            // The endpoints connect again (the fault fires once) and the same traffic runs on
            // the new connection, nothing of the failed one in its way: every transfer ends
            // well, every notification arrives.
            eventually([&] { return !b->peer_status(l.b_to_a).ok(); });
            ASSERT_NO_FATAL_FAILURE(connect_pair(&l));
            sa.to_peer = l.a_to_b;
            sb.to_peer = l.b_to_a;
            book_a.set_strict();
            book_b.set_strict();
            (void)run_phase(2, false, base_seed + 1000003);
        } else {
            (void)run_phase(1, false, base_seed);
        }
        // Every notification expected arrives (those of cancelled writes too).
        eventually([&] { return book_a.all_seen() && book_b.all_seen(); },
                   setting.peer_fails ? 1s : 20s);
        eventually([&] { return book_a.all_required_seen() && book_b.all_required_seen(); }, 20s);
        stop = true;
        ca.join();
        cb.join();
        for (NotificationBook* book : {&book_a, &book_b}) {
            for (std::string& p : book->problems(setting.peer_fails)) {
                errors.push_back(std::move(p));
            }
        }
        // Nothing wrote the read-only areas, or outside the regions.
        for (Side* side : {&sa, &sb}) {
            if (side->buf->download(0, kStatic) != side->read_only) {
                errors.push_back("a read-only area changed");
            }
            if (!side->buf->canaries_intact()) {
                errors.push_back("bytes outside a registered region changed");
            }
        }
        // Every transfer posted ended, and is counted so.
        for (Endpoint* ep : {a.get(), b.get()}) {
            eventually([&] {
                const Stats s = ep->stats();
                return s.transfers_started == s.transfers_completed + s.transfers_failed;
            });
            const Stats s = ep->stats();
            if (s.transfers_started != s.transfers_completed + s.transfers_failed) {
                errors.push_back("an endpoint counts " + std::to_string(s.transfers_started) +
                                 " transfers started, " + std::to_string(s.transfers_completed) +
                                 " completed and " + std::to_string(s.transfers_failed) +
                                 " failed");
            }
            if (s.errors != 0 && !setting.peer_fails) {
                errors.push_back("an endpoint counts a failed peer");
            }
        }
        a.reset();
        b.reset();
    }
    if (fake_tcpx_memory_set) ::unsetenv("FAKETCPX_MEMORY");
    for (const std::string& e : errors) ADD_FAILURE() << e;
    EXPECT_GT(completed, setting.peer_fails ? 5 : 20) << "too few transfers to mean anything";
    std::printf("[ stress   ] %s: %d transfers completed, %d cancelled, %d refused by a dereg\n",
                setting.name, completed, cancelled, refused);
    EXPECT_TRUE(eventually([&] { return count_open_sockets() <= sockets_before; }))
        << count_open_sockets() << " sockets open against " << sockets_before << " before";
}

// Named apart per binary: CTest knows each test by its name alone.
#if TCPX_TEST_REAL_GPU
#define TCPX_STRESS_PREFIX Gpu
#elif TCPX_STRESS_DEVICE_SETTINGS
#define TCPX_STRESS_PREFIX EmulatedGpu
#else
#define TCPX_STRESS_PREFIX Host
#endif
INSTANTIATE_TEST_SUITE_P(TCPX_STRESS_PREFIX, EngineStress, ::testing::ValuesIn(kSettings),
                         [](const ::testing::TestParamInfo<Setting>& p) {
                             return std::string(p.param.name);
                         });

}  // namespace
}  // namespace tcpx::testing::stress
