#include "common/status_util.h"

#include <cerrno>
#include <cstring>

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

}  // namespace tcpx
