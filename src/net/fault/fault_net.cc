#include "net/fault/fault_net.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <cstring>
#include <deque>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "common/log.h"
#include "common/status_util.h"
#include "common/strings.h"

namespace tcpx::net {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::nanoseconds;

enum class Kind { kFail, kReset, kDrop, kDelay, kTruncate, kCorrupt };
constexpr std::array<std::string_view, 6> kKindNames = {"fail",  "reset",    "drop",
                                                        "delay", "truncate", "corrupt"};

enum class Op { kListen, kConnect, kAccept, kRegMr, kIsend, kIrecv, kTest, kIrecvConsumed, kClose };
constexpr std::array<std::string_view, 9> kOpNames = {
    "listen", "connect", "accept", "reg_mr", "isend", "irecv", "test", "irecv_consumed", "close"};
constexpr size_t kOpCount = kOpNames.size();

// Long enough for any drill, short enough that time arithmetic cannot overflow.
constexpr nanoseconds kMaxDelay = std::chrono::hours(1);

struct Rule {
    Kind kind = Kind::kFail;
    Op op = Op::kListen;
    uint64_t n = 0;
    uint64_t comm = 0;  // 0: any comm
    bool has_arg = false;
    uint64_t arg = 0;
    nanoseconds delay{0};
    std::string text;
};

// The rules that fired on one call.
struct Faults {
    std::vector<const Rule*> rules;

