#include "tcpx/status.h"

namespace tcpx {

const char* status_code_name(StatusCode code) {
    switch (code) {
        case StatusCode::kOk:
            return "OK";
        case StatusCode::kInvalidArgument:
            return "INVALID_ARGUMENT";
        case StatusCode::kNotFound:
            return "NOT_FOUND";
        case StatusCode::kAlreadyExists:
            return "ALREADY_EXISTS";
        case StatusCode::kOutOfRange:
            return "OUT_OF_RANGE";
        case StatusCode::kResourceExhausted:
            return "RESOURCE_EXHAUSTED";
        case StatusCode::kFailedPrecondition:
            return "FAILED_PRECONDITION";
        case StatusCode::kUnavailable:
            return "UNAVAILABLE";
        case StatusCode::kTimeout:
            return "TIMEOUT";
        case StatusCode::kCancelled:
            return "CANCELLED";
        case StatusCode::kProtocol:
            return "PROTOCOL";
        case StatusCode::kRemote:
            return "REMOTE";
        case StatusCode::kSystem:
            return "SYSTEM";
        case StatusCode::kCuda:
            return "CUDA";
        case StatusCode::kUnimplemented:
            return "UNIMPLEMENTED";
        case StatusCode::kInternal:
            return "INTERNAL";
        case StatusCode::kUnauthenticated:
            return "UNAUTHENTICATED";
    }
    return "UNKNOWN";
}

Status::Status(StatusCode code, std::string_view message) {
    if (code != StatusCode::kOk) rep_ = std::make_unique<Rep>(Rep{code, std::string(message)});
}

Status::Status(const Status& other)
    : rep_(other.rep_ ? std::make_unique<Rep>(*other.rep_) : nullptr) {}

Status& Status::operator=(const Status& other) {
    if (this != &other) rep_ = other.rep_ ? std::make_unique<Rep>(*other.rep_) : nullptr;
    return *this;
}

std::string Status::to_string() const {
    if (ok()) return "OK";
    std::string out = status_code_name(rep_->code);
    out += ": ";
    out += rep_->message;
    return out;
}

Status& Status::with_context(std::string_view context) & {
    if (rep_ && !context.empty()) {
        std::string msg;
        msg.reserve(context.size() + 2 + rep_->message.size());
        msg.append(context).append(": ").append(rep_->message);
        rep_->message = std::move(msg);
    }
    return *this;
}

Status&& Status::with_context(std::string_view context) && {
    with_context(context);
    return std::move(*this);
}

}  // namespace tcpx
