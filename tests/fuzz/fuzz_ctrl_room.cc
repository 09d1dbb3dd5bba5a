// The room the engine's control connections share for messages larger than their own buffers
// (engine::CtrlRoom, MAX_CTRL_BUFFER_TOTAL), under any interleaving the input chooses of three
// peers that start messages of up to 3.25 MiB (some past the 3 MiB limit), send them a piece at a
// time, and are read, handed out and closed. Checks: what is handed out is what was sent, whole
// and in order; a message past the limit is refused (PROTOCOL) and nothing after it is handed
// out; the room counts exactly the connections' reservations and never goes past its limit; a
// connection that stops for room finds it lacking; everything is given back as they go.
//
// Input: byte 0 picks the room (0.5 to 4 MiB), then operations of three bytes: which peer and
// what (a message of the next two bytes' length x 52, a send of their value x 64 bytes, a read
// with every whole message handed out, a close).
#include <sys/socket.h>

#include <cstdint>
#include <cstring>
#include <deque>
#include <string>

#include "common/socket.h"
#include "engine/ctrl_conn.h"
#include "engine/ctrl_wire.h"
#include "fuzz_check.h"

namespace {

namespace w = tcpx::engine::wire;
using tcpx::engine::CtrlConn;
using tcpx::engine::CtrlRoom;

constexpr int kPeers = 3;
constexpr uint32_t kLimit = 3u << 20;

uint8_t body_byte(uint32_t id, uint64_t i) {
    return static_cast<uint8_t>(id * 131 + i * 7 + (i >> 12));
}

struct Peer {
    CtrlConn conn;
    tcpx::Fd writer;
    std::string out;  // bytes not yet sent
    size_t out_at = 0;
    struct Sent {
        uint32_t id;
        uint32_t length;
    };
    std::deque<Sent> expect;  // messages started, in order
    bool gone = false;
};

void start_message(Peer& p, uint32_t id, uint32_t length) {
    std::string msg = w::begin_message(w::MsgType::kWriteReq, 0);
    const size_t at = msg.size();
    msg.resize(at + length);
    for (uint32_t i = 0; i < length; ++i) msg[at + i] = static_cast<char>(body_byte(id, i));
    w::end_message(&msg);
    p.out.append(msg);
    p.expect.push_back(Peer::Sent{id, length});
}

void send_some(Peer& p, size_t n) {
    n = std::min(n, p.out.size() - p.out_at);
    if (n == 0) return;
    const ssize_t k =
        ::send(p.writer.get(), p.out.data() + p.out_at, n, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (k > 0) p.out_at += static_cast<size_t>(k);
    if (p.out_at == p.out.size()) {
        p.out.clear();
        p.out_at = 0;
    }
}

void close_peer(Peer& p) {
    p.conn.close();
    p.writer.reset();
    p.gone = true;
}

// Reads, then hands out every whole message, checking each against what was sent.
void read_peer(Peer& p, const CtrlRoom& room) {
    bool eof = false;
    FUZZ_CHECK(p.conn.read(&eof).ok());
    if (p.conn.starved()) FUZZ_CHECK(!p.conn.room_fits() && room.used <= room.limit);
    while (true) {
        w::Header h;
        std::string_view body;
        auto got = p.conn.next_message(&h, &body);
        if (!got.ok()) {
            // Only a message past the limit is refused, and the engine then drops the peer.
            FUZZ_CHECK(got.status().code() == tcpx::StatusCode::kProtocol);
            FUZZ_CHECK(!p.expect.empty() && p.expect.front().length > kLimit);
            close_peer(p);
            return;
        }
        if (!*got) return;
        FUZZ_CHECK(!p.expect.empty());
        const Peer::Sent sent = p.expect.front();
        p.expect.pop_front();
        FUZZ_CHECK(sent.length <= kLimit && body.size() == sent.length);
        for (uint64_t i = 0; i < body.size(); ++i) {
            FUZZ_CHECK(static_cast<uint8_t>(body[i]) == body_byte(sent.id, i));
        }
    }
}

void check_room(const Peer* peers, const CtrlRoom& room) {
    uint64_t held = 0;
    for (int i = 0; i < kPeers; ++i) held += peers[i].gone ? 0 : peers[i].conn.room_held();
    FUZZ_CHECK(room.used == held);
    FUZZ_CHECK(room.used <= room.limit);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    if (size < 1 || size > 1 + 3 * 64) return 0;
    CtrlRoom room;
    room.limit = (static_cast<uint64_t>(data[0] % 8) + 1) * (512 << 10);
    {
        Peer peers[kPeers];
        for (Peer& p : peers) {
            int fds[2];
            FUZZ_CHECK(::socketpair(AF_UNIX, SOCK_STREAM, 0, fds) == 0);
            FUZZ_CHECK(tcpx::set_nonblocking(fds[0], true).ok());
            const int big = 8 << 20;
            ::setsockopt(fds[1], SOL_SOCKET, SO_SNDBUF, &big, sizeof(big));
            ::setsockopt(fds[0], SOL_SOCKET, SO_RCVBUF, &big, sizeof(big));
            p.conn.reset(tcpx::Fd(fds[0]));
            p.writer = tcpx::Fd(fds[1]);
            p.conn.set_max_message(kLimit, 0);
            p.conn.set_room(&room);
        }
        uint32_t next_id = 1;
        uint64_t started = 0;  // (bytes of messages: at most 16 MiB an input, for speed)
        for (size_t at = 1; at + 3 <= size; at += 3) {
            Peer& p = peers[data[at] % kPeers];
            const uint32_t arg = uint32_t{data[at + 1]} | uint32_t{data[at + 2]} << 8;
            if (p.gone) continue;
            switch ((data[at] / kPeers) % 4) {
                case 0:
                    if (started + arg * 52 > (16u << 20)) break;
                    started += arg * 52;
                    start_message(p, next_id++, arg * 52);  // up to 3.25 MiB
                    break;
                case 1:
                    send_some(p, size_t{arg} * 64);
                    break;
                case 2:
                    read_peer(p, room);
                    break;
                default:
                    close_peer(p);
                    break;
            }
            check_room(peers, room);
        }
        // The rest sent and read where there is room: every message started comes, in order,
        // unless one past the limit ended its peer.
        for (int round = 0; round < 64; ++round) {
            bool busy = false;
            for (Peer& p : peers) {
                if (p.gone) continue;
                send_some(p, p.out.size());
                read_peer(p, room);
                check_room(peers, room);
                busy = busy || (!p.gone && !p.expect.empty());
            }
            if (!busy) break;
        }
    }
    // Gone with their connections: every byte of room given back.
    FUZZ_CHECK(room.used == 0);
    return 0;
}