    const Rule* find(Kind kind) const {
        for (const Rule* r : rules) {
            if (r->kind == kind) return r;
        }
        return nullptr;
    }
    // The first fail or reset: both make the call itself fail.
    const Rule* failing() const {
        for (const Rule* r : rules) {
            if (r->kind == Kind::kFail || r->kind == Kind::kReset) return r;
        }
        return nullptr;
    }
    nanoseconds delay() const {
        nanoseconds d{0};
        for (const Rule* r : rules) d = std::max(d, r->delay);
        return d;
    }
    void merge(const Faults& other) {
        rules.insert(rules.end(), other.rules.begin(), other.rules.end());
    }
};

bool parse_u64(std::string_view s, uint64_t* out) {
    if (s.empty() || s.size() > 19) return false;
    uint64_t v = 0;
    for (char ch : s) {
        if (ch < '0' || ch > '9') return false;
        v = v * 10 + static_cast<uint64_t>(ch - '0');
    }
    *out = v;
    return true;
}

bool parse_duration(std::string_view s, nanoseconds* out) {
    size_t digits = 0;
    while (digits < s.size() && s[digits] >= '0' && s[digits] <= '9') ++digits;
    uint64_t v = 0;
    if (!parse_u64(s.substr(0, digits), &v)) return false;
    const std::string_view unit = s.substr(digits);
    uint64_t ns_per = 0;
    if (unit == "us") {
        ns_per = 1000;
    } else if (unit == "ms") {
        ns_per = 1000 * 1000;
    } else if (unit == "s") {
        ns_per = 1000 * 1000 * 1000;
    } else {
        return false;
    }
    if (v > static_cast<uint64_t>(kMaxDelay.count()) / ns_per) return false;
    *out = nanoseconds(static_cast<int64_t>(v * ns_per));
    return true;
}

template <size_t N>
bool lookup(const std::array<std::string_view, N>& names, std::string_view name, size_t* index) {
    for (size_t i = 0; i < N; ++i) {
        if (names[i] == name) {
            *index = i;
            return true;
        }
    }
    return false;
}

StatusOr<Rule> parse_rule(std::string_view text) {
    auto bad = [&](const std::string& why) {
        return invalid_argument(strformat("FAULT rule '%.*s': %s", static_cast<int>(text.size()),
                                          text.data(), why.c_str()));
    };
    Rule rule;
    rule.text = std::string(text);
    std::string_view body = text;
    if (const size_t at = text.find('@'); at != std::string_view::npos) {
        const std::string_view target = text.substr(at + 1);
        body = text.substr(0, at);
        if (target.substr(0, 4) != "comm" || !parse_u64(target.substr(4), &rule.comm) ||
            rule.comm == 0) {
            return bad("expected @commK with K from 1 after '@'");
        }
    }
    std::vector<std::string_view> fields;
    size_t start = 0;
    while (true) {
        const size_t colon = body.find(':', start);
        fields.push_back(body.substr(start, colon - start));
        if (colon == std::string_view::npos) break;
        start = colon + 1;
    }
    if (fields.size() < 3 || fields.size() > 4) return bad("expected KIND:OP:N[:ARG][@commK]");
    size_t index = 0;
    if (!lookup(kKindNames, fields[0], &index)) {
        return bad("unknown kind (fail, reset, drop, delay, truncate, corrupt)");
    }
    rule.kind = static_cast<Kind>(index);
    if (!lookup(kOpNames, fields[1], &index)) {
        return bad(
            "unknown op (listen, connect, accept, reg_mr, isend, irecv, test, irecv_consumed, "
            "close)");
    }
    rule.op = static_cast<Op>(index);
    if (!parse_u64(fields[2], &rule.n) || rule.n == 0) return bad("N must be a count from 1");
    const bool on_request = rule.op == Op::kIsend || rule.op == Op::kIrecv || rule.op == Op::kTest;
    switch (rule.kind) {
        case Kind::kDrop:
        case Kind::kTruncate:
            if (!on_request) return bad("applies to isend, irecv and test only");
            break;
        case Kind::kCorrupt:
            if (rule.op != Op::kIrecv && rule.op != Op::kTest) {
                return bad("applies to irecv and test only");
            }
            break;
        default:
            break;
    }
    if (rule.comm != 0 &&
        (rule.op == Op::kListen || rule.op == Op::kConnect || rule.op == Op::kAccept)) {
        return bad("@comm applies to ops on a send or receive comm");
    }
    if (fields.size() == 4) {
        const std::string_view arg = fields[3];
        rule.has_arg = true;
        if (rule.kind == Kind::kDelay) {
            if (!parse_duration(arg, &rule.delay) || rule.delay.count() == 0) {
                return bad("delay takes a duration such as 250ms, 2s or 500us (at most 1 hour)");
            }
        } else if (rule.kind == Kind::kTruncate || rule.kind == Kind::kCorrupt) {
            if (!parse_u64(arg, &rule.arg) || (rule.kind == Kind::kCorrupt && rule.arg == 0)) {
                return bad("ARG must be a byte count");
            }
        } else {
            return bad("this kind takes no ARG");
        }
    } else if (rule.kind == Kind::kDelay) {
        return bad("delay needs a duration, e.g. delay:isend:3:200ms");
    }
    return rule;
}

StatusOr<std::vector<Rule>> parse_spec(std::string_view spec) {
    std::vector<Rule> rules;
    for (const std::string& piece : split_trimmed(spec, ',')) {
        TCPX_ASSIGN_OR_RETURN(Rule rule, parse_rule(piece));
        rules.push_back(std::move(rule));
    }
    return rules;
}

// A byte count smaller than `size` (when size > 0): the rule's ARG, or half.
size_t shortened(size_t size, const Rule& rule) {
    if (size == 0) return 0;
    const uint64_t want = rule.has_arg ? rule.arg : size / 2;
    return static_cast<size_t>(std::min<uint64_t>(want, size - 1));
}

struct FaultComm;

// A request as the caller sees it. The inner request (if any) is tested through it; what the
// caller is told, and when, is decided here.
struct FaultRequest {
    FaultComm* comm = nullptr;
    bool recv = false;
    Request* inner = nullptr;  // null: a dropped send, completed here
    int n = 1;
    std::vector<void*> data;
    std::vector<size_t> posted;
    std::vector<MemHandle*> mhandles;
    std::vector<size_t> got;  // sizes the inner reported
    Faults faults;            // from the isend/irecv that posted it and the test that completed it
    bool inner_done = false;
    Clock::time_point ready_at;
    // The caller may still test() it: until it is reported done or failed (for ever, if dropped).
    bool in_caller = true;
    // A receive the inner may be told irecv_consumed() about (the caller consumed it, or never
    // will: it failed or was dropped).
    bool consumed = false;
};

struct FaultComm {
    bool send = false;
    void* inner = nullptr;  // SendComm* or RecvComm*
    uint64_t id = 0;
    const Rule* broken_by = nullptr;
    std::array<uint64_t, kOpCount> counts{};
    std::unordered_map<FaultRequest*, std::unique_ptr<FaultRequest>> requests;
    // Receives the inner reported done, in that order, not yet handed back by irecv_consumed():
    // the inner is told in its completion order whatever order the caller sees them in.
    std::deque<FaultRequest*> completed;
};

struct FaultListen {
    ListenComm* inner = nullptr;
    const Rule* broken_by = nullptr;
};

Status injected(const Rule& rule) {
    return Status(StatusCode::kSystem, "injected fault " + rule.text);
}

Status reset_status(const FaultComm& c) {
    return Status(StatusCode::kSystem,
                  strformat("comm %llu was reset by injected fault %s",
                            static_cast<unsigned long long>(c.id), c.broken_by->text.c_str()));
}

class FaultNet final : public Net {
 public:
    FaultNet(std::unique_ptr<Net> inner, std::vector<Rule> rules)
        : inner_(std::move(inner)), rules_(std::move(rules)) {}

