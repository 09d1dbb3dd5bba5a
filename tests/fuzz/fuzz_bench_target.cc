// The target of `tcpx-p2p bench engine` on arbitrary side-channel bytes. With --listen its commands
// come from the network (harness/roles.h): the bytes go through the channel's line framing
// (FdChannel, from a pipe), serve_commands and the target's dispatch, which create endpoints,
// register and fill memory, parse hex descriptors and KV shapes and answer the raw baseline's
// commands, all for real. The limits are small (two endpoints, 1 MiB per memory type, waits of a
// few milliseconds) so that an input runs in milliseconds; the code is the one that runs with the
// defaults.
// Input: one byte (its low bit: --bidir; the next: endpoints without a progress thread, which the
// target polls between commands), then the command stream, lines of words.
#include <fcntl.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>

#include "bench/engine/target.h"
#include "bench/harness/roles.h"
#include "common/log.h"
#include "fuzz_check.h"
#include "tcpx/config.h"

namespace {

// A pipe's buffer takes this much without a reader, so the whole stream is written first.
constexpr size_t kMaxStream = 60 * 1024;

tcpx::Config target_config(bool polled) {
    tcpx::Config c;
    c.progress_thread = polled ? "off" : "on";
    c.socket_ifname = "=lo";
    c.socket_family = "ipv4";
    c.nsocks = 1;
    c.io_threads = 1;
    c.channels = 1;
    c.connect_timeout_ms = 100;
    c.handshake_timeout_ms = 100;
    return c;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
    // Endpoints refusing what the commands ask say so at warn: not news here.
    tcpx::set_log_level(tcpx::LogLevel::kError);
    return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    if (size < 1 || size - 1 > kMaxStream) return 0;
    const bool bidir = (data[0] & 1) != 0;
    const bool polled = (data[0] & 2) != 0;
    int fds[2];
    FUZZ_CHECK(::pipe2(fds, O_CLOEXEC) == 0);
    for (size_t at = 1; at < size;) {
        const ssize_t n = ::write(fds[1], data + at, size - at);
        FUZZ_CHECK(n > 0);
        at += static_cast<size_t>(n);
    }
    ::close(fds[1]);  // the stream ends where the input does
    const int out = ::open("/dev/null", O_WRONLY | O_CLOEXEC);
    FUZZ_CHECK(out >= 0);
    {
        tcpx::bench::FdChannel ch(fds[0], out, /*timeout_ms=*/1000);
        tcpx::bench::engine_bench::TargetLimits limits;
        limits.endpoints = 2;
        limits.side_bytes = 1 << 20;
        limits.accept_ms = 5;
        limits.raw_wait_ms = 5;
        const tcpx::Status st = tcpx::bench::engine_bench::serve_targets(target_config(polled),
                                                                         "=lo", bidir, &ch, limits);
        // "quit", or the end of the stream (or a line past kMaxLineBytes): nothing else ends it.
        FUZZ_CHECK(st.ok() || st.code() == tcpx::StatusCode::kUnavailable);
    }
    ::close(out);
    ::close(fds[0]);
    return 0;
}
