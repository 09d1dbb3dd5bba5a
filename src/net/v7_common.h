// What both directions of the v7 bridge share: status translation and logger bridging.
// socket/socket_v7.cc exports a Net as a v7 table; plugin/v7_net.cc wraps a v7 table as a Net.
#pragma once

#include <string_view>

#include "net/ncclnet_v7.h"
#include "net/net.h"
#include "tcpx/status.h"

namespace tcpx::net {

// A Status as an ncclResult_t. Non-OK statuses are logged here, once, with their message: the
// C ABI can carry only the code. `what` names the entry point for the log line.
tcpx_ncclResult_t to_nccl_result(const Status& status, std::string_view what);

// Inside a catch block: the exception as an ncclResult_t (ncclSystemError for out of memory,
// ncclInternalError otherwise), logged. Never throws.
tcpx_ncclResult_t nccl_result_of_current_exception() noexcept;

// `guarded<fn>`: the entry point `fn` with no exception leaving it, for the tables NCCL calls
// through. NCCL is not ready for one (an exception in its proxy thread ends the process), and a
// plugin must never take the application down: out of memory becomes an error result.
template <auto Fn>
struct Guarded;
template <typename... Args, tcpx_ncclResult_t (*Fn)(Args...)>
struct Guarded<Fn> {
    static tcpx_ncclResult_t call(Args... args) noexcept {
        try {
            return Fn(args...);
        } catch (...) {
            return nccl_result_of_current_exception();
        }
    }
};
template <auto Fn>
inline constexpr auto guarded = &Guarded<Fn>::call;

// An ncclResult_t as a Status; `what` says which call returned it.
Status from_nccl_result(tcpx_ncclResult_t result, std::string_view what);
// Whether a plugin's call succeeded: ncclInProgress is no error (NCCL reads the call's outputs
// after it as after ncclSuccess).
inline bool nccl_call_ok(tcpx_ncclResult_t result) {
    return result == tcpx_ncclSuccess || result == tcpx_ncclInProgress;
}

// v7 properties <-> Properties. v7 has no max_requests / reports_sizes: from_v7 leaves them at
// their defaults. to_v7 points name/pciPath at the caller's strings, which must outlive `out`.
Properties from_v7(const tcpx_ncclNetProperties_v7_t& in);
void to_v7(const Properties& in, const char* name, const char* pci_path,
           tcpx_ncclNetProperties_v7_t* out);

// Routes this library's log messages to NCCL's logger (level and the NET subsystem flag
// mapped). A null logger restores the default sink.
void forward_log_to_nccl(tcpx_ncclDebugLogger_t logger);

// A logger to hand to an ncclNet plugin's init(): it feeds the plugin's messages into this
// library's log (NCCL WARN -> warn, INFO -> debug, TRACE -> trace), prefixed "net plugin:", each
// source line of the plugin rate-limited by plugin_log_limiter() (plugin/log_limiter.h).
tcpx_ncclDebugLogger_t nccl_logger_into_tcpx_log();

}  // namespace tcpx::net