    std::string_view name() const override { return inner_->name(); }
    int device_count() const override { return inner_->device_count(); }
    Status get_properties(int dev, Properties* props) const override {
        TCPX_RETURN_IF_ERROR(inner_->get_properties(dev, props));
        // Faults act on single-buffer requests: segment lists go through the caller's staging.
        props->segments = false;
        return Status();
    }
    Status check_peer_handle(Handle* handle, const SocketAddress& peer_address) const override {
        return inner_->check_peer_handle(handle, peer_address);
    }
    void abandon_connect(Handle* handle) override { inner_->abandon_connect(handle); }
    // The inner transport's I/O (faults act on requests, not on the I/O that carries them).
    bool progress() override { return inner_->progress(); }
    int progress_fd() override { return inner_->progress_fd(); }

    Status listen(int dev, Handle* handle, ListenComm** listen_comm) override {
        *listen_comm = nullptr;
        std::unique_lock lock(mu_);
        const Faults f = take(Op::kListen, nullptr);
        if (const Rule* r = f.failing()) return injected(*r);
        pause(lock, f.delay());
        ListenComm* inner = nullptr;
        TCPX_RETURN_IF_ERROR(inner_->listen(dev, handle, &inner));
        auto l = std::make_unique<FaultListen>();
        l->inner = inner;
        *listen_comm = reinterpret_cast<ListenComm*>(l.get());
        listens_.emplace(l.get(), std::move(l));
        return Status();
    }

    Status connect(int dev, Handle* handle, SendComm** send_comm,
                   DeviceHandle* dev_handle) override {
        *send_comm = nullptr;
        std::unique_lock lock(mu_);
        SendComm* inner = nullptr;
        TCPX_RETURN_IF_ERROR(inner_->connect(dev, handle, &inner, dev_handle));
        if (inner == nullptr) return Status();
        FaultComm* c = add_comm(true, inner);
        const Faults f = take(Op::kConnect, nullptr);
        if (const Rule* r = f.failing()) {
            (void)inner_->close_send(inner);
            comms_.erase(c);
            return injected(*r);
        }
        *send_comm = reinterpret_cast<SendComm*>(c);
        pause(lock, f.delay());
        return Status();
    }

