// The data channels: moving each chunk of a transfer through the transport (staging, the
// requests in flight per channel, device rings and memory registrations per channel).
#include <algorithm>
#include <cstddef>
#include <cstring>

#include "common/log.h"
#include "common/status_util.h"
#include "common/strings.h"
#include "cuda/unpack_check.h"
#include "cuda/unpack_defs.h"
#include "engine/ctrl_wire.h"
#include "engine/engine.h"
#include "engine/reg_windows.h"

namespace tcpx {

using engine::Clock;
using engine::Op;
using engine::Region;
using engine::StageTimes;

namespace {

// A transport that hands receives over as UNPACK (Google's TCPX) reports no received size
// (Properties::reports_sizes): its entries, host memory the plugin wrote when test() reported the
// receive, say where the bytes that arrived are, and are checked before any launch.
// Copies the receive's description out of the plugin's memory, its count read once, into `out`:
// checked there, and the unpack follows that copy (the plugin's memory is read no more, so a
// plugin that rewrote it meanwhile could not have the kernel follow what was not checked).
Status snapshot_unpack(const net::UnpackSlot& q, std::vector<cuda::LoadMeta>* out) {
    const uint64_t count = *q.count;
    if (count > static_cast<uint64_t>(cuda::kUnpackMaxEntries)) {
        return protocol_error(
            strformat("the transport described a receive in %llu pieces (at most %d)",
                      static_cast<unsigned long long>(count), cuda::kUnpackMaxEntries));
    }
    out->resize(count);  // (capacity kept from receive to receive)
    if (count > 0) std::memcpy(out->data(), q.entries, count * sizeof(cuda::LoadMeta));
    return Status();
}

// Bytes the entries leave out were placed in the receive's buffer by the plugin itself
// (`*uncovered` of them; see check_unpack_entries).
Status check_unpacked_bytes(const std::vector<cuda::LoadMeta>& e, uint64_t want,
                            uint64_t bounce_len, std::vector<uint32_t>* scratch,
                            uint64_t* uncovered) {
    return cuda::check_unpack_entries(e.data(), e.size(), want, bounce_len, scratch, uncovered);
}

// A receive's description must be its queue slot's own: entries at meta->mem[index], count at
// meta->cnt[index] of the queue the comm's device handle names. (A plugin whose request layout
// drifted would hand over pointers to anything; the entries' checks cannot tell.) The queue's
// host address is learned from the first receive, once the GPUs' address of that memory is the
// handle's, and every later one must match it exactly.
Status check_unpack_slot(engine::Channel& ch, const net::UnpackSlot& q, int device) {
    using cuda::UnpackMeta;
    const auto entries = reinterpret_cast<uintptr_t>(q.entries);
    const auto count = reinterpret_cast<uintptr_t>(q.count);
    const uintptr_t index = static_cast<uintptr_t>(q.index);
    constexpr uintptr_t kSlotBytes = sizeof(UnpackMeta::mem[0]);
    const uintptr_t base = entries - offsetof(UnpackMeta, mem) - index * kSlotBytes;
    bool ok = q.index >= 0 && q.index < cuda::kUnpackQueueDepth &&
              count == base + offsetof(UnpackMeta, cnt) + index * sizeof(uint64_t);
    if (ok && ch.unpack_meta_host == 0) {
        // (with the comm's GPU current: asked on a thread with none, CUDA would make a context
        // on GPU 0 for it)
        cuda::ScopedGpu gpu(device);
        // Its first and its last byte: a plugin with a smaller allocation there would have us
        // read past its end.
        constexpr uintptr_t kLast = sizeof(UnpackMeta) - 1;
        ok = gpu.status().ok() &&
             cuda::device().mapped_host_address(reinterpret_cast<const void*>(base)) ==
                 reinterpret_cast<uintptr_t>(ch.unpack.meta) &&
             cuda::device().mapped_host_address(reinterpret_cast<const void*>(base + kLast)) ==
                 reinterpret_cast<uintptr_t>(ch.unpack.meta) + kLast;
        if (ok) ch.unpack_meta_host = base;
    } else if (ok) {
        ok = base == ch.unpack_meta_host;
    }
    if (!ok) {
        return protocol_error(strformat(
            "the transport described a receive outside its unpack queue (slot %d: entries at "
            "%p, count at %p)",
            q.index, q.entries, static_cast<const void*>(q.count)));
    }
    return Status();
}

// Microseconds per chunk, of a sum of nanoseconds.
double per_chunk_us(uint64_t ns, uint64_t chunks) {
    return static_cast<double>(ns) / 1e3 / static_cast<double>(chunks);
}

}  // namespace

// --- the data channels
// -----------------------------------------------------------------------------

bool Endpoint::Impl::progress_channel(Peer& p, Channel& ch, bool tx) {
    using engine::OpPath;
    const char* what = tx ? "data channel send" : "data channel receive";
    auto failed = [&](Status st) {
        fail_peer(p, st.with_context(what));
        return true;
    };
    // An op an error took off the channel's lists: fail_peer() subtracts only those still on
    // them, so it leaves the count of ops in flight here.
    auto lost = [&](Status st) {
        --active_ops_;
        return failed(std::move(st));
    };
    bool did = false;
    // Completions, oldest first (some transports require that order).
    while (!ch.inflight.empty()) {
        bool done = false;
        size_t size = 0;
        Status st = net_->test(ch.inflight.front().req, &done, &size);
        if (!st.ok()) {
            // The request is gone with its error (the Net contract): it must not be tested
            // again when the peer's channels are wound down.
            ch.inflight.pop_front();
            return lost(st);
        }
        if (!done) break;
        Channel::InFlight f = ch.inflight.front();
        ch.inflight.pop_front();
        ch.last_progress = Clock::now();
        if (stage_times_) f.op.done_ns = engine::stage_clock_ns();
        ++p.moved;
        did = true;
        // Both sides cut the same chunks: a receive of any other size means the streams are out
        // of step (or the transport is broken), and no later chunk can be trusted to land right.
        if (!tx && props_.reports_sizes && size != f.op.len) {
            return lost(protocol_error(strformat("received %zu bytes where the chunk has %llu",
                                                 size, static_cast<unsigned long long>(f.op.len))));
        }
        if (tx) {
            if (stage_times_) time_stages(ch, f.op, tx, f.op.done_ns);
            // The transport is done with the bytes: a staging slot can take the next chunk.
            if (f.op.slot >= 0) slots_for(ch, f.op).release(f.op.slot);
            op_done(f.op);
            continue;
        }
        // Listed before anything can fail: out of memory part way through (start_finishing's
        // lists) leaves the op where the teardown finds and counts it, not on no list at all.
        try {
            ch.finishing.push_back(f);
        } catch (...) {
            --active_ops_;  // (as lost(): on no list; the peer fails with the exception)
            throw;
        }
        st = start_finishing(ch, ch.finishing.back());
        if (!st.ok()) {
            ch.finishing.pop_back();
            return lost(st);
        }
        ch.finishing.back().started = true;
    }
    // Receives are handed back to the transport oldest first, once their bytes are where they
    // belong (Google's TCPX recycles the pages an unpack reads at irecv_consumed()).
    while (!ch.finishing.empty()) {
        const Channel::InFlight f = ch.finishing.front();
        if (!f.started) {
            // Its finishing was cut short (out of memory) and the peer not failed yet (no
            // memory for that either): never taken for landed, whatever its slot says.
            ch.finishing.pop_front();
            return lost(internal_error(
                "a received chunk's copy or unpack never started (out of memory part way)"));
        }
        if (f.op.slot >= 0) {
            auto ready = slot_ready(ch, f.op);
            if (!ready.ok()) return failed(ready.status());
            if (!*ready) break;
            slots_for(ch, f.op).release(f.op.slot);
        }
        ch.finishing.pop_front();
        ch.last_progress = Clock::now();
        if (stage_times_) time_stages(ch, f.op, tx, engine::stage_clock_ns());
        Status st = net_->irecv_consumed(ch.recv, 1, f.req);
        if (!st.ok()) return lost(st);
        if (f.op.region == nullptr) {
            ch.scratch_busy = false;
            release_scratch(ch, tx);
        }
        did = true;
        op_done(f.op);
    }
    // Sends through staging: copy chunks into free slots ahead of the wire, so the copy of one
    // chunk overlaps the sending of the previous ones.
    while (tx && ch.staged_ahead < ch.queued.size()) {
        Op& op = ch.queued[ch.staged_ahead];
        // (Each ensure_* says false while the staging total has no room for what it would
        // make: the chunk waits, and the ones behind it.)
        if (op.path == OpPath::kStaged) {
            auto made = ensure_ring(p, ch, tx, op);
            if (!made.ok()) return failed(made.status());
            if (!*made || !ch.ring->has_free(op.len)) break;
            op.slot = ch.ring->acquire(op.len);
            Status st = ch.ring->copy_in(op.slot, op.ptr, op.len);
            if (!st.ok()) return failed(st);
            did = true;
        } else if (op.path == OpPath::kGather && !props_.segments) {
            auto made = ensure_host_slots(p, ch, tx);
            if (!made.ok()) return failed(made.status());
            if (!*made || !ch.hslots->has_free(op.len)) break;
            op.slot = ch.hslots->acquire(op.len);
            copy_host_segments(op, ch.hslots->slot(op.slot), /*gather=*/true);
            did = true;
        } else if (op.path == OpPath::kStagedGather || op.path == OpPath::kDeviceGather) {
            const bool twin = op.path == OpPath::kDeviceGather;
            auto made =
                twin ? ensure_gather_twin(p, ch, tx, op) : ensure_gather_ring(p, ch, tx, op);
            if (!made.ok()) return failed(made.status());
            if (!*made || !ch.gring->has_free(op.len)) break;
            op.slot = ch.gring->acquire(op.len);
            Status st = ch.gring->gather(op.slot, segments(op), twin);
            if (!st.ok()) return failed(st);
            did = true;
        }
        ++ch.staged_ahead;
        ch.staging_wait = false;  // (its chunk went ahead: one cancelled may not have asked)
    }
    while (!ch.queued.empty() &&
           ch.inflight.size() + ch.finishing.size() < static_cast<size_t>(window_)) {
        Op& op = ch.queued.front();
        uint8_t* ptr = op.ptr;
        net::MemHandle* mh = nullptr;
        const Channel::Mr* reg = nullptr;  // (mr_for's entry)
        int rx_slot = -1;
        uint64_t rx_hold = op.len;  // bytes of its staging ring a receive holds
        // Several host pieces to a transport that takes segment lists: straight from and into
        // the pieces, no staging.
        const bool segments = op.path == OpPath::kGather && props_.segments;
        if (tx && ch.staged_ahead == 0) break;  // its staging slot is not free yet
        if (op.path == OpPath::kStaged || op.path == OpPath::kStagedGather ||
            op.path == OpPath::kDeviceGather) {
            const bool gather = op.path != OpPath::kStaged;
            const bool twin = op.path == OpPath::kDeviceGather;
            if (tx) {
                auto ready = slot_ready(ch, op);
                if (!ready.ok()) return failed(ready.status());
                if (!*ready) break;  // the copy into the slot is still running
                if (stage_times_ && op.ready_ns == 0) op.ready_ns = engine::stage_clock_ns();
            } else {
                auto made = twin     ? ensure_gather_twin(p, ch, tx, op)
                            : gather ? ensure_gather_ring(p, ch, tx, op)
                                     : ensure_ring(p, ch, tx, op);
                if (!made.ok()) return failed(made.status());
                if (!*made) break;  // no room in the staging total yet
            }
            cuda::CopyRing& ring = ring_for(ch, op);
            // A devmem receive that the unpack takes straight into its pieces leaves the twin
            // untouched (the transport lands the bytes in its own pages): it holds one of the
            // ring's records, not chunk bytes of its buffer, so a channel keeps its whole window
            // of such receives posted, not only as many as the staging buffer holds. Its buffer
            // is the twin's landing area, which no slot uses, all such receives alike.
            // Once the plugin has been seen placing bytes in a receive's buffer itself
            // (note_placed_bytes), every such receive gets room of its own in the twin.
            const bool direct = !tx && twin && ch.dev_handle.type == net::DeviceType::kUnpack &&
                                !plugin_places_bytes_ && ring.unpacks_into(this->segments(op));
            if (direct) rx_hold = 0;
            if (!tx) {
                if (!ring.has_free(rx_hold)) break;
                rx_slot = ring.next();
            }
            const uint64_t at = tx       ? ring.offset(op.slot)
                                : direct ? ring.landing_offset()
                                         : ring.next_offset(op.len);
            ptr = twin ? ch.gtwin + at : ring.base() + at;
            mh = twin ? ch.gtwin_mr : gather ? ch.gring_mr : ch.ring_mr;
        } else if (segments) {
            // (no memory handle: the transport needs none for segment lists)
        } else if (op.path == OpPath::kGather) {
            if (!tx) {
                auto made = ensure_host_slots(p, ch, tx);
                if (!made.ok()) return failed(made.status());
                if (!*made || !ch.hslots->has_free(op.len)) break;
                rx_slot = ch.hslots->next();
            }
            ptr = tx ? ch.hslots->slot(op.slot) : ch.hslots->next_slot(op.len);
            mh = ch.hslots_mr;
        } else {
            if (op.region == nullptr) {
                // Draining a refused write or a cancelled read: one scratch receive at a time per
                // channel, so no two transport requests ever write the scratch buffer at once.
                if (ch.scratch_busy) break;
                if (!ch.scratch) {
                    // Held while the drain lasts, within a total for all peers: a stranger per
                    // connection sending refused writes held a chunk per channel for good
                    // (MAX_PEERS x 8 MiB at the defaults). Past it, the drain waits for another
                    // to end (or the peer's stall to fail it).
                    if (scratch_bytes_ + p.chunk > config_.max_scratch_bytes_total) break;
                    ch.scratch.reset(new uint8_t[p.chunk]);
                    ch.scratch_len = p.chunk;
                    scratch_bytes_ += p.chunk;
                }
                ptr = ch.scratch.get();
            }
            if (op.path == OpPath::kUnpack) {
                // Read the plugin's unpack queue before the first receive needs it (no staging).
                auto made = ensure_ring(p, ch, tx, op);
                if (!made.ok()) return failed(made.status());
            }
            auto mr = mr_for(ch, tx, op, p.chunk);
            if (!mr.ok()) {
                return failed(Status(mr.status()).with_context("registering memory"));
            }
            if (mr->later) break;  // no registration can be made yet
            mh = mr->mh;
            reg = mr->reg;
        }
        // Room in the list first: once the transport holds the request nothing may fail before
        // it is tracked (an untracked request would be closed without its grace, its buffers
        // released under it). Filled in below, or taken out again.
        const bool was_idle = ch.inflight.empty();
        ch.inflight.push_back(Channel::InFlight{op, nullptr, reg});
        net::Request* req = nullptr;
        Status st;
        try {
            if (segments) {
                st = tx ? net_->isendv(ch.send, io_segments(op), 0, &req)
                        : net_->irecvv(ch.recv, io_segments(op), 0, &req);
            } else if (tx) {
                st = net_->isend(ch.send, ptr, op.len, 0, mh, &req);
            } else {
                void* data = ptr;
                size_t size = op.len;
                int tag = 0;
                st = net_->irecv(ch.recv, 1, &data, &size, &tag, &mh, &req);
            }
        } catch (...) {
            ch.inflight.pop_back();  // nothing posted (the op is still queued)
            throw;
        }
        if (!st.ok() || req == nullptr) ch.inflight.pop_back();
        if (!st.ok()) return failed(st);
        if (req == nullptr) {  // the transport is full: later
            count(p, &Stats::retries);
            // Full with none of ours in it: a transport that never takes one again would leave
            // the chunk queued for good (the stall check below counts from here).
            if (ch.inflight.empty() && ch.finishing.empty() &&
                ch.refused_since == Clock::time_point{}) {
                ch.refused_since = Clock::now();
            }
            break;
        }
        ch.refused_since = {};
        // (where next_offset() said: nothing was taken in between)
        if (rx_slot >= 0) op.slot = slots_for(ch, op).acquire(rx_hold);
        if (stage_times_) op.posted_ns = engine::stage_clock_ns();
        if (op.region == nullptr) ch.scratch_busy = true;
        if (was_idle) ch.last_progress = Clock::now();
        ch.inflight.back() = Channel::InFlight{op, req, reg};
        ch.queued.pop_front();
        ch.staging_wait = false;  // (as in the staging loop above)
        if (tx) --ch.staged_ahead;
        did = true;
    }
    // Time with chunks waiting on a full window (a slow peer or wire), for the counters.
    const bool blocked = !ch.queued.empty() &&
                         ch.inflight.size() + ch.finishing.size() >= static_cast<size_t>(window_);
    if (blocked && ch.blocked_since == Clock::time_point{}) {
        ch.blocked_since = Clock::now();
    } else if (!blocked && ch.blocked_since != Clock::time_point{}) {
        const auto waited = Clock::now() - ch.blocked_since;
        count(p, &Stats::window_blocked_ns,
              static_cast<uint64_t>(
                  std::chrono::duration_cast<std::chrono::nanoseconds>(waited).count()));
        ch.blocked_since = Clock::time_point{};
    }
    return did;
}

Status Endpoint::Impl::start_finishing(Channel& ch, Channel::InFlight& f) {
    using engine::OpPath;
    switch (f.op.path) {
        case OpPath::kStaged:
            return ch.ring->copy_out(f.op.slot, f.op.ptr, f.op.len);
        case OpPath::kGather:
            // (received straight into the pieces when the transport took a segment list)
            if (f.op.slot >= 0) {
                copy_host_segments(f.op, ch.hslots->slot(f.op.slot), /*gather=*/false);
            }
            return Status();
        case OpPath::kStagedGather:
            return ch.gring->scatter(f.op.slot, segments(f.op));
        case OpPath::kDeviceGather: {
            if (ch.dev_handle.type == net::DeviceType::kUnpack) {
                // The plugin's pages go straight to the pieces: its entries composed with the
                // pieces' places, one kernel (the ring falls back to the twin when they don't
                // fit one list).
                TCPX_ASSIGN_OR_RETURN(const uint64_t placed,
                                      take_receive_description(ch, f, ch.gring->device()));
                // Bytes the plugin placed itself are in the twin, where the receive was posted:
                // through it (one posted straight into the pieces, with no room of its own in
                // it, cannot be: its peer fails, and later receives get room of their own).
                return ch.gring->unpack_scatter(f.op.slot, unpack_copy_.data(), unpack_copy_.size(),
                                                ch.unpack.bounce_buf, segments(f.op),
                                                /*through_twin=*/placed > 0);
            }
            return ch.gring->scatter(f.op.slot, segments(f.op), /*twin_only=*/true);
        }
        case OpPath::kUnpack: {
            // The plugin wrote the count when test() reported the receive: read it and the list
            // here, and hand them to the GPU in one copy.
            // (Bytes the plugin placed itself are where they belong: the receive was posted
            // with the destination.)
            TCPX_RETURN_IF_ERROR(take_receive_description(ch, f, ch.ring->device()).status());
            if (!ch.ring->has_free()) return internal_error("no unpack slot free in the window");
            f.op.slot = ch.ring->acquire();
            return ch.ring->unpack(f.op.slot, unpack_copy_.data(), unpack_copy_.size(),
                                   ch.unpack.bounce_buf, f.op.ptr, f.op.len);
        }
        default:
            return Status();
    }
}

StatusOr<uint64_t> Endpoint::Impl::take_receive_description(Channel& ch, const Channel::InFlight& f,
                                                            int gpu) {
    TCPX_ASSIGN_OR_RETURN(net::UnpackSlot q, net_->unpack_slot(ch.recv, f.req));
    TCPX_RETURN_IF_ERROR(check_unpack_slot(ch, q, gpu));
    TCPX_RETURN_IF_ERROR(snapshot_unpack(q, &unpack_copy_));
    uint64_t placed = 0;
    TCPX_RETURN_IF_ERROR(
        check_unpacked_bytes(unpack_copy_, f.op.len, ch.bounce_len, &unpack_scratch_, &placed));
    if (placed > 0) note_placed_bytes(placed);
    return placed;
}

void Endpoint::Impl::time_stages(Channel& ch, const Op& op, bool tx, uint64_t end_ns) {
    // In order by construction: refill() stamps every op it cuts (the only place ops are
    // made), the send loop stamps ready before it posts, and done is stamped as the request
    // leaves the transport.
    StageTimes& s = ch.stages;
    ++s.chunks;
    if (tx) {
        // Chunks that need no staging copy were ready when cut.
        const uint64_t ready = op.ready_ns != 0 ? op.ready_ns : op.queued_ns;
        s.staging += ready - op.queued_ns;
        s.waiting += op.posted_ns - ready;
        s.transport += end_ns - op.posted_ns;
    } else {
        s.waiting += op.posted_ns - op.queued_ns;
        s.transport += op.done_ns - op.posted_ns;
        s.finishing += end_ns - op.done_ns;
    }
}

void Endpoint::Impl::log_stage_times(const Peer& p) const {
    for (const bool tx : {true, false}) {
        StageTimes sum;
        for (const Channel& ch : tx ? p.tx : p.rx) sum += ch.stages;
        if (sum.chunks == 0) continue;
        TCPX_INFO(
            "endpoint '%s': peer '%s' %s: %llu chunks; per chunk %.1f us staging copy, %.1f us "
            "waiting to be posted, %.1f us in the transport, %.1f us finishing",
            name_.c_str(), printable(p.name).c_str(), tx ? "sent" : "received",
            static_cast<unsigned long long>(sum.chunks), per_chunk_us(sum.staging, sum.chunks),
            per_chunk_us(sum.waiting, sum.chunks), per_chunk_us(sum.transport, sum.chunks),
            per_chunk_us(sum.finishing, sum.chunks));
    }
}

std::span<const cuda::Seg> Endpoint::Impl::segments(const Op& op) {
    seg_buf_.clear();
    for (uint32_t i = op.first; i < op.end; ++i) {
        const Xfer::Piece& piece = op.xfer->pieces[i];
        if (piece.len == 0) continue;
        const bool gpu = piece.region->kind == MemKind::kCuda;
        seg_buf_.push_back(cuda::Seg{piece.region->base + piece.offset, piece.len,
                                     gpu ? piece.region->device : -1});
    }
    return seg_buf_;
}

std::span<const net::IoSeg> Endpoint::Impl::io_segments(const Op& op) {
    ioseg_buf_.clear();
    for (uint32_t i = op.first; i < op.end; ++i) {
        const Xfer::Piece& piece = op.xfer->pieces[i];
        if (piece.len > 0) {
            ioseg_buf_.push_back(net::IoSeg{piece.region->base + piece.offset, piece.len});
        }
    }
    return ioseg_buf_;
}

void Endpoint::Impl::copy_host_segments(const Op& op, uint8_t* slot, bool gather) {
    uint64_t at = 0;
    for (uint32_t i = op.first; i < op.end; ++i) {
        const Xfer::Piece& piece = op.xfer->pieces[i];
        uint8_t* mem = piece.region->base + piece.offset;
        if (gather) {
            std::memcpy(slot + at, mem, piece.len);
        } else {
            std::memcpy(mem, slot + at, piece.len);
        }
        at += piece.len;
    }
}

StatusOr<bool> Endpoint::Impl::ensure_host_slots(Peer& p, Channel& ch, bool tx) {
    if (ch.hslots) return !staging_yields(ch);
    if (!take_staging(p, ch, tx, engine::StagingPart::kHost, staging_ring_bytes())) return false;
    void* comm = tx ? static_cast<void*>(ch.send) : static_cast<void*>(ch.recv);
    auto slots = std::make_unique<engine::HostSlots>(chunk_, staging_slots_);
    TCPX_RETURN_IF_ERROR(
        net_->reg_mr(comm, slots->mem.get(), slots->bytes(), net::MemType::kHost, &ch.hslots_mr)
            .with_context("registering the host staging slots"));
    ch.hslots = std::move(slots);
    return true;
}

void Endpoint::Impl::release_scratch(Channel& ch, bool tx) {
    if (!ch.scratch || ch.scratch_busy) return;
    for (const Op& op : ch.queued) {
        if (op.region == nullptr) return;  // the drain goes on: kept for its next chunk
    }
    void* comm = tx ? static_cast<void*>(ch.send) : static_cast<void*>(ch.recv);
    if (ch.scratch_mr != nullptr && comm != nullptr) (void)net_->dereg_mr(comm, ch.scratch_mr);
    ch.scratch_mr = nullptr;
    ch.scratch_registered = false;
    free_scratch(ch);
}

void Endpoint::Impl::free_scratch(Channel& ch) {
    scratch_bytes_ -= ch.scratch_len;
    ch.scratch.reset();
    ch.scratch_len = 0;
}

void Endpoint::Impl::note_placed_bytes(uint64_t bytes) {
    if (plugin_places_bytes_) return;
    plugin_places_bytes_ = true;
    TCPX_WARN(
        "endpoint '%s': the transport placed %llu bytes of a GPU receive in the receive's buffer "
        "itself (data the NIC left in host memory: a packet not split, or a flow not steered "
        "to the GPU's queues); from now on every receive of a chunk of several GPU pieces gets "
        "room of its own in the gather buffer for such bytes (fewer of them are posted at once)",
        name_.c_str(), static_cast<unsigned long long>(bytes));
}

StatusOr<bool> Endpoint::Impl::ensure_gather_twin(Peer& p, Channel& ch, bool tx, const Op& op) {
    using engine::OpPath;
    if (ch.gtwin != nullptr) return !staging_yields(ch);  // (registered: its handle may be null)
    if (!tx && ch.dev_handle.type == net::DeviceType::kUnpack) {
        Op probe = op;  // reads the plugin's unpack queue (and checks its GPU); takes no staging
        probe.path = OpPath::kUnpack;
        TCPX_ASSIGN_OR_RETURN(const bool made, ensure_ring(p, ch, tx, probe));
        if (!made) return false;
    }
    // (The ring's staging counts its twin already.)
    TCPX_ASSIGN_OR_RETURN(const bool made, ensure_gather_ring(p, ch, tx, op));
    if (!made) return false;
    TCPX_ASSIGN_OR_RETURN(uint8_t * twin, ch.gring->twin());
    void* comm = tx ? static_cast<void*>(ch.send) : static_cast<void*>(ch.recv);
    // A GPU registration: at the descriptor budget as mr_for's (an idle one makes way, or the
    // chunk waits for one).
    if (props_.gpu_regs_counted) {
        auto room = room_for_registration(ch);
        if (!room.ok())
            return Status(room.status()).with_context("registering the GPU gather buffer");
        if (!*room) return false;
    }
    const cuda::ScopedGpu gpu(ch.gring->device());  // (mr_for: Google's regMr)
    TCPX_RETURN_IF_ERROR(Status(gpu.status()).with_context("registering the GPU gather buffer"));
    Status st = net_->reg_mr(comm, twin, ch.gring->twin_bytes(), net::MemType::kCuda, &ch.gtwin_mr);
    if (!st.ok()) {
        ch.gtwin_mr = nullptr;
        if (props_.gpu_regs_counted && st.code() == StatusCode::kResourceExhausted) {
            auto room = room_for_registration(ch, /*refused=*/true);
            if (!room.ok())
                return Status(room.status()).with_context("registering the GPU gather buffer");
            return false;
        }
        return st.with_context("registering the GPU gather buffer");
    }
    ch.reg_wait_since = {};
    ch.gtwin = twin;
    return true;
}

Status Endpoint::Impl::check_gather_path(const Op& op) const {
    // Checked for every such chunk, not only the first: the ring may have been made for chunks
    // of GPU pieces only (kDeviceGather), with its pinned buffer left unregistered.
    const bool takes_host = (props_.ptr_support & static_cast<int>(net::MemType::kHost)) != 0;
    if (op.path == engine::OpPath::kStagedGather && !takes_host) {
        return unimplemented(
            "chunks of several pieces mixing host and GPU memory are staged through host memory, "
            "which this transport does not take");
    }
    return Status();
}

StatusOr<bool> Endpoint::Impl::ensure_gather_ring(Peer& p, Channel& ch, bool tx, const Op& op) {
    TCPX_RETURN_IF_ERROR(check_gather_path(op));
    if (ch.gring) return !staging_yields(ch);
    // With its twin counted, taken together: over CUDA a gather of several pieces on the ring's
    // GPU goes through the twin (one kernel, then one copy), which the ring makes on first need,
    // and the twin is what a transport taking GPU memory sends from (ensure_gather_twin). (A
    // channel holding the ring while it waited for the twin could wait for good, each of two such
    // channels for the other's.)
    RingWant want{gather_device(op), /*twin=*/true};
    if (!take_staging(p, ch, tx, engine::StagingPart::kGather,
                      staging_ring_bytes() + staging_twin_bytes(), &want)) {
        return false;
    }
    if (want.ring) {
        ch.gring = std::move(want.ring);
    } else {
        TCPX_ASSIGN_OR_RETURN(
            ch.gring, cuda::device().make_ring(want.device, chunk_, staging_slots_,
                                               staging_slots_ * engine::kStagingRecordsPerSlot));
    }
    TCPX_RETURN_IF_ERROR(register_gather_ring(ch, tx));
    return true;
}

int Endpoint::Impl::gather_device(const Op& op) const {
    // On the GPU of the chunk's first GPU piece (others are copied piece by piece).
    for (uint32_t i = op.first; i < op.end; ++i) {
        const Xfer::Piece& piece = op.xfer->pieces[i];
        if (piece.len > 0 && piece.region->kind == MemKind::kCuda) return piece.region->device;
    }
    return 0;
}

Status Endpoint::Impl::register_gather_ring(Channel& ch, bool tx) {
    const bool takes_host = (props_.ptr_support & static_cast<int>(net::MemType::kHost)) != 0;
    if (!takes_host) return Status();
    void* comm = tx ? static_cast<void*>(ch.send) : static_cast<void*>(ch.recv);
    TCPX_RETURN_IF_ERROR(
        net_->reg_mr(comm, ch.gring->base(), ch.gring->bytes(), net::MemType::kHost, &ch.gring_mr)
            .with_context("registering the gather slots"));
    // Received chunks are scattered into their GPU pieces next.
    if (!tx) return net_->hint_device_reads(comm, ch.gring_mr).with_context("gather slots");
    return Status();
}

cuda::CopyRing& Endpoint::Impl::ring_for(Channel& ch, const Op& op) {
    using engine::OpPath;
    const bool gather = op.path == OpPath::kStagedGather || op.path == OpPath::kDeviceGather;
    return gather ? *ch.gring : *ch.ring;
}

SlotFifo& Endpoint::Impl::slots_for(Channel& ch, const Op& op) {
    if (op.path == engine::OpPath::kGather) return *ch.hslots;
    return ring_for(ch, op);
}

StatusOr<bool> Endpoint::Impl::slot_ready(Channel& ch, const Op& op) {
    if (op.path == engine::OpPath::kGather) return true;  // copied by the CPU
    return ring_for(ch, op).ready(op.slot);
}

StatusOr<bool> Endpoint::Impl::ensure_ring(Peer& p, Channel& ch, bool tx, const Op& op) {
    using engine::OpPath;
    const int device = op.region->device;
    if (ch.ring) {
        if (op.path == OpPath::kUnpack && ch.ring->device() != device) {
            return failed_precondition(strformat(
                "a receive into GPU %d on a channel whose receives land on GPU %d: register "
                "memory of the GPU the endpoint serves",
                device, ch.ring->device()));
        }
        // (an UNPACK comm's ring holds no staging)
        return ch.held.ring == 0 || !staging_yields(ch);
    }
    void* comm = tx ? static_cast<void*>(ch.send) : static_cast<void*>(ch.recv);
    if (op.path == OpPath::kStaged) {
        RingWant want{device, /*twin=*/false};
        if (!take_staging(p, ch, tx, engine::StagingPart::kRing, staging_ring_bytes(), &want)) {
            return false;
        }
        if (want.ring) {
            ch.ring = std::move(want.ring);
        } else {
            TCPX_ASSIGN_OR_RETURN(
                ch.ring, cuda::device().make_ring(device, chunk_, staging_slots_,
                                                  staging_slots_ * engine::kStagingRecordsPerSlot));
        }
        // (A failure fails the peer: its teardown frees the ring, off the lock.)
        TCPX_RETURN_IF_ERROR(
            net_->reg_mr(comm, ch.ring->base(), ch.ring->bytes(), net::MemType::kHost, &ch.ring_mr)
                .with_context("registering the staging slots"));
        // Received chunks are copied into the GPU next.
        if (!tx) {
            TCPX_RETURN_IF_ERROR(
                net_->hint_device_reads(comm, ch.ring_mr).with_context("staging slots"));
        }
        return true;
    }
    // UNPACK: the device handle points to the plugin's unpack queue descriptor, in GPU memory.
    const net::DeviceHandle& h = ch.dev_handle;
    if (h.version != cuda::kUnpackVersion || h.handle == nullptr ||
        h.size < sizeof(cuda::UnpackHandle)) {
        return unimplemented(strformat(
            "the transport hands CUDA receives over as UNPACK version %d (handle %p, %zu bytes); "
            "tcpx-p2p reads version %d",
            h.version, h.handle, h.size, cuda::kUnpackVersion));
    }
    // On the GPU, as the plugin says (a copy from whatever else it pointed at would read host
    // memory CUDA does not know: a crash). The emulation's are host memory.
    const bool host_only = cuda::device().host_only();
    TCPX_ASSIGN_OR_RETURN(const cuda::PointerInfo handle_at,
                          cuda::classify(h.handle, sizeof(cuda::UnpackHandle)));
    if (handle_at.kind != MemKind::kCuda && !host_only) {
        return protocol_error(strformat(
            "the transport's unpack handle %p is not GPU memory (the plugin's device handle)",
            h.handle));
    }
    TCPX_RETURN_IF_ERROR(
        cuda::device().copy(device, &ch.unpack, h.handle, sizeof(cuda::UnpackHandle)));
    if (ch.unpack.meta == nullptr || ch.unpack.bounce_buf == nullptr) {
        return protocol_error("the transport's unpack queue has no metadata or bounce buffer");
    }
    TCPX_ASSIGN_OR_RETURN(const cuda::PointerInfo bounce, cuda::classify(ch.unpack.bounce_buf, 1));
    if (bounce.kind != MemKind::kCuda && !host_only) {
        // (the unpack kernel would read it: an illegal address ends every CUDA call)
        return protocol_error(strformat("the transport's bounce buffer %p is not GPU memory",
                                        static_cast<const void*>(ch.unpack.bounce_buf)));
    }
    if (bounce.kind == MemKind::kCuda && bounce.device != device) {
        return failed_precondition(strformat(
            "receives land on GPU %d but the registration is on GPU %d: set GPU_INDEX to the "
            "GPU whose memory the endpoint moves",
            bounce.device, device));
    }
    // Every entry's page is checked against it (check_unpacked_bytes): a plugin's garbage
    // offset would have the kernel read past the pool (a fault that ends every CUDA call of the
    // process) or someone else's memory.
    constexpr uint64_t kReach = (uint64_t{1} << 32) + cuda::kUnpackPageSize;
    ch.bounce_len = bounce.kind == MemKind::kCuda
                        ? cuda::device().mapped_bytes(ch.unpack.bounce_buf, kReach)
                        : kReach;
    TCPX_ASSIGN_OR_RETURN(ch.ring, cuda::device().make_ring(device, 0, window_));
    return true;
}

uint64_t Endpoint::Impl::staging_ring_bytes() const {
    return chunk_ * static_cast<uint64_t>(staging_slots_);
}

uint64_t Endpoint::Impl::staging_twin_bytes() const {
    // (CopyRing::twin_bytes: the slots and one slot's landing area, each in whole pages; CUDA's
    // ring allocates a page more to start it on one)
    const auto pages = [](uint64_t n) { return (n + 4095) & ~uint64_t{4095}; };
    return pages(staging_ring_bytes()) + pages(chunk_) + 4096;
}

bool Endpoint::Impl::take_staging(Peer& p, Channel& ch, bool tx, engine::StagingPart part,
                                  uint64_t bytes, RingWant* want) {
    using engine::StagingPart;
    // A send's staging leaves room for a receive's: with both ends of a pair bounded, sends
    // holding all of each end's staging, each waiting for the other end's receives, which
    // wait for staging, would wait for each other until the channels' stall timeout.
    const uint64_t reserve = tx ? staging_ring_bytes() + staging_twin_bytes() : 0;
    const uint64_t limit = config_.max_staging_bytes_total;  // (at least twice the reserve)
    const uint64_t need = bytes + reserve;
    const auto now = Clock::now();
    const auto taken = [&](uint64_t more) {
        ch.staging_wait = false;
        ch.held_since = now;
        staging_bytes_ += more;
        staging_peak_ = std::max(staging_peak_, staging_in_use());
        return true;
    };
    // While chunks wait, the one that has waited longest takes first (one that came later
    // waits behind it even where its own need would fit: a large need is not passed over for
    // good).
    const Clock::time_point since = ch.staging_wait ? ch.staging_wait_since : now;
    const bool behind = oldest_wait_prev_ != Clock::time_point::max() && since > oldest_wait_prev_;
    if (!behind && want != nullptr && take_pooled(ch, part, want)) return taken(0);
    // What channels and the pool hold: what the reaper frees is on its way out already, and
    // freeing more for it would empty channels for nothing.
    const auto short_of_room = [&] { return staging_bytes_ + need > limit; };
    if (!behind && short_of_room()) {
        drop_pooled(need);  // (none of them does for this need)
        if (short_of_room() && staging_scan_pass_ != passes_) {
            // Staging no request uses, wherever it is: the channels of a peer that moved data
            // once keep theirs while there is room, and give it up when another needs it. A
            // look visits every channel, so at most one a pass (a waiting chunk asks again each
            // pass). A peer whose channel holds staging and has moved nothing for half the peer
            // timeout (a receive its sender never fills, a send never taken) is failed: left,
            // it would hold the staging for the whole timeout, and the waiting chunks'
            // senders, whose own sends wait meanwhile, could time out first.
            staging_scan_pass_ = passes_;
            const auto stalled = std::chrono::milliseconds(config_.peer_timeout_ms) / 2;
            for (auto& [id, q] : peers_) {
                if (q->state != Peer::State::kReady) continue;
                for (bool qtx : {true, false}) {
                    for (Channel& c : qtx ? q->tx : q->rx) {
                        if (&c == &ch || c.held.total() == 0) continue;
                        for (StagingPart any :
                             {StagingPart::kRing, StagingPart::kGather, StagingPart::kHost}) {
                            free_unused_staging(c, qtx, any);
                        }
                        if (c.held.total() > 0 && q->evict.ok() &&
                            (!c.inflight.empty() || !c.finishing.empty()) &&
                            now - c.last_progress > stalled) {
                            q->evict = timeout_error(strformat(
                                "a data channel %s holding staging memory others wait for "
                                "(TCPX_P2P_MAX_STAGING_BYTES_TOTAL) made no progress for %lld ms",
                                qtx ? "send" : "receive",
                                static_cast<long long>(config_.peer_timeout_ms / 2)));
                        }
                    }
                }
            }
        }
        // The channel's own other parts last (a channel whose chunks switch paths, alone under
        // the bound, would otherwise wait for itself).
        for (StagingPart other : {StagingPart::kRing, StagingPart::kGather, StagingPart::kHost}) {
            if (other != part) free_unused_staging(ch, tx, other);
        }
        if (want != nullptr && take_pooled(ch, part, want)) return taken(0);
        drop_pooled(need);
    }
    if (behind || staging_in_use() + need > limit) {
        if (!ch.staging_wait) {
            ch.staging_wait = true;
            ch.staging_wait_since = now;
            count(p, &Stats::staging_waits);
            if (!staging_warned_) {
                staging_warned_ = true;
                TCPX_WARN(
                    "endpoint '%s': staging memory at its bound (TCPX_P2P_MAX_STAGING_BYTES_TOTAL, "
                    "%s): chunks wait for staging other channels free once no request uses it "
                    "(said once; Stats::staging_waits counts them)",
                    name_.c_str(), format_bytes(limit).c_str());
            }
        }
        oldest_wait_cur_ = std::min(oldest_wait_cur_, ch.staging_wait_since);
        return false;
    }
    switch (part) {
        case StagingPart::kRing:
            ch.held.ring += bytes;
            break;
        case StagingPart::kGather:
            ch.held.gather += bytes;
            break;
        case StagingPart::kHost:
            ch.held.host += bytes;
            break;
    }
    return taken(bytes);
}

bool Endpoint::Impl::take_pooled(Channel& ch, engine::StagingPart part, RingWant* want) {
    for (size_t i = 0; i < staging_pool_.size(); ++i) {
        PooledRing& e = staging_pool_[i];
        const bool has_twin = e.bytes > e.ring->bytes();
        if (e.ring->device() != want->device || (want->twin && !has_twin)) continue;
        want->ring = std::move(e.ring);
        (part == engine::StagingPart::kRing ? ch.held.ring : ch.held.gather) += e.bytes;
        staging_pool_.erase(staging_pool_.begin() + static_cast<std::ptrdiff_t>(i));
        staging_pool_changed_ = Clock::now();
        return true;
    }
    return false;
}

void Endpoint::Impl::drop_pooled(uint64_t bytes) {
    const uint64_t limit = config_.max_staging_bytes_total;
    while (!staging_pool_.empty() && (bytes == ~uint64_t{0} || staging_bytes_ + bytes > limit)) {
        PooledRing& e = staging_pool_.back();
        staging_bytes_ -= e.bytes;
        reaper_.put(std::move(e.ring), e.bytes);  // (counted until freed)
        staging_pool_.pop_back();
        staging_pool_changed_ = Clock::now();
    }
}

bool Endpoint::Impl::staging_yields(const Channel& ch) const {
    if (oldest_wait_prev_ == Clock::time_point::max()) return false;  // (no clock read per chunk)
    const auto now = Clock::now();
    return now - oldest_wait_prev_ > engine::kStagingQuantum &&
           now - ch.held_since > engine::kStagingQuantum;
}

uint64_t Endpoint::Impl::free_unused_staging(Channel& ch, bool tx, engine::StagingPart part) {
    using engine::StagingPart;
    void* comm = tx ? static_cast<void*>(ch.send) : static_cast<void*>(ch.recv);
    if (comm == nullptr) return 0;
    // Every request that uses a part's memory holds one of its slots (a receive the unpack takes
    // straight into its pieces, a record of the gather ring), from its staging copy or its
    // posting until its bytes are sent or landed: none held and the GPU work done, nothing of
    // ours or the transport's touches it.
    const auto unused = [](cuda::CopyRing& r) { return r.in_use() == 0 && r.idle(); };
    uint64_t freed = 0;
    switch (part) {
        case StagingPart::kRing:
            // (a ring of an UNPACK comm holds no staging: never given up here)
            if (!ch.ring || ch.held.ring == 0 || !unused(*ch.ring)) return 0;
            if (ch.ring_mr != nullptr) (void)net_->dereg_mr(comm, ch.ring_mr);
            ch.ring_mr = nullptr;
            freed = ch.held.ring;
            staging_pool_.reserve(staging_pool_.size() + 1);  // (the ring stays ours if it throws)
            staging_pool_.push_back(PooledRing{std::move(ch.ring), freed});
            ch.held.ring = 0;
            break;
        case StagingPart::kGather:
            if (!ch.gring || ch.held.gather == 0 || !unused(*ch.gring)) return 0;
            if (ch.gring_mr != nullptr) (void)net_->dereg_mr(comm, ch.gring_mr);
            if (ch.gtwin_mr != nullptr) (void)net_->dereg_mr(comm, ch.gtwin_mr);
            ch.gring_mr = nullptr;
            ch.gtwin_mr = nullptr;
            ch.gtwin = nullptr;
            freed = ch.held.gather;
            staging_pool_.reserve(staging_pool_.size() + 1);
            staging_pool_.push_back(PooledRing{std::move(ch.gring), freed});
            ch.held.gather = 0;
            break;
        case StagingPart::kHost:
            if (!ch.hslots || ch.hslots->in_use() != 0) return 0;
            if (ch.hslots_mr != nullptr) (void)net_->dereg_mr(comm, ch.hslots_mr);
            ch.hslots_mr = nullptr;
            ch.hslots.reset();
            freed = ch.held.host;
            ch.held.host = 0;
            staging_bytes_ -= freed;  // (freed now; rings stay counted in the pool)
            break;
    }
    if (part != StagingPart::kHost) staging_pool_changed_ = Clock::now();
    return freed;
}

StatusOr<Endpoint::Impl::MrPick> Endpoint::Impl::mr_for(Channel& ch, bool tx, const Op& op,
                                                        uint64_t scratch_len) {
    using engine::OpPath;
    void* comm = tx ? static_cast<void*>(ch.send) : static_cast<void*>(ch.recv);
    if (op.region == nullptr) {
        if (!ch.scratch_registered) {
            TCPX_RETURN_IF_ERROR(net_->reg_mr(comm, ch.scratch.get(), scratch_len,
                                              net::MemType::kHost, &ch.scratch_mr));
            ch.scratch_registered = true;
        }
        return MrPick{ch.scratch_mr};
    }
    // A region larger than the transport registers at once is registered in windows, each on
    // first use; the one chosen holds all of this request's bytes, so the handle covers them.
    const bool page_cover = op.path == OpPath::kDevice || op.path == OpPath::kUnpack;
    TCPX_ASSIGN_OR_RETURN(
        const engine::RegWindows windows,
        engine::RegWindows::make(reinterpret_cast<uintptr_t>(op.region->base), op.region->len,
                                 props_.max_reg_size, chunk_, page_cover));
    TCPX_ASSIGN_OR_RETURN(const size_t index,
                          windows.find(reinterpret_cast<uintptr_t>(op.ptr), op.len));
    {
        auto found = ch.mrs.find(op.region);
        if (found != ch.mrs.end()) {
            auto it = found->second.find(index);
            if (it != found->second.end()) {
                it->second.used = ++mr_uses_;
                return MrPick{it->second.mh, &it->second};
            }
        }
    }
    // Google's TCPX registers GPU memory by whole 4 KiB pages from an aligned pointer: GPU windows
    // are cut from the page-aligned cover of the region (inside the same allocation, whose
    // granularity is coarser). Only the region's own bytes are ever sent or received.
    const engine::RegWindows::Window w = windows.window(index);
    const net::MemType type = page_cover ? net::MemType::kCuda : net::MemType::kHost;
    net::MemHandle* mh = nullptr;
    // A GPU registration of a transport whose each holds a descriptor takes a place in the
    // process's budget of them (the transport's reg_mr refuses it past the budget): at the
    // budget, one no request uses goes first (before this one's place below is made: giving
    // up may empty and erase any region's list). With none to give up (all ours in use, or
    // the budget held by sockets and other endpoints) the op waits (room_for_registration).
    const bool counted = props_.gpu_regs_counted && type == net::MemType::kCuda;
    if (counted) {
        TCPX_ASSIGN_OR_RETURN(const bool room, room_for_registration(ch));
        if (!room) return MrPick{nullptr, nullptr, /*later=*/true};
    }
    // Google's regMr takes the GPU of the memory from the caller's current one (cudaGetDevice):
    // the memory's, for this call (the progress thread's may be any).
    std::optional<cuda::ScopedGpu> gpu;
    if (type == net::MemType::kCuda) {
        gpu.emplace(op.region->device);
        TCPX_RETURN_IF_ERROR(Status(gpu->status()).with_context("registering GPU memory"));
    }
    // Its place first: once the transport holds a registration nothing may fail before it is
    // recorded (unrecorded, it would never be deregistered: with Google's plugin a dma-buf fd).
    auto& by_window = ch.mrs[op.region];
    auto it = by_window.emplace(index, Channel::Mr{}).first;
    Status st;
    try {
        st = net_->reg_mr(comm, reinterpret_cast<void*>(w.base), w.len, type, &mh);
    } catch (...) {
        by_window.erase(it);  // (no empty handle left to be found)
        if (by_window.empty()) ch.mrs.erase(op.region);
        throw;
    }
    if (!st.ok()) {
        by_window.erase(it);
        if (by_window.empty()) ch.mrs.erase(op.region);
        if (counted && st.code() == StatusCode::kResourceExhausted) {
            // (the places went meanwhile: other endpoints' sockets or registrations)
            TCPX_RETURN_IF_ERROR(room_for_registration(ch, /*refused=*/true).status());
            return MrPick{nullptr, nullptr, /*later=*/true};
        }
        return st;
    }
    it->second = Channel::Mr{mh, ++mr_uses_, counted};
    ch.reg_wait_since = {};
    return MrPick{mh, &it->second};
}

StatusOr<bool> Endpoint::Impl::room_for_registration(Channel& ch, bool refused) {
    bool ours_in_use = false;
    if (!refused) {
        if (!socket_budget_full()) return true;
        if (give_up_idle_registrations(1, &ours_in_use) > 0 || !socket_budget_full()) return true;
    } else {
        (void)give_up_idle_registrations(0, &ours_in_use);  // (only asks)
    }
    // Ours in use are free once their requests end (or their peers fail, stalled). With none,
    // the places are other endpoints' or sockets: they may go too (a pair of endpoints in one
    // process, one's sends waiting for the other's receives), but not for sure: the wait ends
    // after half the peer timeout.
    const auto now = Clock::now();
    if (ours_in_use) {
        ch.reg_wait_since = {};
        return false;
    }
    if (ch.reg_wait_since == Clock::time_point{}) ch.reg_wait_since = now;
    const auto most = std::chrono::milliseconds(config_.peer_timeout_ms) / 2;
    if (now - ch.reg_wait_since <= most) return false;
    // The budget's own words (a place may have come free just now: then the next pass has it).
    Status none = take_registration_place("registering GPU memory");
    if (none.ok()) {
        give_back_registration_place();
        return false;
    }
    ch.reg_wait_since = {};
    return none.with_context(
        strformat("no GPU registration of this endpoint could make way for %lld ms (none in use "
                  "here)",
                  static_cast<long long>(most.count())));
}

size_t Endpoint::Impl::give_up_idle_registrations(size_t want, bool* in_use) {
    struct Idle {
        uint64_t used;
        Channel* ch;
        bool tx;
        Region* region;
        size_t index;
    };
    std::vector<Idle> idle;
    bool busy = false;
    for (auto& [id, p] : peers_) {
        for (bool tx : {true, false}) {
            for (Channel& ch : tx ? p->tx : p->rx) {
                void* comm = tx ? static_cast<void*>(ch.send) : static_cast<void*>(ch.recv);
                if (comm == nullptr) continue;
                for (auto& [region, by_window] : ch.mrs) {
                    for (auto& [index, mr] : by_window) {
                        if (!mr.counted) continue;
                        // In use while a request posted with it is in the transport or
                        // finishing (a receive is handed back to the transport only then).
                        // (a pointer: clang before 16 takes no structured binding into a lambda)
                        const Channel::Mr* entry = &mr;
                        auto uses = [entry](const Channel::InFlight& f) { return f.reg == entry; };
                        if (std::any_of(ch.inflight.begin(), ch.inflight.end(), uses) ||
                            std::any_of(ch.finishing.begin(), ch.finishing.end(), uses)) {
                            busy = true;
                            continue;
                        }
                        if (want > 0) idle.push_back(Idle{mr.used, &ch, tx, region, index});
                    }
                }
            }
        }
    }
    if (in_use != nullptr) *in_use = busy;
    const size_t n = std::min(want, idle.size());
    std::partial_sort(idle.begin(), idle.begin() + static_cast<ptrdiff_t>(n), idle.end(),
                      [](const Idle& a, const Idle& b) { return a.used < b.used; });
    for (size_t i = 0; i < n; ++i) {
        const Idle& v = idle[i];
        Channel& ch = *v.ch;
        void* comm = v.tx ? static_cast<void*>(ch.send) : static_cast<void*>(ch.recv);
        auto region_it = ch.mrs.find(v.region);
        auto it = region_it->second.find(v.index);
        (void)net_->dereg_mr(comm, it->second.mh);
        region_it->second.erase(it);
        if (region_it->second.empty()) ch.mrs.erase(region_it);
    }
    if (n > 0) {
        TCPX_DEBUG("endpoint '%s': %zu GPU registrations no request used given up (%s)",
                   name_.c_str(), n, "the process's descriptor budget, MAX_SOCKETS, is full");
    }
    return n;
}

void Endpoint::Impl::drop_mrs(Channel& ch, bool tx, bool after_close) {
    void* comm = after_close ? nullptr
                 : tx        ? static_cast<void*>(ch.send)
                             : static_cast<void*>(ch.recv);
    if (comm == nullptr && !after_close) return;
    for (auto& [region, by_window] : ch.mrs) {
        for (auto& [index, mr] : by_window) (void)net_->dereg_mr(comm, mr.mh);
    }
    ch.mrs.clear();
    if (ch.scratch_mr != nullptr) (void)net_->dereg_mr(comm, ch.scratch_mr);
    ch.scratch_mr = nullptr;
    ch.scratch_registered = false;
    if (ch.ring_mr != nullptr) (void)net_->dereg_mr(comm, ch.ring_mr);
    ch.ring_mr = nullptr;
    if (ch.hslots_mr != nullptr) (void)net_->dereg_mr(comm, ch.hslots_mr);
    ch.hslots_mr = nullptr;
    if (ch.gring_mr != nullptr) (void)net_->dereg_mr(comm, ch.gring_mr);
    ch.gring_mr = nullptr;
    if (ch.gtwin_mr != nullptr) (void)net_->dereg_mr(comm, ch.gtwin_mr);
    ch.gtwin_mr = nullptr;
}

// A region is being freed: no request uses it any more (its transfers held references), so its
// registrations with every comm can go.
void Endpoint::Impl::forget_region(Region* r) {
    for (auto& [id, p] : peers_) {
        for (bool tx : {true, false}) {
            for (Channel& ch : tx ? p->tx : p->rx) {
                auto it = ch.mrs.find(r);
                if (it == ch.mrs.end()) continue;
                void* comm = tx ? static_cast<void*>(ch.send) : static_cast<void*>(ch.recv);
                if (comm != nullptr) {
                    for (auto& [index, mr] : it->second) (void)net_->dereg_mr(comm, mr.mh);
                }
                ch.mrs.erase(it);
            }
        }
    }
}

}  // namespace tcpx
