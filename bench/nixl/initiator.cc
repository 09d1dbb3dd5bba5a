#include "bench/nixl/initiator.h"

#include <charconv>
#include <cstdint>
#include <string>
#include <vector>

#include "bench/kv_workload.h"
#include "common/status_util.h"
#include "common/strings.h"

namespace tcpx::bench::nixl_bench {
namespace {

// A decimal number of the target's reply; false when it is not one.
bool parse_u64(const std::string& s, uint64_t* v) {
    const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), *v);
    return ec == std::errc() && end == s.data() + s.size();
}

}  // namespace

Status Initiator::begin(const std::string& backend) {
    end();
    TCPX_ASSIGN_OR_RETURN(agent_, create_agent(kInitiatorName, backend, o_));
    TCPX_RETURN_IF_ERROR(
        from_nixl(agent_.agent->registerMem(region_dlist(*memory_)), "registerMem"));
    registered_ = true;
    target_begun_ = true;
    TCPX_ASSIGN_OR_RETURN(std::string reply, peer_->call("begin " + backend));
    const auto w = words(reply);
    std::string md;
    if (w.size() != 4 || w[0] != "ok" || !unhex_blob(w[1], &md)) {
        return protocol_error("target: " + reply);
    }
    if (!parse_u64(w[2], &remote_addr_) || !parse_u64(w[3], &remote_dev_)) {
        return protocol_error("target: " + reply.substr(0, 200));
    }
    TCPX_RETURN_IF_ERROR(from_nixl(agent_.agent->loadRemoteMD(md, target_), "loadRemoteMD"));
    nixl_opt_args_t args;
    args.backends = {agent_.backend};
    TCPX_RETURN_IF_ERROR(
        from_nixl(agent_.agent->makeConnection(target_, &args), "makeConnection to " + target_));
    return Status();
}

Status Initiator::prepare(Op op, uint64_t size) {
    release();
    op_ = op;
    slot_bytes_ = size * static_cast<uint64_t>(o_.batch);
    handles_.assign(static_cast<size_t>(depth_for(o_, size)), nullptr);
    const uintptr_t local = reinterpret_cast<uintptr_t>(memory_->data());
    for (size_t s = 0; s < handles_.size(); ++s) {
        nixl_xfer_dlist_t l(memory_->segment());
        nixl_xfer_dlist_t r(memory_->segment());
        for (int j = 0; j < o_.batch; ++j) {
            const uint64_t off = s * slot_bytes_ + static_cast<uint64_t>(j) * size;
            l.addDesc(nixlBasicDesc(local + off, size, memory_->dev_id()));
            r.addDesc(nixlBasicDesc(remote_addr_ + off, size, remote_dev_));
        }
        nixl_opt_args_t args;
        args.backends = {agent_.backend};
        TCPX_RETURN_IF_ERROR(
            from_nixl(agent_.agent->createXferReq(nixl_op(op), l, r, target_, handles_[s], &args),
                      "createXferReq"));
    }
    return Status();
}

Status Initiator::verify(uint64_t run) {
    const int n = depth();
    const std::string slots = strformat(" %llu %llu %d", static_cast<unsigned long long>(run),
                                        static_cast<unsigned long long>(slot_bytes_), n);
    const bool write = op_ == Op::kWrite;
    TCPX_RETURN_IF_ERROR(memory_->prepare(run, slot_bytes_, n, write));
    TCPX_RETURN_IF_ERROR(peer_->call("prepare" + slots + (write ? " poison" : " fill")).status());
    nixl_opt_args_t notif;
    notif.notif = kVerifyNotif;
    TCPX_RETURN_IF_ERROR(requests(static_cast<uint64_t>(n), &notif).status());
    if (!write) {
        Status st = memory_->check(run, slot_bytes_, n, "initiator memory");
        if (!st.ok()) return internal_error("VERIFICATION FAILED: " + std::string(st.message()));
    }
    return peer_->call("check" + slots + strformat(" %d ", n) + (write ? "data" : "nodata"))
        .status();
}

StatusOr<double> Initiator::requests(uint64_t total, const nixl_opt_args_t* args) {
    nixl_opt_args_t plain;  // no notification (clears one a handle was posted with)
    if (args == nullptr) args = &plain;
    Window w;
    w.count = total;
    w.window = depth();
    w.stall_seconds = o_.stall_seconds;
    w.what = strformat("%s of %s", op_name(op_), format_bytes(slot_bytes_).c_str());
    w.post = [&](size_t, int slot) { return post(static_cast<size_t>(slot), args); };
    w.done = [&](size_t, int slot) -> StatusOr<bool> {
        const nixl_status_t st = agent_.agent->getXferStatus(handles_[slot]);
        if (st == NIXL_IN_PROG) return false;
        TCPX_RETURN_IF_ERROR(from_nixl(st, "transfer"));
        return true;
    };
    TCPX_ASSIGN_OR_RETURN(std::vector<double> seconds, run_window(w));
    return seconds[0];
}

Status Initiator::prepare_kv(Op op) {
    release();
    op_ = op;
    const KvShape& k = o_.kv_shape;
    const uintptr_t local = reinterpret_cast<uintptr_t>(memory_->data());
    auto create = [&](const std::vector<uint64_t>& here, const std::vector<uint64_t>& there,
                      uint64_t len) -> Status {
        nixl_xfer_dlist_t l(memory_->segment());
        nixl_xfer_dlist_t r(memory_->segment());
        for (size_t i = 0; i < here.size(); ++i) {
            l.addDesc(nixlBasicDesc(local + here[i], len, memory_->dev_id()));
            r.addDesc(nixlBasicDesc(remote_addr_ + there[i], len, remote_dev_));
        }
        nixl_opt_args_t args;
        args.backends = {agent_.backend};
        handles_.push_back(nullptr);
        return from_nixl(
            agent_.agent->createXferReq(nixl_op(op), l, r, target_, handles_.back(), &args),
            "createXferReq");
    };
    for (int r = 0; r < kKvRequests; ++r) {
        TCPX_RETURN_IF_ERROR(create(kv_offsets(k, kv_seed(r, KvSide::kInitiator)),
                                    kv_offsets(k, kv_seed(r, KvSide::kTarget)), k.block_bytes()));
    }
    TCPX_RETURN_IF_ERROR(create({0}, {0}, k.request_bytes()));
    return Status();
}

