#include "bench/engine/common.h"

#include <algorithm>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "bench/harness/measure.h"
#include "bench/harness/roles.h"
#include "common/status_util.h"
#include "common/strings.h"

namespace tcpx::bench::engine_bench {

const char* op_name(Op op) { return op == Op::kWrite ? "WRITE" : "READ"; }

Stats sum_stats(const std::vector<std::unique_ptr<Endpoint>>& eps) {
    Stats total;
    for (const auto& ep : eps) {
        const Stats s = ep->stats();
        for (auto f : kStatFields) total.*f += s.*f;
    }
    return total;
}

std::string stats_line(const Stats& s) {
    std::string out = "stats";
    for (auto f : kStatFields) out += " " + std::to_string(s.*f);
    return out;
}

StatusOr<Stats> parse_stats_line(const std::string& line) {
    const auto w = words(line);
    if (w.size() != 1 + std::size(kStatFields) || w[0] != "stats") {
        return protocol_error("peer: expected \"stats\" and " +
                              std::to_string(std::size(kStatFields)) +
                              " numbers, got: " + line.substr(0, 200));
    }
    Stats s;
    for (size_t i = 0; i < std::size(kStatFields); ++i) {
        const std::string& v = w[i + 1];
        if (!parse_uint(v, UINT64_MAX, &(s.*kStatFields[i]))) {
            return protocol_error("peer: a counter that is not a number: " + v.substr(0, 40));
        }
    }
    return s;
}

StatusOr<Config> bench_config(const EngineBenchOptions& o, Side side) {
    TCPX_ASSIGN_OR_RETURN(Config c, Config::from_env());
    if (o.mem == MemType::kVram && o.gpus.size() == 2) c.gpu_index = o.gpus[side];
    TCPX_RETURN_IF_ERROR(c.set("SOCKET_IFNAME", o.interface).with_context("--interface"));
    if (!o.channels.empty()) TCPX_RETURN_IF_ERROR(c.set("CHANNELS", o.channels));
    if (!o.nsocks.empty()) TCPX_RETURN_IF_ERROR(c.set("NSOCKS", o.nsocks));
    if (!o.chunk.empty()) TCPX_RETURN_IF_ERROR(c.set("XFER_CHUNK_SIZE", o.chunk));
    if (!o.window.empty()) TCPX_RETURN_IF_ERROR(c.set("WINDOW", o.window));
    if (!o.progress_thread.empty()) {
        TCPX_RETURN_IF_ERROR(
            c.set("PROGRESS_THREAD", o.progress_thread).with_context("--progress-thread"));
    }
    TCPX_RETURN_IF_ERROR(c.validate());
    return c.effective();  // what runs, so that the header and the raw baseline match it
}

int io_threads_per_endpoint(const Config& c) {
    if (c.socket_io == "caller") return 0;
    if (c.io_threads > 0) return static_cast<int>(c.io_threads);
    return static_cast<int>(std::clamp(std::thread::hardware_concurrency(), 1U, 16U));
}

bool parse_mem(const std::string& word, MemType* type) {
    if (word != "host" && word != "vram") return false;
    *type = word == "vram" ? MemType::kVram : MemType::kHost;
    return true;
}

std::vector<MemType> mem_types(const EngineBenchOptions& o) {
    std::vector<MemType> out = {o.mem};
    if (o.mem != MemType::kHost && (o.baseline || o.host_baseline)) out.push_back(MemType::kHost);
    return out;
}

Status ensure_region(Endpoint* ep, Region* r, MemType type, int gpu, uint64_t len) {
    if (r->buf.size() >= len) return Status();
    if (r->mem != 0) {
        TCPX_RETURN_IF_ERROR(ep->dereg(r->mem).with_context("deregistering"));
        r->mem = 0;
    }
    r->buf = Buffer();
    TCPX_ASSIGN_OR_RETURN(r->buf, Buffer::allocate(type, gpu, len, 0x5a));
    TCPX_ASSIGN_OR_RETURN(r->mem, ep->reg(r->buf.data(), len));
    return Status();
}

StatusOr<XferId> post_lane(const Lane& lane, const Shape& s, int slot, std::vector<IoVec>* iov) {
    const uint64_t base = static_cast<uint64_t>(slot) * s.slot_bytes();
    if (s.batch == 1) {
        return s.op == Op::kWrite
                   ? lane.ep->write(lane.peer, lane.local, base, lane.remote, base, s.size)
                   : lane.ep->read(lane.peer, lane.local, base, lane.remote, base, s.size);
    }
    iov->resize(static_cast<size_t>(s.batch));
    for (size_t i = 0; i < iov->size(); ++i) {
        const uint64_t off = base + i * s.size;
        (*iov)[i] = IoVec{lane.local, off, lane.remote, off, s.size};
    }
    return s.op == Op::kWrite ? lane.ep->writev(lane.peer, *iov) : lane.ep->readv(lane.peer, *iov);
}

StatusOr<std::vector<double>> run_lanes(const std::vector<Lane>& lanes, const Shape& s,
                                        uint64_t count) {
    const std::string what =
        strformat("%s of %s", op_name(s.op), format_bytes(s.slot_bytes()).c_str());
    // The transfer in flight in each slot of each lane.
    std::vector<std::vector<XferId>> ids(lanes.size(), std::vector<XferId>(s.conc + 1));
    // Slots whose transfer a wait() saw finish (it reports a transfer once): done() says so.
    std::vector<std::vector<char>> waited(lanes.size(), std::vector<char>(s.conc + 1, 0));
    std::vector<IoVec> iov;
    Window w;
    w.lanes = lanes.size();
    w.count = count;
    w.window = s.conc;
    w.last_slot = s.conc;
    w.stall_seconds = static_cast<double>(kStallTimeout.count());
    w.what = what;
    w.post = [&](size_t p, int slot) -> Status {
        StatusOr<XferId> id = post_lane(lanes[p], s, slot, &iov);
        if (!id.ok()) {
            return Status(id.status())
                .with_context(strformat("posting a %s, lane %zu", what.c_str(), p));
        }
        ids[p][static_cast<size_t>(slot)] = *id;
        return Status();
    };
    w.done = [&](size_t p, int slot) -> StatusOr<bool> {
        if (char& seen = waited[p][static_cast<size_t>(slot)]; seen != 0) {
            seen = 0;
            return true;
        }
        XferStatus st = lanes[p].ep->poll(ids[p][static_cast<size_t>(slot)]);
        if (st.state == XferState::kFailed) {
            return st.error.with_context(strformat("%s, lane %zu", what.c_str(), p));
        }
        return st.state == XferState::kDone;
    };
    w.wait = [&](size_t p, int slot) -> Status {
        const XferId id = ids[p][static_cast<size_t>(slot)];
        const Status st = lanes[p].ep->wait(id, std::chrono::milliseconds(1));
        if (st.ok()) {
            waited[p][static_cast<size_t>(slot)] = 1;
            return Status();
        }
        // Still in flight (the wait's own timeout; it may have finished since), or failed with
        // a timeout of its own (a peer timeout): poll() tells them apart. A failure the wait
        // reported is gone, and poll() calls its id unknown (INVALID_ARGUMENT): `st` is the
        // transfer's own error then.
        if (st.code() == StatusCode::kTimeout) {
            const XferStatus now = lanes[p].ep->poll(id);
            if (now.state == XferState::kInProgress) return Status();
            if (now.state == XferState::kDone) {
                waited[p][static_cast<size_t>(slot)] = 1;
                return Status();
            }
            if (now.error.code() != StatusCode::kInvalidArgument) {
                return Status(now.error).with_context(strformat("%s, lane %zu", what.c_str(), p));
            }
        }
        return Status(st).with_context(strformat("%s, lane %zu", what.c_str(), p));
    };
    return run_window(w);
}

}  // namespace tcpx::bench::engine_bench
