// The socket transport's streams after the handshake, as a receive comm reads them: messages on
// the control socket (wire::MsgHeader and inline payload) and chunks on the data sockets
// (wire::ChunkHeader and payload), from a peer that completed the handshake and then sends
// anything. The comm serves its sockets in the caller's thread (SocketNet::Io::kInCaller), so a
// run is deterministic up to the kernel's segmenting.
//
// Input: one byte of flags (which receives are posted: a contiguous one, a three-segment one, a
// grouped one of two tags; bit 3: the contiguous and grouped ones into memory registered and
// marked for a device's reads, so that what lands there is written back, Net::hint_device_reads),
// then records [socket: u8][length: u16 LE][bytes], each written to
// socket (byte % 3: control, data 0, data 1); the comm is served between records. Then the peer
// closes every socket.
//
// Invariants: no byte lands outside a posted buffer (ASan: each is its own exact allocation) or,
// in a receive that completes, past the message size it reports; a completed receive's sizes fit
// its buffers; no more bytes are written back than the marked buffers hold; and once the peer has
// closed, every posted receive finishes (done or failed) within 5 s: the comm never waits for
// bytes that cannot come.
#include <arpa/inet.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "common/cache_lines.h"
#include "common/params.h"
#include "common/socket.h"
#include "fuzz_check.h"
#include "net/socket/socket_net.h"
#include "net/socket/wire.h"