    Status accept(ListenComm* listen_comm, RecvComm** recv_comm,
                  DeviceHandle* dev_handle) override {
        *recv_comm = nullptr;
        std::unique_lock lock(mu_);
        auto it = listens_.find(reinterpret_cast<FaultListen*>(listen_comm));
        if (it == listens_.end()) return invalid_argument("accept on an unknown listen comm");
        FaultListen* l = it->second.get();
        if (l->broken_by != nullptr) {
            return Status(StatusCode::kSystem,
                          "listen comm was reset by injected fault " + l->broken_by->text);
        }
        RecvComm* inner = nullptr;
        TCPX_RETURN_IF_ERROR(inner_->accept(l->inner, &inner, dev_handle));
        if (inner == nullptr) return Status();
        FaultComm* c = add_comm(false, inner);
        const Faults f = take(Op::kAccept, nullptr);
        if (const Rule* r = f.failing()) {
            (void)inner_->close_recv(inner);
            comms_.erase(c);
            if (r->kind == Kind::kReset) l->broken_by = r;
            return injected(*r);
        }
        *recv_comm = reinterpret_cast<RecvComm*>(c);
        pause(lock, f.delay());
        return Status();
    }

    Status reg_mr(void* comm, void* data, size_t size, MemType type, MemHandle** mhandle) override {
        std::unique_lock lock(mu_);
        TCPX_ASSIGN_OR_RETURN(FaultComm * c, usable_comm(comm));
        const Faults f = take(Op::kRegMr, c);
        if (const Rule* r = f.failing()) return fail_call(c, *r);
        pause(lock, f.delay());
        TCPX_RETURN_IF_ERROR(inner_->reg_mr(c->inner, data, size, type, mhandle));
        mem_types_[*mhandle] = MemRecord{type, c};
        return Status();
    }

    Status hint_device_reads(void* comm, MemHandle* mhandle) override {
        std::unique_lock lock(mu_);
        TCPX_ASSIGN_OR_RETURN(FaultComm * c, find_comm(comm));
        return inner_->hint_device_reads(c->inner, mhandle);
    }

    Status dereg_mr(void* comm, MemHandle* mhandle) override {
        // Even on a reset comm: the registration must still be released.
        std::unique_lock lock(mu_);
        if (comm == nullptr) {
            // After its comm's close (Properties::dereg_after_close, the inner net's to say).
            mem_types_.erase(mhandle);
            return inner_->dereg_mr(nullptr, mhandle);
        }
        TCPX_ASSIGN_OR_RETURN(FaultComm * c, find_comm(comm));
        mem_types_.erase(mhandle);
        return inner_->dereg_mr(c->inner, mhandle);
    }

    Status isend(SendComm* comm, const void* data, size_t size, int tag, MemHandle* mhandle,
                 Request** request) override {
        *request = nullptr;
        std::unique_lock lock(mu_);
        TCPX_ASSIGN_OR_RETURN(FaultComm * c, usable_comm(comm));
        if (!c->send) return invalid_argument("isend on a receive comm");
        // Faults that keep the call from reaching the inner count now; the others count only if
        // the inner takes the request.
        Faults f = peek(Op::kIsend, c);
        if (f.failing() != nullptr || f.find(Kind::kDrop) != nullptr) {
            f = take(Op::kIsend, c);
            if (const Rule* r = f.failing()) return fail_call(c, *r);
        }
        auto req = std::make_unique<FaultRequest>();
        req->comm = c;
        req->data = {const_cast<void*>(data)};
        req->posted = {size};
        req->mhandles = {mhandle};
        req->got = {size};
        if (f.find(Kind::kDrop) == nullptr) {
            size_t send_size = size;
            if (const Rule* t = f.find(Kind::kTruncate)) send_size = shortened(size, *t);
            Request* inner = nullptr;
            TCPX_RETURN_IF_ERROR(inner_->isend(static_cast<SendComm*>(c->inner), data, send_size,
                                               tag, mhandle, &inner));
            if (inner == nullptr) return Status();
            f = take(Op::kIsend, c);
            req->inner = inner;
            req->got = {send_size};
        }
        req->faults = std::move(f);
        *request = reinterpret_cast<Request*>(req.get());
        c->requests.emplace(req.get(), std::move(req));
        return Status();
    }

