// The engine's control-connection framing (engine::CtrlConn: read + next_message) on an
// arbitrary byte stream, each message it hands out decoded like the engine would. The stream
// arrives through a socketpair in two writes, so messages also straddle reads.
// Input: one byte that picks where the stream is split (and with its low bit, limits as after the
// handshake: a small MAX_CTRL_MESSAGE, and inline data on top of it), then the stream.
#include <sys/socket.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "common/socket.h"
#include "ctrl_roundtrip.h"
#include "engine/ctrl_conn.h"

namespace {

namespace w = tcpx::engine::wire;

// The stream is at most what libFuzzer's -max_len allows (4 KiB by default); a socketpair's
// buffer takes that whole, so one write never blocks.
constexpr size_t kMaxStream = 64 * 1024;

void write_all(int fd, const uint8_t* p, size_t n) {
    while (n > 0) {
        const ssize_t k = ::write(fd, p, n);
        FUZZ_CHECK(k > 0);
        p += k;
        n -= static_cast<size_t>(k);
    }
}

// Reads what arrived, then hands out every complete message. Returns false after a protocol
// error (the engine drops the connection then).
// A message whose type is a multiple of 3 is first handed back (unread_message, as the engine
// does with a notification that waits for room) and must come again, the same.
bool drain(tcpx::engine::CtrlConn* conn, uint32_t limit, size_t* handed_out) {
    bool more = true;
    while (more) {
        bool eof = false;
        FUZZ_CHECK(conn->read(&eof, &more).ok());
        while (true) {
            w::Header h;
            std::string_view body;
            auto got = conn->next_message(&h, &body);
            if (!got.ok()) {
                FUZZ_CHECK(got.status().code() == tcpx::StatusCode::kProtocol);
                return false;
            }
            if (!*got) break;
            FUZZ_CHECK(h.magic == w::kMagic);
            FUZZ_CHECK(h.length <= w::kMaxBody && body.size() == h.length);
            FUZZ_CHECK(h.length <= limit + ((h.flags & w::kFlagInline) ? w::kMaxInlineData : 0));
            if (h.type % 3 == 0) {
                const w::Header first = h;
                const std::string copy(body);
                conn->unread_message();
                FUZZ_CHECK(conn->read(&eof, &more).ok());
                auto again = conn->next_message(&h, &body);
                FUZZ_CHECK(again.ok() && *again);
                FUZZ_CHECK(h.type == first.type && h.flags == first.flags && body == copy);
            }
            *handed_out += sizeof(w::Header) + body.size();
            tcpx::fuzz::check_message(static_cast<w::MsgType>(h.type), h.flags, body);
        }
    }
    return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    if (size < 1 || size - 1 > kMaxStream) return 0;
    const size_t len = size - 1;
    const size_t split = len * data[0] / 255;
    const uint8_t* stream = data + 1;

    int fds[2];
    FUZZ_CHECK(::socketpair(AF_UNIX, SOCK_STREAM, 0, fds) == 0);
    tcpx::Fd writer(fds[1]);
    FUZZ_CHECK(tcpx::set_nonblocking(fds[0], true).ok());
    // One connection for the whole run, reset per input as the engine resets one per peer: a
    // fresh one would map and zero its 256 KiB read buffer every time (100x slower).
    static auto* conn = new tcpx::engine::CtrlConn;
    conn->reset(tcpx::Fd(fds[0]));
    // After the handshake: a limit small enough for fuzzed messages to cross, and the inline
    // allowance above it (otherwise the handshake's 64 KiB, no allowance).
    const bool ready = (data[0] & 1) != 0;
    const uint32_t limit = ready ? 512 : w::kHandshakeMessage;
    conn->set_max_message(limit, ready ? w::kMaxInlineData : 0);

    size_t handed_out = 0;
    write_all(writer.get(), stream, split);
    bool good = drain(conn, limit, &handed_out);
    // The engine's tick between reads: trim() reads the buffered message's header (compact)
    // and must keep every byte not yet handed out.
    conn->trim();
    if (good) {
        write_all(writer.get(), stream + split, len - split);
        writer.reset();
        good = drain(conn, limit, &handed_out);
    }
    if (good) FUZZ_CHECK(handed_out + conn->buffered() == len);
    FUZZ_CHECK(handed_out <= len);
    conn->close();
    return 0;
}
