// The C API (tcpx/tcpx.h): a thin layer over tcpx::Endpoint. Each entry point checks its
// pointers, turns C arguments into C++ ones, calls the C++ API and returns through guarded(): the
// one place that turns a Status into a tcpx_status_t and the thread's last error, and that keeps
// every exception inside the library.
#include "tcpx/tcpx.h"

#include <chrono>
#include <cstring>
#include <exception>
#include <memory>
#include <mutex>
#include <new>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/status_util.h"
#include "common/strings.h"
#include "engine/ctrl_wire.h"
#include "tcpx/config.h"
#include "tcpx/endpoint.h"
#include "tcpx/status.h"

struct tcpx_config_t {
    tcpx::Config config;
};

struct tcpx_endpoint_t {
    std::unique_ptr<tcpx::Endpoint> endpoint;
    // The C API returns one notification at a time, and keeps one whose buffers were too small
    // until a call can take it. It takes them from the engine one at a time too: one taken
    // counts as the application's (the bounds on what it has not taken no longer count it), so
    // a batch held here would let peers send that much past those bounds.
    std::mutex mu;
    std::vector<tcpx::Notification> pending;  // taken from the engine, not yet returned: 0 or 1
};

namespace {

using tcpx::Config;
using tcpx::Endpoint;
using tcpx::IoVec;
using tcpx::RemoteMem;
using tcpx::Stats;
using tcpx::Status;
using tcpx::StatusCode;
using tcpx::StatusOr;
using tcpx::strformat;

#define TCPX_C_SAME_CODE(c, k) \
    static_assert(static_cast<int>(c) == static_cast<int>(StatusCode::k), #c " != " #k)
TCPX_C_SAME_CODE(TCPX_OK, kOk);
TCPX_C_SAME_CODE(TCPX_ERR_INVALID_ARGUMENT, kInvalidArgument);
TCPX_C_SAME_CODE(TCPX_ERR_NOT_FOUND, kNotFound);
TCPX_C_SAME_CODE(TCPX_ERR_ALREADY_EXISTS, kAlreadyExists);
TCPX_C_SAME_CODE(TCPX_ERR_OUT_OF_RANGE, kOutOfRange);
TCPX_C_SAME_CODE(TCPX_ERR_RESOURCE_EXHAUSTED, kResourceExhausted);
TCPX_C_SAME_CODE(TCPX_ERR_FAILED_PRECONDITION, kFailedPrecondition);
TCPX_C_SAME_CODE(TCPX_ERR_UNAVAILABLE, kUnavailable);
TCPX_C_SAME_CODE(TCPX_ERR_TIMEOUT, kTimeout);
TCPX_C_SAME_CODE(TCPX_ERR_CANCELLED, kCancelled);
TCPX_C_SAME_CODE(TCPX_ERR_PROTOCOL, kProtocol);
TCPX_C_SAME_CODE(TCPX_ERR_REMOTE, kRemote);
TCPX_C_SAME_CODE(TCPX_ERR_SYSTEM, kSystem);
TCPX_C_SAME_CODE(TCPX_ERR_CUDA, kCuda);
TCPX_C_SAME_CODE(TCPX_ERR_UNIMPLEMENTED, kUnimplemented);
TCPX_C_SAME_CODE(TCPX_ERR_INTERNAL, kInternal);
TCPX_C_SAME_CODE(TCPX_ERR_UNAUTHENTICATED, kUnauthenticated);
#undef TCPX_C_SAME_CODE
static_assert(TCPX_NAME_MAX == tcpx::engine::wire::kMaxName, "TCPX_NAME_MAX is the wire's limit");

// --- errors ------------------------------------------------------------------------------------

// The last failure on this thread. When even its message cannot be built (no memory), the code's
// static name stands in.
thread_local std::string t_last_error;
thread_local const char* t_last_error_fallback = nullptr;

tcpx_status_t finish(const char* fn, Status st) noexcept {
    if (st.ok()) return TCPX_OK;
    const StatusCode code = st.code();
    try {
        t_last_error = std::move(st).with_context(fn).to_string();
        t_last_error_fallback = nullptr;
    } catch (...) {
        t_last_error_fallback = tcpx::status_code_name(code);
    }
    return static_cast<tcpx_status_t>(code);
}

// A failure that is not a Status yet (an exception was caught); never throws either.
tcpx_status_t fail(const char* fn, StatusCode code, const char* what, const char* detail) noexcept {
    try {
        return finish(fn, Status(code, std::string(what) + detail));
    } catch (...) {
        t_last_error_fallback = tcpx::status_code_name(code);
        return static_cast<tcpx_status_t>(code);
    }
}

// Runs an entry point's body (a callable returning Status) so that no exception escapes it.
template <typename Body>
tcpx_status_t guarded(const char* fn, Body&& body) noexcept {
    try {
        return finish(fn, body());
    } catch (const std::bad_alloc&) {
        return fail(fn, StatusCode::kResourceExhausted, "out of memory", "");
    } catch (const std::exception& e) {
        return fail(fn, StatusCode::kInternal, "unexpected exception: ", e.what());
    } catch (...) {
        return fail(fn, StatusCode::kInternal, "unexpected exception", "");
    }
}

Status null_argument(const char* name) {
    return tcpx::invalid_argument(std::string(name) + " is NULL");
}

// Returns INVALID_ARGUMENT from the enclosing body when pointer `p` is NULL.
#define TCPX_C_REQUIRE(p)                             \
    do {                                              \
        if ((p) == nullptr) return null_argument(#p); \
    } while (0)

// Stores the value of `v` in *out when there is one.
template <typename T>
Status deliver(StatusOr<T> v, T* out) {
    if (!v.ok()) return std::move(v).status();
    *out = std::move(v).value();
    return Status();
}

// The size-query convention of tcpx.h.
Status copy_bytes(std::string_view bytes, void* buf, size_t* len) {
    const size_t cap = *len;
    *len = bytes.size();
    if (bytes.size() > cap || (buf == nullptr && !bytes.empty())) {
        if (buf == nullptr) {
            return tcpx::resource_exhausted(
                strformat("size query: %zu bytes needed", bytes.size()));
        }
        return tcpx::resource_exhausted(
            strformat("a buffer of %zu bytes is too small: %zu needed", cap, bytes.size()));
    }
    if (!bytes.empty()) std::memcpy(buf, bytes.data(), bytes.size());
    return Status();
}

// A zero-terminated copy of `s` into `buf` of `cap` bytes.
Status copy_string(std::string_view s, char* buf, size_t cap) {
    if (s.size() >= cap) {
        return tcpx::resource_exhausted(strformat(
            "a buffer of %zu bytes cannot hold %zu bytes and a terminator", cap, s.size()));
    }
    std::memcpy(buf, s.data(), s.size());
    buf[s.size()] = '\0';
    return Status();
}

std::string_view bytes_of(const void* p, size_t len) {
    return len == 0 ? std::string_view() : std::string_view(static_cast<const char*>(p), len);
}

StatusOr<RemoteMem> parse_remote(const void* desc, size_t len, const std::string& what) {
    if (desc == nullptr) return null_argument(what.c_str());
    StatusOr<RemoteMem> m = RemoteMem::parse(bytes_of(desc, len));
    if (!m.ok()) return Status(m.status()).with_context(what);
    return m;
}

StatusOr<std::optional<std::string_view>> notification_arg(const void* notif, size_t len,
                                                           int has_notif) {
    if (has_notif == 0) return std::optional<std::string_view>();
    if (notif == nullptr && len > 0) return null_argument("notif");
    return std::optional<std::string_view>(bytes_of(notif, len));
}

StatusOr<std::vector<IoVec>> iov_arg(const tcpx_iov_t* iov, size_t count) {
    if (iov == nullptr && count > 0) return null_argument("iov");
    // Before anything is allocated for them (the engine refuses as many again).
    if (count > tcpx::engine::wire::kMaxSegments) {
        return tcpx::invalid_argument(strformat("%zu pieces exceed the limit of %zu", count,
                                                tcpx::engine::wire::kMaxSegments));
    }
    std::vector<IoVec> out(count);
    for (size_t i = 0; i < count; ++i) {
        auto remote = parse_remote(iov[i].remote_desc, iov[i].remote_desc_len,
                                   strformat("iov[%zu].remote_desc", i));
        if (!remote.ok()) return std::move(remote).status();
        out[i] = IoVec{iov[i].mem, iov[i].offset, *remote, iov[i].remote_offset, iov[i].len};
    }
    return out;
}

// A negative timeout waits for ever (milliseconds::max() to the C++ API). Not in slices that
// are called again on TIMEOUT: a transfer that failed with TIMEOUT (its peer stopped answering)
// is reported by the wait that sees it, and a second wait would find its id unknown.
template <typename Call>
auto with_timeout(int timeout_ms, Call&& call) {
    return call(timeout_ms >= 0 ? std::chrono::milliseconds(timeout_ms)
                                : std::chrono::milliseconds::max());
}

tcpx_status_t take_notification(const char* what, tcpx_endpoint_t* ep, uint64_t* peer,
                                char* peer_name, size_t name_len, void* payload,
                                size_t* payload_len);

}  // namespace

extern "C" {

const char* tcpx_status_name(tcpx_status_t status) {
    // Copied as an int: from C, `status` may hold any value, which C++ may not load as the enum.
    int code;
    static_assert(sizeof(code) == sizeof(status));
    std::memcpy(&code, &status, sizeof(code));
    return tcpx::status_code_name(static_cast<StatusCode>(code));
}

const char* tcpx_last_error(void) {
    return t_last_error_fallback != nullptr ? t_last_error_fallback : t_last_error.c_str();
}

// --- configuration -----------------------------------------------------------------------------

tcpx_status_t tcpx_config_new(tcpx_config_t** out) {
    return guarded("tcpx_config_new", [&]() -> Status {
        TCPX_C_REQUIRE(out);
        *out = new tcpx_config_t();
        return Status();
    });
}

tcpx_status_t tcpx_config_from_env(tcpx_config_t** out) {
    return guarded("tcpx_config_from_env", [&]() -> Status {
        TCPX_C_REQUIRE(out);
        TCPX_ASSIGN_OR_RETURN(Config config, Config::from_env());
        *out = new tcpx_config_t{std::move(config)};
        return Status();
    });
}

tcpx_status_t tcpx_config_set(tcpx_config_t* config, const char* name, const char* value) {
    return guarded("tcpx_config_set", [&]() -> Status {
        TCPX_C_REQUIRE(config);
        TCPX_C_REQUIRE(name);
        TCPX_C_REQUIRE(value);
        return config->config.set(name, value);
    });
}

void tcpx_config_free(tcpx_config_t* config) { delete config; }

// --- endpoints ---------------------------------------------------------------------------------

tcpx_status_t tcpx_endpoint_create(const tcpx_config_t* config, const char* name,
                                   tcpx_endpoint_t** out) {
    return guarded("tcpx_endpoint_create", [&]() -> Status {
        TCPX_C_REQUIRE(out);
        Config from_env;
        if (config == nullptr) {
            TCPX_ASSIGN_OR_RETURN(from_env, Config::from_env());
        }
        TCPX_ASSIGN_OR_RETURN(
            std::unique_ptr<Endpoint> endpoint,
            Endpoint::create(config != nullptr ? config->config : from_env, name ? name : ""));
        auto handle = std::make_unique<tcpx_endpoint_t>();
        handle->endpoint = std::move(endpoint);
        *out = handle.release();
        return Status();
    });
}

void tcpx_endpoint_destroy(tcpx_endpoint_t* ep) { delete ep; }

const char* tcpx_endpoint_name(const tcpx_endpoint_t* ep) {
    const char* name = nullptr;
    // (Through guarded: even the error for a NULL endpoint allocates.)
    (void)guarded("tcpx_endpoint_name", [&]() -> Status {
        TCPX_C_REQUIRE(ep);
        name = ep->endpoint->name().c_str();
        return Status();
    });
    return name;
}

tcpx_status_t tcpx_endpoint_metadata(const tcpx_endpoint_t* ep, void* buf, size_t* len) {
    return guarded("tcpx_endpoint_metadata", [&]() -> Status {
        TCPX_C_REQUIRE(ep);
        TCPX_C_REQUIRE(len);
        return copy_bytes(ep->endpoint->metadata(), buf, len);
    });
}

tcpx_status_t tcpx_parse_metadata(const void* md, size_t len, tcpx_endpoint_info_t* out) {
    return guarded("tcpx_parse_metadata", [&]() -> Status {
        TCPX_C_REQUIRE(md);
        TCPX_C_REQUIRE(out);
        TCPX_ASSIGN_OR_RETURN(tcpx::EndpointInfo info, Endpoint::parse_metadata(bytes_of(md, len)));
        tcpx_endpoint_info_t c{};
        TCPX_RETURN_IF_ERROR(copy_string(info.name, c.name, sizeof(c.name)));
        TCPX_RETURN_IF_ERROR(copy_string(info.host, c.host, sizeof(c.host)));
        c.port = info.port;
        c.gpu = info.gpu;
        *out = c;
        return Status();
    });
}

// --- peers -------------------------------------------------------------------------------------

tcpx_status_t tcpx_connect(tcpx_endpoint_t* ep, const void* md, size_t len, uint64_t* peer) {
    return guarded("tcpx_connect", [&]() -> Status {
        TCPX_C_REQUIRE(ep);
        TCPX_C_REQUIRE(md);
        TCPX_C_REQUIRE(peer);
        return deliver(ep->endpoint->connect(bytes_of(md, len)), peer);
    });
}

tcpx_status_t tcpx_connect_async(tcpx_endpoint_t* ep, const void* md, size_t len, uint64_t* peer) {
    return guarded("tcpx_connect_async", [&]() -> Status {
        TCPX_C_REQUIRE(ep);
        TCPX_C_REQUIRE(md);
        TCPX_C_REQUIRE(peer);
        return deliver(ep->endpoint->connect_async(bytes_of(md, len)), peer);
    });
}

tcpx_status_t tcpx_accept(tcpx_endpoint_t* ep, int timeout_ms, uint64_t* peer) {
    return guarded("tcpx_accept", [&]() -> Status {
        TCPX_C_REQUIRE(ep);
        TCPX_C_REQUIRE(peer);
        return deliver(
            with_timeout(timeout_ms,
                         [&](std::chrono::milliseconds t) { return ep->endpoint->accept(t); }),
            peer);
    });
}

tcpx_status_t tcpx_disconnect(tcpx_endpoint_t* ep, uint64_t peer) {
    return guarded("tcpx_disconnect", [&]() -> Status {
        TCPX_C_REQUIRE(ep);
        return ep->endpoint->disconnect(peer);
    });
}

tcpx_status_t tcpx_peer_name(const tcpx_endpoint_t* ep, uint64_t peer, char* buf, size_t len) {
    return guarded("tcpx_peer_name", [&]() -> Status {
        TCPX_C_REQUIRE(ep);
        TCPX_C_REQUIRE(buf);
        TCPX_ASSIGN_OR_RETURN(std::string name, ep->endpoint->peer_name(peer));
        return copy_string(name, buf, len);
    });
}

tcpx_status_t tcpx_peer_matches(const tcpx_endpoint_t* ep, uint64_t peer, const void* md,
                                size_t len) {
    return guarded("tcpx_peer_matches", [&]() -> Status {
        TCPX_C_REQUIRE(ep);
        TCPX_C_REQUIRE(md);
        return ep->endpoint->peer_matches(peer,
                                          std::string_view(static_cast<const char*>(md), len));
    });
}

tcpx_status_t tcpx_peer_status(tcpx_endpoint_t* ep, uint64_t peer) {
    return guarded("tcpx_peer_status", [&]() -> Status {
        TCPX_C_REQUIRE(ep);
        return ep->endpoint->peer_status(peer);
    });
}

namespace {
void to_c(const Stats& s, tcpx_stats_t* out) {
    *out = tcpx_stats_t{s.bytes_sent,
                        s.bytes_received,
                        s.transfers_started,
                        s.transfers_completed,
                        s.transfers_failed,
                        s.requests_served,
                        s.errors,
                        s.retries,
                        s.window_blocked_ns,
                        s.staging_waits,
                        s.staging_bytes,
                        s.staging_peak_bytes};
}
}  // namespace

tcpx_status_t tcpx_endpoint_stats(const tcpx_endpoint_t* ep, tcpx_stats_t* out) {
    return guarded("tcpx_endpoint_stats", [&]() -> Status {
        TCPX_C_REQUIRE(ep);
        TCPX_C_REQUIRE(out);
        to_c(ep->endpoint->stats(), out);
        return Status();
    });
}

tcpx_status_t tcpx_peer_stats(const tcpx_endpoint_t* ep, uint64_t peer, tcpx_stats_t* out) {
    return guarded("tcpx_peer_stats", [&]() -> Status {
        TCPX_C_REQUIRE(ep);
        TCPX_C_REQUIRE(out);
        TCPX_ASSIGN_OR_RETURN(Stats s, ep->endpoint->peer_stats(peer));
        to_c(s, out);
        return Status();
    });
}

// --- memory ------------------------------------------------------------------------------------

tcpx_status_t tcpx_reg(tcpx_endpoint_t* ep, void* ptr, size_t len, uint64_t* mem) {
    return guarded("tcpx_reg", [&]() -> Status {
        TCPX_C_REQUIRE(ep);
        TCPX_C_REQUIRE(ptr);
        TCPX_C_REQUIRE(mem);
        return deliver(ep->endpoint->reg(ptr, len), mem);
    });
}

tcpx_status_t tcpx_dereg(tcpx_endpoint_t* ep, uint64_t mem) {
    return guarded("tcpx_dereg", [&]() -> Status {
        TCPX_C_REQUIRE(ep);
        return ep->endpoint->dereg(mem);
    });
}

tcpx_status_t tcpx_mem_descriptor(const tcpx_endpoint_t* ep, uint64_t mem, void* buf, size_t* len) {
    return guarded("tcpx_mem_descriptor", [&]() -> Status {
        TCPX_C_REQUIRE(ep);
        TCPX_C_REQUIRE(len);
        TCPX_ASSIGN_OR_RETURN(RemoteMem m, ep->endpoint->describe(mem));
        return copy_bytes(m.serialize(), buf, len);
    });
}

// --- one-sided ---------------------------------------------------------------------------------

tcpx_status_t tcpx_write(tcpx_endpoint_t* ep, uint64_t peer, uint64_t mem, uint64_t offset,
                         const void* remote_desc, size_t remote_desc_len, uint64_t remote_offset,
                         uint64_t len, const void* notif, size_t notif_len, int has_notif,
                         uint64_t* xfer) {
    return guarded("tcpx_write", [&]() -> Status {
        TCPX_C_REQUIRE(ep);
        TCPX_C_REQUIRE(xfer);
        TCPX_ASSIGN_OR_RETURN(RemoteMem remote,
                              parse_remote(remote_desc, remote_desc_len, "remote_desc"));
        TCPX_ASSIGN_OR_RETURN(auto n, notification_arg(notif, notif_len, has_notif));
        return deliver(ep->endpoint->write(peer, mem, offset, remote, remote_offset, len, n), xfer);
    });
}

tcpx_status_t tcpx_read(tcpx_endpoint_t* ep, uint64_t peer, uint64_t mem, uint64_t offset,
                        const void* remote_desc, size_t remote_desc_len, uint64_t remote_offset,
                        uint64_t len, const void* notif, size_t notif_len, int has_notif,
                        uint64_t* xfer) {
    return guarded("tcpx_read", [&]() -> Status {
        TCPX_C_REQUIRE(ep);
        TCPX_C_REQUIRE(xfer);
        TCPX_ASSIGN_OR_RETURN(RemoteMem remote,
                              parse_remote(remote_desc, remote_desc_len, "remote_desc"));
        TCPX_ASSIGN_OR_RETURN(auto n, notification_arg(notif, notif_len, has_notif));
        return deliver(ep->endpoint->read(peer, mem, offset, remote, remote_offset, len, n), xfer);
    });
}

tcpx_status_t tcpx_writev(tcpx_endpoint_t* ep, uint64_t peer, const tcpx_iov_t* iov, size_t count,
                          const void* notif, size_t notif_len, int has_notif, uint64_t* xfer) {
    return guarded("tcpx_writev", [&]() -> Status {
        TCPX_C_REQUIRE(ep);
        TCPX_C_REQUIRE(xfer);
        TCPX_ASSIGN_OR_RETURN(std::vector<IoVec> v, iov_arg(iov, count));
        TCPX_ASSIGN_OR_RETURN(auto n, notification_arg(notif, notif_len, has_notif));
        return deliver(ep->endpoint->writev(peer, v, n), xfer);
    });
}

tcpx_status_t tcpx_readv(tcpx_endpoint_t* ep, uint64_t peer, const tcpx_iov_t* iov, size_t count,
                         const void* notif, size_t notif_len, int has_notif, uint64_t* xfer) {
    return guarded("tcpx_readv", [&]() -> Status {
        TCPX_C_REQUIRE(ep);
        TCPX_C_REQUIRE(xfer);
        TCPX_ASSIGN_OR_RETURN(std::vector<IoVec> v, iov_arg(iov, count));
        TCPX_ASSIGN_OR_RETURN(auto n, notification_arg(notif, notif_len, has_notif));
        return deliver(ep->endpoint->readv(peer, v, n), xfer);
    });
}

// --- notifications -----------------------------------------------------------------------------

tcpx_status_t tcpx_notify(tcpx_endpoint_t* ep, uint64_t peer, const void* payload, size_t len) {
    return guarded("tcpx_notify", [&]() -> Status {
        TCPX_C_REQUIRE(ep);
        if (payload == nullptr && len > 0) return null_argument("payload");
        return ep->endpoint->notify(peer, bytes_of(payload, len));
    });
}

tcpx_status_t tcpx_get_notification(tcpx_endpoint_t* ep, char* peer_name, size_t name_len,
                                    void* payload, size_t* payload_len) {
    return take_notification("tcpx_get_notification", ep, nullptr, peer_name, name_len, payload,
                             payload_len);
}

tcpx_status_t tcpx_get_notification_from(tcpx_endpoint_t* ep, uint64_t* peer, char* peer_name,
                                         size_t name_len, void* payload, size_t* payload_len) {
    return take_notification("tcpx_get_notification_from", ep, peer, peer_name, name_len, payload,
                             payload_len);
}

}  // extern "C"

namespace {

// Both calls of the notification queue (the sender's id is what the second adds).
tcpx_status_t take_notification(const char* what, tcpx_endpoint_t* ep, uint64_t* peer,
                                char* peer_name, size_t name_len, void* payload,
                                size_t* payload_len) {
    return guarded(what, [&]() -> Status {
        TCPX_C_REQUIRE(ep);
        TCPX_C_REQUIRE(payload_len);
        std::lock_guard<std::mutex> lock(ep->mu);
        // (Taken by a move: an allocation that fails here loses nothing.)
        if (ep->pending.empty()) ep->pending = ep->endpoint->get_notifications(1);
        if (ep->pending.empty()) return tcpx::not_found("no notification");
        const tcpx::Notification& n = ep->pending.front();
        // Both checked before either is copied: a notification that does not fit stays whole.
        if (peer_name != nullptr && n.peer.size() >= name_len) {
            *payload_len = n.payload.size();
            return tcpx::resource_exhausted(strformat(
                "a name buffer of %zu bytes cannot hold the sender's name of %zu bytes and a "
                "terminator",
                name_len, n.peer.size()));
        }
        TCPX_RETURN_IF_ERROR(copy_bytes(n.payload, payload, payload_len));
        if (peer_name != nullptr) TCPX_RETURN_IF_ERROR(copy_string(n.peer, peer_name, name_len));
        if (peer != nullptr) *peer = n.peer_id;
        ep->pending.clear();
        return Status();
    });
}

}  // namespace

extern "C" {

// --- two-sided ---------------------------------------------------------------------------------

tcpx_status_t tcpx_send(tcpx_endpoint_t* ep, uint64_t peer, uint64_t mem, uint64_t offset,
                        uint64_t len, uint64_t tag, uint64_t* xfer) {
    return guarded("tcpx_send", [&]() -> Status {
        TCPX_C_REQUIRE(ep);
        TCPX_C_REQUIRE(xfer);
        return deliver(ep->endpoint->send(peer, mem, offset, len, tag), xfer);
    });
}

tcpx_status_t tcpx_recv(tcpx_endpoint_t* ep, uint64_t peer, uint64_t mem, uint64_t offset,
                        uint64_t len, uint64_t tag, uint64_t* xfer) {
    return guarded("tcpx_recv", [&]() -> Status {
        TCPX_C_REQUIRE(ep);
        TCPX_C_REQUIRE(xfer);
        return deliver(ep->endpoint->recv(peer, mem, offset, len, tag), xfer);
    });
}

// --- completion --------------------------------------------------------------------------------

tcpx_status_t tcpx_poll(tcpx_endpoint_t* ep, uint64_t xfer, int* done) {
    // Finished unless seen in flight below: every failure of this call is of a transfer that is
    // not in flight (an unknown id, a failed transfer; out of memory can only come while taking
    // a finished transfer's report) or of its arguments.
    if (done != nullptr) *done = 1;
    return guarded("tcpx_poll", [&]() -> Status {
        TCPX_C_REQUIRE(ep);
        TCPX_C_REQUIRE(done);
        tcpx::XferStatus st = ep->endpoint->poll(xfer);
        *done = st.state == tcpx::XferState::kInProgress ? 0 : 1;
        if (st.state != tcpx::XferState::kFailed) return Status();
        if (st.error.ok()) return tcpx::internal_error("a failed transfer without an error");
        return st.error;
    });
}

tcpx_status_t tcpx_wait(tcpx_endpoint_t* ep, uint64_t xfer, int timeout_ms) {
    return guarded("tcpx_wait", [&]() -> Status {
        TCPX_C_REQUIRE(ep);
        return with_timeout(
            timeout_ms, [&](std::chrono::milliseconds t) { return ep->endpoint->wait(xfer, t); });
    });
}

tcpx_status_t tcpx_cancel(tcpx_endpoint_t* ep, uint64_t xfer) {
    return guarded("tcpx_cancel", [&]() -> Status {
        TCPX_C_REQUIRE(ep);
        return ep->endpoint->cancel(xfer);
    });
}

}  // extern "C"
