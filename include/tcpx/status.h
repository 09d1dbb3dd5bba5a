// tcpx/status.h — the error type of every tcpx-p2p call.
//
// A Status is a code plus a message that says what was attempted and why it failed, e.g.
// "connect to 10.0.0.7:43121: Connection refused". Callers add context as the status travels up
// (with_context), so the message a user finally sees reads from the outermost operation inwards.
// An OK status carries nothing and costs one null pointer.
#pragma once

#include <memory>
#include <new>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

#include "tcpx/api.h"

namespace tcpx {

enum class StatusCode : int {
    kOk = 0,
    kInvalidArgument = 1,     // the caller passed something wrong
    kNotFound = 2,            // no such object (mem_id, peer, transfer, interface)
    kAlreadyExists = 3,       // the object exists already
    kOutOfRange = 4,          // offset/length outside a registration or limit
    kResourceExhausted = 5,   // a bounded resource is full; retry later
    kFailedPrecondition = 6,  // the object is in the wrong state (closed, failed)
    kUnavailable = 7,         // the peer or connection is unreachable or was lost; or not yet
                              // (cancel() of a transfer still landing: it ends by itself)
    kTimeout = 8,             // a deadline passed
    kCancelled = 9,           // the operation was cancelled or its object closed
    kProtocol = 10,           // the peer sent something the protocol does not allow
    kRemote = 11,             // the peer reported an error for this operation
    kSystem = 12,             // an operating-system call failed
    kCuda = 13,               // a CUDA call failed
    kUnimplemented = 14,      // not supported by this build or transport
    kInternal = 15,           // a bug in tcpx-p2p
    kUnauthenticated = 16,    // the peer failed authentication (or this endpoint failed the peer's)
};

// "INVALID_ARGUMENT", "UNAVAILABLE", ... ; "UNKNOWN" for values outside the enum.
TCPX_API const char* status_code_name(StatusCode code);

class [[nodiscard]] TCPX_API Status {
 public:
    // An OK status.
    Status() noexcept = default;
    // A status with `code`; `code` kOk ignores the message and yields OK.
    Status(StatusCode code, std::string_view message);

    Status(const Status& other);
    Status& operator=(const Status& other);
    Status(Status&&) noexcept = default;
    Status& operator=(Status&&) noexcept = default;
    ~Status() = default;

    bool ok() const { return rep_ == nullptr; }
    StatusCode code() const { return rep_ ? rep_->code : StatusCode::kOk; }
    // The message without the code; empty for OK.
    std::string_view message() const { return rep_ ? std::string_view(rep_->message) : ""; }
    // "OK" or "<CODE>: <message>".
    std::string to_string() const;

    // Prepends "context: " to the message of a non-OK status; OK stays OK.
    Status& with_context(std::string_view context) &;
    Status&& with_context(std::string_view context) &&;

    friend bool operator==(const Status& a, const Status& b) {
        return a.code() == b.code() && a.message() == b.message();
    }

 private:
    struct Rep {
        StatusCode code;
        std::string message;
    };
    std::unique_ptr<Rep> rep_;
};

// StatusOr<T> holds either a value or a non-OK Status explaining why there is none.
template <typename T>
class [[nodiscard]] StatusOr {
    static_assert(!std::is_same_v<std::remove_cv_t<T>, Status>, "StatusOr<Status> is ambiguous");

 public:
    // From an error. An OK status here is a bug in the caller and becomes kInternal.
    StatusOr(Status status) : status_(std::move(status)) {  // NOLINT(google-explicit-constructor)
        if (status_.ok()) status_ = Status(StatusCode::kInternal, "StatusOr built from OK status");
    }
    StatusOr(const T& value) : has_value_(true) {  // NOLINT(google-explicit-constructor)
        new (&storage_) T(value);
    }
    StatusOr(T&& value) : has_value_(true) {  // NOLINT(google-explicit-constructor)
        new (&storage_) T(std::move(value));
    }
    StatusOr(const StatusOr& other) : status_(other.status_), has_value_(other.has_value_) {
        if (has_value_) new (&storage_) T(*other.ptr());
    }
    StatusOr(StatusOr&& other) noexcept(std::is_nothrow_move_constructible_v<T>)
        : status_(std::move(other.status_)), has_value_(other.has_value_) {
        if (has_value_) new (&storage_) T(std::move(*other.ptr()));
    }
    StatusOr& operator=(StatusOr other) noexcept(std::is_nothrow_move_constructible_v<T>) {
        reset();
        status_ = std::move(other.status_);
        has_value_ = other.has_value_;
        if (has_value_) new (&storage_) T(std::move(*other.ptr()));
        return *this;
    }
    ~StatusOr() { reset(); }

    bool ok() const { return has_value_; }
    const Status& status() const& { return status_; }
    Status status() && { return std::move(status_); }

    // Precondition: ok().
    T& value() & { return *ptr(); }
    const T& value() const& { return *ptr(); }
    T&& value() && { return std::move(*ptr()); }
    T& operator*() & { return *ptr(); }
    const T& operator*() const& { return *ptr(); }
    T* operator->() { return ptr(); }
    const T* operator->() const { return ptr(); }

 private:
    T* ptr() { return std::launder(reinterpret_cast<T*>(&storage_)); }
    const T* ptr() const { return std::launder(reinterpret_cast<const T*>(&storage_)); }
    void reset() {
        if (has_value_) ptr()->~T();
        has_value_ = false;
    }

    Status status_;
    bool has_value_ = false;
    alignas(T) unsigned char storage_[sizeof(T)];
};

}  // namespace tcpx