StatusOr<double> Initiator::kv_requests(bool contiguous, uint64_t count,
                                        const nixl_opt_args_t* args) {
    nixl_opt_args_t plain;
    if (args == nullptr) args = &plain;
    const auto start = Clock::now();
    for (uint64_t n = 0; n < count; ++n) {
        const size_t h = contiguous ? kKvRequests : static_cast<size_t>(n % kKvRequests);
        TCPX_RETURN_IF_ERROR(post(h, args));
        TCPX_RETURN_IF_ERROR(wait(h).with_context(kv_what(contiguous)));
    }
    return seconds_since(start);
}

Status Initiator::verify_kv(uint64_t run, bool contiguous) {
    const KvShape& k = o_.kv_shape;
    const Buffer& local = memory_->buffer();
    const uint64_t total = k.request_bytes();
    const std::vector<uint64_t> offsets = kv_offsets(k, kv_seed(0, KvSide::kInitiator));
    const auto ull = [](uint64_t v) { return static_cast<unsigned long long>(v); };
    const bool write = op_ == Op::kWrite;
    if (write) {
        TCPX_RETURN_IF_ERROR(contiguous ? memory_->prepare(run, total, 1, /*pattern=*/true)
                                        : kv_fill(local, k, offsets, run));
        TCPX_RETURN_IF_ERROR(peer_
                                 ->call(strformat("prepare %llu %llu 1 poison", ull(run),
                                                  ull(contiguous ? total : k.pool)))
                                 .status());
    } else {
        TCPX_RETURN_IF_ERROR(
            peer_
                ->call(contiguous ? strformat("prepare %llu %llu 1 fill", ull(run), ull(total))
                                  : strformat("kvfill %llu 0", ull(run)))
                .status());
        TCPX_RETURN_IF_ERROR(
            memory_->prepare(run, contiguous ? total : k.pool, 1, /*pattern=*/false));
    }
    nixl_opt_args_t notif;
    notif.notif = kVerifyNotif;
    TCPX_RETURN_IF_ERROR(kv_requests(contiguous, 1, &notif).status());  // request 0
    if (write) {
        return peer_
            ->call(contiguous ? strformat("check %llu %llu 1 1 data", ull(run), ull(total))
                              : strformat("kvcheck %llu 0 1", ull(run)))
            .status();
    }
    Status st = contiguous ? memory_->check(run, total, 1, "initiator memory")
                           : kv_check(local, k, offsets, run, "initiator memory");
    if (!st.ok()) return internal_error("VERIFICATION FAILED: " + std::string(st.message()));
    return peer_->call(strformat("check %llu 0 0 1 nodata", ull(run))).status();
}

StatusOr<std::vector<double>> Initiator::singles(uint64_t count) {
    std::vector<double> us;
    us.reserve(count);
    nixl_opt_args_t plain;
    for (uint64_t i = 0; i < count; ++i) {
        const auto start = Clock::now();
        TCPX_RETURN_IF_ERROR(post(0, &plain));
        nixl_status_t st;
        uint64_t spins = 0;
        while ((st = agent_.agent->getXferStatus(handles_[0])) == NIXL_IN_PROG) {
            if (++spins % 1024 == 0 && seconds_since(start) > o_.stall_seconds) {
                return timeout_error("a single transfer did not complete");
            }
        }
        TCPX_RETURN_IF_ERROR(from_nixl(st, "transfer"));
        us.push_back(seconds_since(start) * 1e6);
    }
    return us;
}

void Initiator::end() {
    release();
    if (registered_) (void)agent_.agent->deregisterMem(region_dlist(*memory_));
    registered_ = false;
    if (agent_.agent && !target_.empty()) (void)agent_.agent->invalidateRemoteMD(target_);
    target_.clear();
    agent_ = Agent();
    if (target_begun_) (void)peer_->call("end");
    target_begun_ = false;
}

std::string Initiator::kv_what(bool contiguous) const {
    return strformat("%s of a KV request%s", op_name(op_), contiguous ? " (contiguous)" : "");
}

Status Initiator::wait(size_t slot) {
    const auto start = Clock::now();
    nixl_status_t st;
    uint64_t spins = 0;
    while ((st = agent_.agent->getXferStatus(handles_[slot])) == NIXL_IN_PROG) {
        if (++spins % 1024 == 0 && seconds_since(start) > o_.stall_seconds) {
            return timeout_error(
                strformat("a request did not complete in %.0f s", o_.stall_seconds));
        }
    }
    return from_nixl(st, "transfer");
}

Status Initiator::post(size_t slot, const nixl_opt_args_t* args) {
    const nixl_status_t st = agent_.agent->postXferReq(handles_[slot], args);
    if (st == NIXL_SUCCESS || st == NIXL_IN_PROG) return Status();
    return from_nixl(st, "postXferReq");
}

void Initiator::release() {
    for (nixlXferReqH* h : handles_) {
        if (h != nullptr) (void)agent_.agent->releaseXferReq(h);
    }
    handles_.clear();
}

}  // namespace tcpx::bench::nixl_bench