    Status irecv(RecvComm* comm, int n, void* const* data, const size_t* sizes, const int* tags,
                 MemHandle* const* mhandles, Request** request) override {
        *request = nullptr;
        std::unique_lock lock(mu_);
        TCPX_ASSIGN_OR_RETURN(FaultComm * c, usable_comm(comm));
        if (c->send) return invalid_argument("irecv on a send comm");
        if (n < 1) return invalid_argument(strformat("irecv of %d buffers", n));
        Faults f = peek(Op::kIrecv, c);
        if (f.failing() != nullptr) {
            f = take(Op::kIrecv, c);
            return fail_call(c, *f.failing());
        }
        Request* inner = nullptr;
        TCPX_RETURN_IF_ERROR(inner_->irecv(static_cast<RecvComm*>(c->inner), n, data, sizes, tags,
                                           mhandles, &inner));
        if (inner == nullptr) return Status();
        f = take(Op::kIrecv, c);
        auto req = std::make_unique<FaultRequest>();
        req->comm = c;
        req->recv = true;
        req->inner = inner;
        req->n = n;
        req->data.assign(data, data + n);
        req->posted.assign(sizes, sizes + n);
        // The caller may pass no handles at all (the socket transport needs none).
        if (mhandles != nullptr) {
            req->mhandles.assign(mhandles, mhandles + n);
        } else {
            req->mhandles.assign(static_cast<size_t>(n), nullptr);
        }
        req->got = req->posted;
        req->faults = std::move(f);
        *request = reinterpret_cast<Request*>(req.get());
        c->requests.emplace(req.get(), std::move(req));
        return Status();
    }

    Status test(Request* request, bool* done, size_t* sizes) override {
        *done = false;
        std::unique_lock lock(mu_);
        FaultRequest* req = reinterpret_cast<FaultRequest*>(request);
        FaultComm* c = req->comm;
        if (c->broken_by != nullptr) {
            finish(c, req);
            return reset_status(*c);
        }
        if (!req->inner_done) {
            if (req->inner != nullptr) {
                bool inner_done = false;
                const Status st = inner_->test(req->inner, &inner_done, req->got.data());
                if (!st.ok()) {
                    req->inner_done = true;  // gone: never tested nor consumed again
                    req->inner = nullptr;
                    finish(c, req);
                    return st;
                }
                if (!inner_done) return Status();
                if (req->recv) c->completed.push_back(req);
            }
            req->inner_done = true;
            const Faults t = take(Op::kTest, c);
            req->faults.merge(t);
            if (const Rule* r = t.failing()) {
                req->consumed = true;
                finish(c, req);
                if (r->kind == Kind::kReset) {
                    c->broken_by = r;
                } else {
                    (void)flush(c);
                }
                return injected(*r);
            }
            req->ready_at = Clock::now() + req->faults.delay();
            if (is_dropped(*req)) {
                // Swallowed: the inner gets it back at once, the caller never hears of it.
                req->consumed = true;
                return flush(c);
            }
        }
        if (is_dropped(*req) || Clock::now() < req->ready_at) return Status();
        if (const Rule* t = req->faults.find(Kind::kTruncate); t != nullptr && req->recv) {
            for (size_t& got : req->got) got = shortened(got, *t);
        }
        if (const Rule* r = req->faults.find(Kind::kCorrupt); r != nullptr && req->recv) {
            corrupt(*req, *r);
        }
        if (sizes != nullptr) std::copy(req->got.begin(), req->got.end(), sizes);
        *done = true;
        finish(c, req);
        return Status();
    }

    Status irecv_consumed(RecvComm* comm, int n, Request* request) override {
        std::unique_lock lock(mu_);
        TCPX_ASSIGN_OR_RETURN(FaultComm * c, usable_comm(comm));
        const Faults f = take(Op::kIrecvConsumed, c);
        auto it = c->requests.find(reinterpret_cast<FaultRequest*>(request));
        if (it == c->requests.end() || !it->second->recv || it->second->in_caller ||
            it->second->consumed || it->second->n != n) {
            return invalid_argument(
                "irecv_consumed of a request that is not a completed receive "
                "of this comm");
        }
        if (const Rule* r = f.find(Kind::kReset)) {
            c->broken_by = r;
            return injected(*r);
        }
        it->second->consumed = true;
        const Status st = flush(c);
        if (const Rule* r = f.failing()) return injected(*r);
        pause(lock, f.delay());
        return st;
    }