namespace {

namespace net = tcpx::net;
namespace wire = tcpx::net::wire;

constexpr uint8_t kFill = 0xab;
constexpr size_t kMaxStream = 64 * 1024;

struct Listener {
    std::unique_ptr<net::SocketNet> net;
    net::ListenComm* listen = nullptr;
    net::Handle handle;
    wire::HandleBlob blob{};
};

Listener& listener() {
    static Listener* l = [] {
        auto* out = new Listener;
        tcpx::Settings s;
        s.socket_ifname = "=lo";
        s.socket_family = "ipv4";
        s.nsocks = 2;
        s.handshake_timeout_ms = 5000;
        auto created = net::SocketNet::create(s, net::SocketNet::Io::kInCaller);
        FUZZ_CHECK(created.ok());
        out->net = std::move(created).value();
        FUZZ_CHECK(out->net->listen(0, &out->handle, &out->listen).ok());
        std::memcpy(&out->blob, out->handle.bytes.data(), sizeof(out->blob));
        return out;
    }();
    return *l;
}

// A buffer of its own allocation, filled with kFill.
struct Buf {
    explicit Buf(size_t n) : bytes(new uint8_t[n]), size(n) { std::memset(bytes.get(), kFill, n); }
    std::unique_ptr<uint8_t[]> bytes;
    size_t size;
    // Past `used`, nothing was written.
    bool untouched_from(size_t used) const {
        for (size_t i = used; i < size; ++i) {
            if (bytes[i] != kFill) return false;
        }
        return true;
    }
};

struct Posted {
    net::Request* req = nullptr;
    std::vector<Buf*> bufs;  // in the order test() reports sizes (a vector: one, in all)
    bool vector = false;
    bool finished = false;
};

void write_all(int fd, const uint8_t* p, size_t n) {
    while (n > 0) {
        const ssize_t k = ::send(fd, p, n, MSG_NOSIGNAL);
        if (k <= 0) return;  // the comm closed the socket (a protocol error): nothing more to say
        p += k;
        n -= static_cast<size_t>(k);
    }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    if (size < 1 || size > kMaxStream) return 0;
    Listener& l = listener();
    char text[INET_ADDRSTRLEN] = {};
    inet_ntop(AF_INET, l.blob.addr, text, sizeof(text));
    auto addr = tcpx::SocketAddress::parse(text, l.blob.port);
    FUZZ_CHECK(addr.ok());

    // The peer: a control socket and two data sockets, each with a valid Hello.
    const uint64_t nonce = 0x5eed0000u + static_cast<uint64_t>(data[0]);
    std::vector<tcpx::Fd> socks;
    for (uint16_t i = 0; i < 3; ++i) {
        auto fd = tcpx::connect_blocking(*addr, 5000);
        FUZZ_CHECK(fd.ok());
        const bool control = i == 0;
        const wire::Hello hello{
            wire::kHelloMagic,
            wire::kVersion,
            static_cast<uint16_t>(control ? wire::Role::kControl : wire::Role::kData),
            l.blob.listen_nonce,
            nonce,
            static_cast<uint16_t>(control ? 0 : i - 1),
            2,
            0};
        FUZZ_CHECK(tcpx::send_all(fd->get(), &hello, sizeof(hello)).ok());
        socks.push_back(std::move(fd).value());
    }
    net::RecvComm* comm = nullptr;
    const auto accept_until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while (comm == nullptr && std::chrono::steady_clock::now() < accept_until) {
        FUZZ_CHECK(l.net->accept(l.listen, &comm, nullptr).ok());
    }
    FUZZ_CHECK(comm != nullptr);
    // The handshake reply, read so that the peer's closes are clean ends of stream (a socket
    // closed with unread bytes resets the connection instead).
    wire::HelloReply reply{};
    FUZZ_CHECK(tcpx::recv_all(socks[0].get(), &reply, sizeof(reply)).ok());

    // The receives the flags ask for, posted in order (messages bind to them in that order).
    const uint8_t flags = data[0];
    const bool marked = (flags & 8) != 0;
    const uint64_t written_back_before = tcpx::bytes_written_back();
    size_t marked_bytes = 0;
    // A registration of `b` with the comm, marked for a device's reads (released with the comm).
    auto mark = [&](Buf* b) {
        net::MemHandle* mh = nullptr;
        FUZZ_CHECK(l.net->reg_mr(comm, b->bytes.get(), b->size, net::MemType::kHost, &mh).ok());
        FUZZ_CHECK(l.net->hint_device_reads(comm, mh).ok());
        marked_bytes += b->size;
        return mh;
    };
    std::vector<std::unique_ptr<Buf>> bufs;
    std::vector<Posted> posted;
    if (flags & 1) {
        bufs.push_back(std::make_unique<Buf>(48 * 1024));
        Posted p;
        p.bufs = {bufs.back().get()};
        void* ptr = p.bufs[0]->bytes.get();
        const size_t len = p.bufs[0]->size;
        const int tag = (flags >> 4) & 1;
        net::MemHandle* mh = marked ? mark(p.bufs[0]) : nullptr;
        FUZZ_CHECK(l.net->irecv(comm, 1, &ptr, &len, &tag, &mh, &p.req).ok());
        posted.push_back(p);
    }
    if (flags & 2) {
        Posted p;
        p.vector = true;
        std::vector<net::IoSeg> segs;
        for (size_t n : {size_t{1000}, size_t{20000}, size_t{7}}) {
            bufs.push_back(std::make_unique<Buf>(n));
            p.bufs.push_back(bufs.back().get());
            segs.push_back(net::IoSeg{bufs.back()->bytes.get(), n});
        }
        FUZZ_CHECK(l.net->irecvv(comm, segs, (flags >> 5) & 1, &p.req).ok());
        posted.push_back(p);
    }
    if (flags & 4) {
        Posted p;
        void* ptrs[2];
        size_t lens[2] = {4096, 30000};
        const int tags[2] = {0, 1};
        net::MemHandle* mhs[2] = {nullptr, nullptr};
        for (int i = 0; i < 2; ++i) {
            bufs.push_back(std::make_unique<Buf>(lens[i]));
            p.bufs.push_back(bufs.back().get());
            ptrs[i] = bufs.back()->bytes.get();
            if (marked) mhs[i] = mark(bufs.back().get());
        }
        FUZZ_CHECK(l.net->irecv(comm, 2, ptrs, lens, tags, mhs, &p.req).ok());
        posted.push_back(p);
    }

    // The stream, record by record, the comm served in between.
    size_t at = 1;
    while (at + 3 <= size) {
        const int sock = data[at] % 3;
        size_t len = static_cast<size_t>(data[at + 1]) | static_cast<size_t>(data[at + 2]) << 8;
        at += 3;
        len = std::min(len, size - at);
        write_all(socks[static_cast<size_t>(sock)].get(), data + at, len);
        at += len;
        for (int i = 0; i < 3; ++i) (void)l.net->progress();
    }
    socks.clear();  // the peer is gone

    const auto finish_until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    size_t open = posted.size();
    while (open > 0 && std::chrono::steady_clock::now() < finish_until) {
        (void)l.net->progress();
        for (Posted& p : posted) {
            if (p.finished) continue;
            bool done = false;
            size_t sizes[2] = {0, 0};
            const tcpx::Status st = l.net->test(p.req, &done, sizes);
            if (!st.ok()) {
                p.finished = true;
                --open;
                continue;
            }
            if (!done) continue;
            p.finished = true;
            --open;
            if (p.vector) {
                size_t total = 0;
                for (Buf* b : p.bufs) total += b->size;
                FUZZ_CHECK(sizes[0] <= total);
                size_t left = sizes[0];
                for (Buf* b : p.bufs) {
                    const size_t used = std::min(left, b->size);
                    FUZZ_CHECK(b->untouched_from(used));
                    left -= used;
                }
            } else {
                for (size_t i = 0; i < p.bufs.size(); ++i) {
                    FUZZ_CHECK(sizes[i] <= p.bufs[i]->size);
                    FUZZ_CHECK(p.bufs[i]->untouched_from(sizes[i]));
                }
            }
        }
    }
    FUZZ_CHECK(open == 0);  // every receive ended once the peer had closed
    // (One process, one comm at a time: every byte written back meanwhile was this comm's.)
    FUZZ_CHECK(tcpx::bytes_written_back() - written_back_before <= marked_bytes);
    FUZZ_CHECK(l.net->close_recv(comm).ok());
    return 0;
}
