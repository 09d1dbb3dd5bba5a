#include "net/v7_common.h"

#include <cstdarg>
#include <cstdio>
#include <mutex>
#include <string>

#include "common/log.h"
#include "common/status_util.h"
#include "common/strings.h"
#include "net/plugin/log_limiter.h"

namespace tcpx::net {
namespace {

void plugin_vlog(int level, unsigned long /*flags*/, const char* file, int line, const char* fmt,
                 va_list args) {
    LogLevel ours = LogLevel::kDebug;
    switch (level) {
        case TCPX_NCCL_LOG_WARN:
        case TCPX_NCCL_LOG_ABORT:
            ours = LogLevel::kWarn;
            break;
        case TCPX_NCCL_LOG_TRACE:
            ours = LogLevel::kTrace;
            break;
        case TCPX_NCCL_LOG_NONE:
            return;
        default:
            ours = LogLevel::kDebug;
            break;
    }
    if (!log_enabled(ours)) return;
    if (file == nullptr) file = "plugin";
    // Some plugins log in their data path (Google's: a WARN per host receive).
    const LogRateLimiter::Verdict verdict = plugin_log_limiter().admit(file, line);
    if (verdict.suppressed > 0) {
        log_message(ours, file, line,
                    "net plugin: %llu more lines from %s:%d suppressed in %lld ms "
                    "(TCPX_P2P_PLUGIN_LOG_BURST)",
                    static_cast<unsigned long long>(verdict.suppressed), file, line,
                    static_cast<long long>(plugin_log_limiter().interval_ms()));
    }
    if (!verdict.print) return;
    char buf[1024];
    if (fmt == nullptr) fmt = "(a line without a format)";  // (vsnprintf would read address 0)
    std::vsnprintf(buf, sizeof(buf), fmt, args);
    log_message(ours, file, line, "net plugin: %s", buf);
}

// Called by the plugin through a C function pointer: nothing may leave it (an allocation that
// fails in the rate limiter or the log drops the line).
void plugin_log(int level, unsigned long flags, const char* file, int line, const char* fmt,
                ...) noexcept {
    va_list args;
    va_start(args, fmt);
    try {
        plugin_vlog(level, flags, file, line, fmt, args);
    } catch (...) {
    }
    va_end(args);
}

}  // namespace

tcpx_ncclResult_t to_nccl_result(const Status& status, std::string_view what) {
    if (status.ok()) return tcpx_ncclSuccess;
    TCPX_WARN("%.*s: %s", static_cast<int>(what.size()), what.data(), status.to_string().c_str());
    switch (status.code()) {
        case StatusCode::kInvalidArgument:
        case StatusCode::kOutOfRange:
            return tcpx_ncclInvalidArgument;
        case StatusCode::kFailedPrecondition:
        case StatusCode::kUnimplemented:
            return tcpx_ncclInvalidUsage;
        case StatusCode::kUnavailable:
        case StatusCode::kTimeout:
        case StatusCode::kProtocol:
        case StatusCode::kRemote:
        case StatusCode::kCancelled:
            return tcpx_ncclRemoteError;
        case StatusCode::kSystem:
            return tcpx_ncclSystemError;
        case StatusCode::kCuda:
            return tcpx_ncclUnhandledCudaError;
        default:
            return tcpx_ncclInternalError;
    }
}

tcpx_ncclResult_t nccl_result_of_current_exception() noexcept {
    try {
        const Status st = status_of_current_exception("NCCL plugin call");
        (void)to_nccl_result(st, "NCCL plugin");  // logs it
        return st.code() == StatusCode::kResourceExhausted ? tcpx_ncclSystemError
                                                           : tcpx_ncclInternalError;
    } catch (...) {
        TCPX_ERROR("NCCL plugin call: out of memory");  // not even for the message
        return tcpx_ncclSystemError;
    }
}

Status from_nccl_result(tcpx_ncclResult_t result, std::string_view what) {
    const std::string w(what);
    switch (result) {
        case tcpx_ncclSuccess:
        case tcpx_ncclInProgress:
            return Status();
        case tcpx_ncclUnhandledCudaError:
            return Status(StatusCode::kCuda, w + ": CUDA error (see the plugin's log)");
        case tcpx_ncclSystemError:
            return Status(StatusCode::kSystem, w + ": system error (see the plugin's log)");
        case tcpx_ncclInvalidArgument:
            return Status(StatusCode::kInvalidArgument, w + ": invalid argument");
        case tcpx_ncclInvalidUsage:
            return Status(StatusCode::kFailedPrecondition, w + ": invalid usage");
        case tcpx_ncclRemoteError:
            return Status(StatusCode::kUnavailable, w + ": remote error (peer or connection)");
        case tcpx_ncclInternalError:
            return Status(StatusCode::kInternal, w + ": internal error in the plugin");
    }
    return Status(StatusCode::kInternal,
                  strformat("%s: unknown result %d", w.c_str(), static_cast<int>(result)));
}

Properties from_v7(const tcpx_ncclNetProperties_v7_t& in) {
    Properties out;
    out.name = in.name != nullptr ? in.name : "";
    out.pci_path = in.pciPath != nullptr ? in.pciPath : "";
    out.guid = in.guid;
    out.ptr_support = in.ptrSupport;
    out.speed_mbps = in.speed;
    out.port = in.port;
    out.latency_us = in.latency;
    out.max_comms = in.maxComms;
    out.max_recvs = in.maxRecvs;
    out.device_type = static_cast<DeviceType>(in.netDeviceType);
    out.device_version = in.netDeviceVersion;
    return out;
}

void to_v7(const Properties& in, const char* name, const char* pci_path,
           tcpx_ncclNetProperties_v7_t* out) {
    *out = tcpx_ncclNetProperties_v7_t{};
    out->name = const_cast<char*>(name);
    out->pciPath = const_cast<char*>(pci_path);
    out->guid = in.guid;
    out->ptrSupport = in.ptr_support;
    out->speed = in.speed_mbps;
    out->port = in.port;
    out->latency = in.latency_us;
    out->maxComms = in.max_comms;
    out->maxRecvs = in.max_recvs;
    out->netDeviceType = static_cast<int>(in.device_type);
    out->netDeviceVersion = in.device_version;
}

void forward_log_to_nccl(tcpx_ncclDebugLogger_t logger) {
    if (logger == nullptr) {
        set_log_sink(nullptr);
        return;
    }
    set_log_sink([logger](LogLevel level, const char* file, int line, std::string_view message) {
        int nccl_level = TCPX_NCCL_LOG_INFO;
        if (level >= LogLevel::kWarn) {
            nccl_level = TCPX_NCCL_LOG_WARN;
        } else if (level == LogLevel::kTrace) {
            nccl_level = TCPX_NCCL_LOG_TRACE;
        }
        // (No copy: the logger may run where memory has run out, from a catch handler.)
        logger(nccl_level, TCPX_NCCL_NET_FLAG, file, line, "%.*s", static_cast<int>(message.size()),
               message.data());
    });
}

tcpx_ncclDebugLogger_t nccl_logger_into_tcpx_log() { return &plugin_log; }

}  // namespace tcpx::net