    StatusOr<UnpackSlot> unpack_slot(RecvComm* comm, Request* request) override {
        std::unique_lock lock(mu_);
        TCPX_ASSIGN_OR_RETURN(FaultComm * c, usable_comm(comm));
        auto it = c->requests.find(reinterpret_cast<FaultRequest*>(request));
        if (it == c->requests.end() || it->second->inner == nullptr) {
            return invalid_argument("unpack_slot of an unknown request");
        }
        return inner_->unpack_slot(static_cast<RecvComm*>(c->inner), it->second->inner);
    }

    Status close_send(SendComm* comm) override { return close_comm(comm); }
    Status close_recv(RecvComm* comm) override { return close_comm(comm); }

    Status close_listen(ListenComm* listen_comm) override {
        std::unique_lock lock(mu_);
        auto it = listens_.find(reinterpret_cast<FaultListen*>(listen_comm));
        if (it == listens_.end()) return invalid_argument("close of an unknown listen comm");
        const Faults f = take(Op::kClose, nullptr);
        const Status st = inner_->close_listen(it->second->inner);
        listens_.erase(it);
        if (const Rule* r = f.failing()) return injected(*r);
        pause(lock, f.delay());
        return st;
    }

 private:
    FaultComm* add_comm(bool send, void* inner) {
        auto c = std::make_unique<FaultComm>();
        c->send = send;
        c->inner = inner;
        c->id = ++comms_created_;
        FaultComm* raw = c.get();
        comms_.emplace(raw, std::move(c));
        return raw;
    }

    StatusOr<FaultComm*> find_comm(void* comm) {
        auto it = comms_.find(static_cast<FaultComm*>(comm));
        if (it == comms_.end()) return invalid_argument("unknown comm");
        return it->second.get();
    }

    StatusOr<FaultComm*> usable_comm(void* comm) {
        TCPX_ASSIGN_OR_RETURN(FaultComm * c, find_comm(comm));
        if (c->broken_by != nullptr) return reset_status(*c);
        return c;
    }

    // The rules matching the next call of `op` (on `c`), without counting it.
    Faults peek(Op op, const FaultComm* c) const {
        const size_t i = static_cast<size_t>(op);
        Faults f;
        for (const Rule& r : rules_) {
            if (r.op != op) continue;
            const bool hit = r.comm == 0
                                 ? r.n == counts_[i] + 1
                                 : c != nullptr && c->id == r.comm && r.n == c->counts[i] + 1;
            if (hit) f.rules.push_back(&r);
        }
        return f;
    }

    // Counts a call of `op` and returns the rules it fires (each fires once: counts only grow).
    Faults take(Op op, FaultComm* c) {
        Faults f = peek(op, c);
        ++counts_[static_cast<size_t>(op)];
        if (c != nullptr) ++c->counts[static_cast<size_t>(op)];
        for (const Rule* r : f.rules) {
            TCPX_INFO(
                "fault injection: %s fires%s", r->text.c_str(),
                c != nullptr
                    ? strformat(" on comm %llu", static_cast<unsigned long long>(c->id)).c_str()
                    : "");
        }
        return f;
    }

    Status fail_call(FaultComm* c, const Rule& r) {
        if (r.kind == Kind::kReset) c->broken_by = &r;
        return injected(r);
    }

    static bool is_dropped(const FaultRequest& req) {
        // A dropped send never reached the inner: it completes here. Anything else dropped
        // completes never.
        return req.inner != nullptr && req.faults.find(Kind::kDrop) != nullptr;
    }

    // The caller is done with `req` (reported or failed); it goes once the inner is too.
    void finish(FaultComm* c, FaultRequest* req) {
        req->in_caller = false;
        auto pos = std::find(c->completed.begin(), c->completed.end(), req);
        if (pos != c->completed.end()) {
            // Still to be handed back to the inner (never, on a reset comm: close frees it).
            if (c->broken_by == nullptr) return;
            c->completed.erase(pos);
        }
        c->requests.erase(req);
    }

