// Internal helpers around tcpx::Status: constructors per code, errno translation and the
// propagation macros. Not part of the public API.
#pragma once

#include <string>
#include <string_view>

#include "common/strings.h"
#include "tcpx/status.h"

namespace tcpx {

inline Status invalid_argument(std::string_view msg) {
    return Status(StatusCode::kInvalidArgument, msg);
}
inline Status not_found(std::string_view msg) { return Status(StatusCode::kNotFound, msg); }
inline Status out_of_range(std::string_view msg) { return Status(StatusCode::kOutOfRange, msg); }
inline Status resource_exhausted(std::string_view msg) {
    return Status(StatusCode::kResourceExhausted, msg);
}
inline Status failed_precondition(std::string_view msg) {
    return Status(StatusCode::kFailedPrecondition, msg);
}
inline Status unavailable(std::string_view msg) { return Status(StatusCode::kUnavailable, msg); }
inline Status timeout_error(std::string_view msg) { return Status(StatusCode::kTimeout, msg); }
inline Status cancelled(std::string_view msg) { return Status(StatusCode::kCancelled, msg); }
inline Status protocol_error(std::string_view msg) { return Status(StatusCode::kProtocol, msg); }
inline Status remote_error(std::string_view msg) { return Status(StatusCode::kRemote, msg); }
inline Status unimplemented(std::string_view msg) {
    return Status(StatusCode::kUnimplemented, msg);
}
inline Status internal_error(std::string_view msg) { return Status(StatusCode::kInternal, msg); }
inline Status unauthenticated(std::string_view msg) {
    return Status(StatusCode::kUnauthenticated, msg);
}

// "<what>: <strerror(err)>", coded kUnavailable for errors that mean the peer or the path to it
// is gone (refused, reset, unreachable, timed out) and kSystem for the rest.
Status errno_status(int err, std::string_view what);

// Inside a catch block: the exception being handled as a Status, "<where>: ..." coded
// kResourceExhausted for std::bad_alloc (out of memory) and kInternal for anything else. No
// exception leaves the library's own threads or its C and plugin entry points: each boundary
// turns one into an error here. Building the Status allocates, so this can throw bad_alloc
// itself; a boundary that must not throw guards that too.
Status status_of_current_exception(std::string_view where);

}  // namespace tcpx

#define TCPX_STATUS_CONCAT_INNER(a, b) a##b
#define TCPX_STATUS_CONCAT(a, b) TCPX_STATUS_CONCAT_INNER(a, b)

// Returns the status of `expr` from the enclosing function when it is not OK. (Unique names per
// expansion, so the macros nest, e.g. inside a lambda passed to another.)
#define TCPX_RETURN_IF_ERROR(expr) \
    TCPX_RETURN_IF_ERROR_IMPL(TCPX_STATUS_CONCAT(tcpx_status_, __COUNTER__), expr)
#define TCPX_RETURN_IF_ERROR_IMPL(tmp, expr) \
    do {                                     \
        ::tcpx::Status tmp = (expr);         \
        if (!tmp.ok()) return tmp;           \
    } while (0)

// `lhs = value of expr`, or returns its status from the enclosing function.
#define TCPX_ASSIGN_OR_RETURN(lhs, expr) \
    TCPX_ASSIGN_OR_RETURN_IMPL(TCPX_STATUS_CONCAT(tcpx_statusor_, __COUNTER__), lhs, expr)
#define TCPX_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
    auto tmp = (expr);                             \
    if (!tmp.ok()) return std::move(tmp).status(); \
    lhs = std::move(tmp).value()
