#include "common/status_util.h"

#include <cerrno>
#include <cstring>
#include <exception>
#include <new>

namespace tcpx {

Status errno_status(int err, std::string_view what) {
    char buf[128];
    // GNU strerror_r returns the message, which may or may not live in buf.
    const char* text = strerror_r(err, buf, sizeof(buf));
    StatusCode code = StatusCode::kSystem;
    switch (err) {
        case ECONNREFUSED:
        case ECONNRESET:
        case ECONNABORTED:
        case EPIPE:
        case ETIMEDOUT:
        case EHOSTUNREACH:
        case EHOSTDOWN:
        case ENETUNREACH:
        case ENETDOWN:
        case ENOTCONN:
            code = StatusCode::kUnavailable;
            break;
        default:
            break;
    }
    return Status(code, strformat("%.*s: %s", static_cast<int>(what.size()), what.data(), text));
}

Status status_of_current_exception(std::string_view where) {
    const int n = static_cast<int>(where.size());
    try {
        throw;
    } catch (const std::bad_alloc&) {
        return resource_exhausted(strformat("%.*s: out of memory", n, where.data()));
    } catch (const std::exception& e) {
        return internal_error(
            strformat("%.*s: unexpected exception: %s", n, where.data(), e.what()));
    } catch (...) {
        return internal_error(strformat("%.*s: unexpected exception", n, where.data()));
    }
}

}  // namespace tcpx