    // Hands consumed receives back to the inner, in its completion order.
    Status flush(FaultComm* c) {
        while (!c->completed.empty() && c->completed.front()->consumed) {
            FaultRequest* req = c->completed.front();
            c->completed.pop_front();
            const Status st =
                inner_->irecv_consumed(static_cast<RecvComm*>(c->inner), req->n, req->inner);
            if (!req->in_caller) c->requests.erase(req);
            TCPX_RETURN_IF_ERROR(st);
        }
        return Status();
    }

    void corrupt(FaultRequest& req, const Rule& r) {
        for (int i = 0; i < req.n; ++i) {
            const size_t got = std::min(req.got[i], req.posted[i]);
            if (got == 0 || req.data[i] == nullptr) continue;
            auto type = mem_types_.find(req.mhandles[i]);
            if (type != mem_types_.end() && type->second.type != MemType::kHost) {
                TCPX_INFO("fault injection: %s skipped: the buffer is not host memory",
                          r.text.c_str());
                continue;
            }
            const uint64_t count = std::min<uint64_t>(r.has_arg ? r.arg : 1, got);
            auto* bytes = static_cast<uint8_t*>(req.data[i]);
            for (uint64_t k = 0; k < count; ++k) {
                bytes[(got * (2 * k + 1)) / (2 * count)] ^= 0xff;
            }
        }
    }

    Status close_comm(void* comm) {
        std::unique_lock lock(mu_);
        TCPX_ASSIGN_OR_RETURN(FaultComm * c, find_comm(comm));
        const Faults f = take(Op::kClose, c);
        // Closed even when a fault fires: the transport must never keep touching its buffers.
        const Status st = c->send ? inner_->close_send(static_cast<SendComm*>(c->inner))
                                  : inner_->close_recv(static_cast<RecvComm*>(c->inner));
        // Registrations the caller left to the close (close_releases_registrations) go with it.
        std::erase_if(mem_types_, [c](const auto& kv) { return kv.second.comm == c; });
        comms_.erase(c);
        if (const Rule* r = f.failing()) return injected(*r);
        pause(lock, f.delay());
        return st;
    }

    // Sleeps `d` without holding the lock (other comms go on meanwhile).
    static void pause(std::unique_lock<std::mutex>& lock, nanoseconds d) {
        if (d.count() == 0) return;
        lock.unlock();
        std::this_thread::sleep_for(d);
        lock.lock();
    }

    std::unique_ptr<Net> inner_;
    const std::vector<Rule> rules_;
    // One lock over all bookkeeping, held across inner calls (none of which blocks): simple,
    // and the serialization costs nothing that matters where faults are injected.
    std::mutex mu_;
    std::array<uint64_t, kOpCount> counts_{};
    uint64_t comms_created_ = 0;
    std::unordered_map<FaultComm*, std::unique_ptr<FaultComm>> comms_;
    std::unordered_map<FaultListen*, std::unique_ptr<FaultListen>> listens_;
    struct MemRecord {
        MemType type;
        FaultComm* comm;
    };
    std::unordered_map<MemHandle*, MemRecord> mem_types_;
};

}  // namespace

StatusOr<std::unique_ptr<Net>> make_fault_net(std::unique_ptr<Net> inner, std::string_view spec) {
    if (inner == nullptr) return invalid_argument("make_fault_net: no transport to wrap");
    TCPX_ASSIGN_OR_RETURN(std::vector<Rule> rules, parse_spec(spec));
    if (!rules.empty()) {
        TCPX_INFO("fault injection on over %s: %.*s", std::string(inner->name()).c_str(),
                  static_cast<int>(spec.size()), spec.data());
    }
    return std::unique_ptr<Net>(std::make_unique<FaultNet>(std::move(inner), std::move(rules)));
}

}  // namespace tcpx::net
