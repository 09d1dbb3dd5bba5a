// Writes the seed corpora (valid inputs made by the encoders) into <dir>/<target>/:
//   fuzz_make_corpus tests/fuzz/corpus
// The files are committed; rerun this when a format changes (scripts/run-fuzz --make-corpus).
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "bench/harness/roles.h"
#include "common/socket.h"
#include "engine/ctrl_wire.h"
#include "engine/metadata.h"
#include "net/net.h"
#include "net/plugin/tcpx_layout.h"
#include "net/socket/wire.h"
#include "tcpx/endpoint.h"

namespace {

namespace w = tcpx::engine::wire;
namespace sw = tcpx::net::wire;

std::string g_root;

void put(const std::string& target, const std::string& name, const std::string& bytes) {
    const std::string dir = g_root + "/" + target;
    ::mkdir(dir.c_str(), 0755);
    const std::string path = dir + "/" + name;
    FILE* f = std::fopen(path.c_str(), "wb");
    if (f == nullptr || std::fwrite(bytes.data(), 1, bytes.size(), f) != bytes.size()) {
        std::perror(path.c_str());
        std::exit(1);
    }
    std::fclose(f);
}

template <typename T>
std::string raw(const T& v) {
    return std::string(reinterpret_cast<const char*>(&v), sizeof(v));
}

std::string body(const std::string& msg) { return msg.substr(sizeof(w::Header)); }
std::string closed(std::string msg, const std::string& tail = "") {
    msg += tail;
    w::end_message(&msg);
    return msg;
}

// The control messages, whole (header included), with the selector byte fuzz_ctrl_wire reads.
struct Msg {
    std::string name;
    std::string whole;
    uint8_t selector = 0;  // set from the header below
};

std::vector<Msg> control_messages() {
    std::vector<Msg> out;
    w::Hello hello;
    hello.channels = 2;
    hello.nonce = 0x1122334455667788;
    hello.chunk = 512 * 1024;
    hello.name = "node-a";
    hello.handles.resize(2);
    hello.handles[0].bytes[0] = 0x54;
    hello.handles[1].bytes[0] = 0x55;
    out.push_back({"hello", w::encode_hello(hello)});
    hello.mac = std::string(w::kAuthBytes, 'm');
    out.push_back({"hello_mac", w::encode_hello(hello)});

    const std::vector<w::Segment> segs = {{7, 0, 4}, {9, 16, 3}};
    for (uint16_t flags = 0; flags < 4; ++flags) {
        w::WriteReq req;
        req.xfer = 42;
        req.chunk = flags == 1 ? 256 * 1024 : 0;
        req.flags = flags;
        req.segs = segs;
        req.notification = "done";
        const std::string data = (flags & w::kFlagInline) ? "abcdefg" : "";
        out.push_back(
            {"write_req_flags" + std::to_string(flags), closed(w::encode_write_req(req), data)});
    }
    out.push_back({"write_ack_ok", w::encode_write_ack(42, tcpx::Status())});
    out.push_back(
        {"write_ack_error",
         w::encode_write_ack(42, tcpx::Status(tcpx::StatusCode::kOutOfRange, "past end"))});
    w::ReadReq rreq;
    rreq.xfer = 43;
    rreq.chunk = 128 * 1024;
    rreq.segs = segs;
    out.push_back({"read_req", w::encode_read_req(rreq)});
    rreq.flags = w::kFlagInline;
    out.push_back({"read_req_inline_welcome", w::encode_read_req(rreq)});
    rreq.flags = w::kFlagInline | w::kFlagNotif;
    rreq.notification = "read done";
    out.push_back({"read_req_notif", w::encode_read_req(rreq)});
    out.push_back({"read_done", w::encode_read_done(w::ReadDone{43, true})});
    out.push_back({"read_done_failed", w::encode_read_done(w::ReadDone{43, false})});
    out.push_back({"read_resp_inline",
                   closed(w::encode_read_resp(43, w::kFlagInline, tcpx::Status()), "abcdefg")});
    out.push_back({"read_resp_chunks", closed(w::encode_read_resp(43, 0, tcpx::Status()))});
    out.push_back(
        {"read_resp_refused",
         closed(w::encode_read_resp(43, 0, tcpx::Status(tcpx::StatusCode::kNotFound, "no key")))});
    out.push_back({"notif", w::encode_notif("hello there")});
    out.push_back({"send_rts", w::encode_send_rts({44, 5, 1 << 20})});
    out.push_back({"recv_cts", w::encode_recv_cts(44, 45, tcpx::Status())});
    out.push_back(
        {"send_data_inline", closed(w::encode_send_data(45, w::kFlagInline, 5), "hello")});
    out.push_back({"send_data_chunks", closed(w::encode_send_data(45, 0, 1 << 20))});
    out.push_back({"ping", w::encode_empty(w::MsgType::kPing)});
    out.push_back({"ping_moved", w::encode_ping(12345)});
    out.push_back({"bye", w::encode_bye("")});
    out.push_back({"bye_reason", w::encode_bye("PROTOCOL: data channel receive: a bad slot")});
    const std::string nonce_c(w::kAuthBytes, 'c'), nonce_l(w::kAuthBytes, 'l');
    const std::string mac1(w::kAuthBytes, '1'), mac2(w::kAuthBytes, '2');
    w::AuthInit init;
    init.nonce = nonce_c;
    init.name = "node-a";
    out.push_back({"auth_init", w::encode_auth_init(init)});
    w::AuthChallenge ch;
    ch.nonce = nonce_l;
    ch.name = "node-b";
    ch.macs = {mac1, mac2};
    out.push_back({"auth_challenge", w::encode_auth_challenge(ch)});
    w::AuthProof proof;
    proof.mac = mac1;
    out.push_back({"auth_proof", w::encode_auth_proof(proof)});
    out.push_back({"auth_fail", w::encode_auth_fail("authentication failed")});
    // fuzz_ctrl_wire's selector: the type's index in its table, the flags in bits 4-5.
    for (Msg& m : out) {
        w::Header h;
        std::memcpy(&h, m.whole.data(), sizeof(h));
        static const w::MsgType order[] = {
            w::MsgType::kHello,    w::MsgType::kWriteReq,      w::MsgType::kWriteAck,
            w::MsgType::kReadReq,  w::MsgType::kReadResp,      w::MsgType::kNotif,
            w::MsgType::kSendRts,  w::MsgType::kRecvCts,       w::MsgType::kSendData,
            w::MsgType::kReady,    w::MsgType::kPing,          w::MsgType::kBye,
            w::MsgType::kAuthInit, w::MsgType::kAuthChallenge, w::MsgType::kAuthProof,
            w::MsgType::kAuthFail, w::MsgType::kReadDone};
        for (uint8_t i = 0; i < std::size(order); ++i) {
            if (static_cast<uint16_t>(order[i]) == h.type) {
                // (index bit 4 in the selector's bit 6)
                m.selector =
                    static_cast<uint8_t>((i & 0xf) | ((i & 0x10) << 2) | ((h.flags & 3) << 4));
            }
        }
    }
    return out;
}

}  // namespace

int main(int argc, char** argv) {
    if (argc != 2) {
        std::fprintf(stderr, "usage: %s CORPUS_DIR\n", argv[0]);
        return 2;
    }
    g_root = argv[1];
    ::mkdir(g_root.c_str(), 0755);

    const std::vector<Msg> msgs = control_messages();
    std::string stream;
    for (const Msg& m : msgs) {
        put("fuzz_ctrl_wire", m.name,
            std::string(1, static_cast<char>(m.selector)) + body(m.whole));
        stream += m.whole;
    }
    // Streams: one message, and all of them, split in the middle.
    put("fuzz_ctrl_stream", "hello", "\x80" + msgs[0].whole);
    put("fuzz_ctrl_stream", "all", "\x80" + stream);
    put("fuzz_ctrl_stream", "write_then_ack", "\x40" + msgs[4].whole + msgs[5].whole);

    // The shared room: the room's size, then operations (peer + 3 x kind, a 16-bit argument).
    const auto op = [](int peer, int kind, uint32_t arg) {
        return std::string{static_cast<char>(peer + 3 * kind), static_cast<char>(arg & 0xff),
                           static_cast<char>(arg >> 8)};
    };
    constexpr uint32_t k2MiB = (2u << 20) / 52, kAll = 0xffff;
    // Two 2 MiB messages, a 2 MiB room: the second waits until the first is handed out.
    put("fuzz_ctrl_room", "two_large",
        std::string(1, '\x03') + op(0, 0, k2MiB) + op(1, 0, k2MiB) + op(0, 1, kAll) +
            op(1, 1, kAll) + op(0, 2, 0) + op(1, 2, 0) + op(0, 2, 0) + op(1, 2, 0));
    // A message past the limit, one of three peers closed midway, small ones between.
    put("fuzz_ctrl_room", "past_limit_and_close",
        std::string(1, '\x07') + op(2, 0, 0xfff0) + op(0, 0, 100) + op(1, 0, k2MiB) +
            op(2, 1, kAll) + op(1, 1, 20000) + op(2, 2, 0) + op(1, 2, 0) + op(1, 3, 0) +
            op(0, 1, kAll) + op(0, 2, 0));

    tcpx::engine::EndpointAddress a;
    a.name = "node-a";
    a.gpu = 3;
    a.nonce = 0xabcdef;
    a.address = *tcpx::SocketAddress::parse("127.0.0.1", 5000);
    put("fuzz_metadata", "ipv4", tcpx::engine::encode_metadata(a));
    a.address = *tcpx::SocketAddress::parse("::1", 5001);
    a.gpu = -1;
    a.name = "";
    put("fuzz_metadata", "ipv6", tcpx::engine::encode_metadata(a));
    a.address = *tcpx::SocketAddress::parse("fe80::1%1", 5002);
    put("fuzz_metadata", "ipv6_scoped", tcpx::engine::encode_metadata(a));

    tcpx::RemoteMem m;
    m.addr = 0x7f0000001000;
    m.len = 1 << 20;
    m.key = 0x0123456789abcdef;
    put("fuzz_remote_mem", "host", m.serialize());
    m.kind = tcpx::MemKind::kCuda;
    m.device = 1;
    put("fuzz_remote_mem", "cuda", m.serialize());

    sw::HandleBlob blob{};
    blob.magic = sw::kHandleMagic;
    blob.version = sw::kVersion;
    blob.family = AF_INET;
    const uint8_t v4[4] = {127, 0, 0, 1};
    std::memcpy(blob.addr, v4, 4);
    blob.port = 5000;
    blob.nsocks = 4;
    blob.listen_nonce = 0x5555;
    tcpx::net::Handle handle;
    std::memcpy(handle.bytes.data(), &blob, sizeof(blob));
    put("fuzz_socket_handle", "ipv4",
        std::string(reinterpret_cast<const char*>(handle.bytes.data()), handle.bytes.size()));
    blob.family = AF_INET6;
    const uint8_t mapped[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 127, 0, 0, 1};
    std::memcpy(blob.addr, mapped, 16);
    blob.connect_key = 99;  // a peer's stale key: the check clears it
    std::memcpy(handle.bytes.data(), &blob, sizeof(blob));
    put("fuzz_socket_handle", "ipv4_mapped",
        std::string(reinterpret_cast<const char*>(handle.bytes.data()), handle.bytes.size()));

    // Google's TCPX handle (tcpx_layout.h): IPv4 loopback, the same IPv4-mapped, and one with a
    // pointer in connect_args (the check clears it).
    namespace gt = tcpx::net::google_tcpx;
    gt::Handle th{};
    th.connect_addr.sin.sin_family = AF_INET;
    th.connect_addr.sin.sin_port = htons(6000);
    th.connect_addr.sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    th.ctrl_addr = th.connect_addr;
    th.port_start = th.port_count = -1;
    th.num_socks = 4;
    th.num_threads = 1;
    auto tcpx_bytes = [](const gt::Handle& h) {
        std::string b(sizeof(tcpx::net::Handle::bytes), '\0');
        std::memcpy(b.data(), &h, sizeof(h));
        return b;
    };
    put("fuzz_tcpx_handle", "ipv4", tcpx_bytes(th));
    th.connect_args = reinterpret_cast<void*>(0x7f0000001000);
    put("fuzz_tcpx_handle", "ipv4_connect_args", tcpx_bytes(th));
    gt::Handle t6{};
    t6.connect_addr.sin6.sin6_family = AF_INET6;
    t6.connect_addr.sin6.sin6_port = htons(6001);
    inet_pton(AF_INET6, "::ffff:127.0.0.1", &t6.connect_addr.sin6.sin6_addr);
    t6.ctrl_addr = t6.connect_addr;
    t6.num_socks = 8;
    t6.num_threads = 16;
    t6.redirect_ctrl = true;
    put("fuzz_tcpx_handle", "ipv4_mapped", tcpx_bytes(t6));

    const uint64_t nonce = 0x1234;
    const uint16_t nsocks = 4;
    const sw::HelloReply accepted{sw::kReplyMagic, sw::kVersion, 0};
    const sw::HelloReply refused{sw::kReplyMagic, sw::kVersion,
                                 static_cast<uint16_t>(sw::ReplyStatus::kWrongListener)};
    const sw::Hello control{sw::kHelloMagic,
                            sw::kVersion,
                            static_cast<uint16_t>(sw::Role::kControl),
                            nonce,
                            77,
                            0,
                            nsocks,
                            0};
    const sw::Hello data{sw::kHelloMagic,
                         sw::kVersion,
                         static_cast<uint16_t>(sw::Role::kData),
                         nonce,
                         77,
                         3,
                         nsocks,
                         0};
    // Piece lists: a chunk size, then lengths (KV blocks; large and small mixed with empties).
    {
        std::string kv = raw(uint64_t{4} << 20);
        for (int i = 0; i < 300; ++i) kv += raw(uint64_t{32} << 10);
        put("fuzz_packer", "kv_blocks", kv);
        std::string mixed = raw(uint64_t{65536});
        for (uint64_t len : {uint64_t{0}, uint64_t{1}, uint64_t{65535}, uint64_t{65536},
                             uint64_t{65537}, uint64_t{0}, uint64_t{300000}, uint64_t{7}}) {
            mixed += raw(len);
        }
        put("fuzz_packer", "mixed", mixed);
    }
    // Unpacks into pieces: piece lengths, then a devmem receive's entries (4 KiB pages, out of
    // order), and one with an entry past the chunk.
    {
        auto u16 = [](uint16_t v) { return raw(v); };
        std::string pieces = u16(5);
        for (uint16_t len :
             {uint16_t{100}, uint16_t{0}, uint16_t{9000}, uint16_t{4096}, uint16_t{3}}) {
            pieces += u16(len);
        }
        const uint64_t total = 100 + 9000 + 4096 + 3;
        std::string entries;
        for (uint64_t at = 0, page = 3; at < total; at += 4096, page = (page + 5) % 7) {
            const uint32_t len = static_cast<uint32_t>(std::min<uint64_t>(4096, total - at));
            entries += raw(static_cast<uint32_t>(page * 4096)) + raw(len) + raw(at);
        }
        put("fuzz_unpack_plan", "pages", pieces + entries);
        put("fuzz_unpack_plan", "past_end",
            pieces + entries + raw(uint32_t{0}) + raw(uint32_t{16}) + raw(total - 8));
    }
    put("fuzz_socket_hello", "control", raw(control) + raw(accepted) + raw(nonce) + raw(nsocks));
    put("fuzz_socket_hello", "data", raw(data) + raw(refused) + raw(nonce) + raw(nsocks));

    // The socket transport's streams after the handshake (fuzz_socket_stream): a flags byte (the
    // receives posted), then records [socket u8][length u16][bytes] for the control socket (0)
    // and the data sockets (1, 2).
    {
        auto rec = [](uint8_t sock, const std::string& bytes) {
            return std::string(1, static_cast<char>(sock)) +
                   raw(static_cast<uint16_t>(bytes.size())) + bytes;
        };
        auto inline_msg = [](uint64_t seq, uint64_t size, int32_t tag) {
            return raw(sw::MsgHeader{sw::kMsgMagic, 0, seq, size, tag, 0}) + std::string(size, 'm');
        };
        auto chunk = [](uint64_t seq, uint64_t size, uint64_t offset, uint32_t len) {
            return raw(sw::ChunkHeader{sw::kChunkMagic, len, seq, size, offset, 0, 0}) +
                   std::string(len, 'c');
        };
        put("fuzz_socket_stream", "inline", "" + rec(0, inline_msg(0, 100, 0)));
        put("fuzz_socket_stream", "chunks",
            "" + rec(1, chunk(0, 12288, 0, 4096)) + rec(2, chunk(0, 12288, 4096, 8192)));
        put("fuzz_socket_stream", "all_receives",
            "" + rec(0, inline_msg(0, 50, 0)) + rec(1, chunk(1, 21007, 0, 8192)) +
                rec(2, chunk(1, 21007, 8192, 12815)) + rec(0, inline_msg(2, 4096, 0)) +
                rec(1, chunk(3, 30000, 0, 30000)));
        put("fuzz_socket_stream", "ahead", "" + rec(2, chunk(1, 1000, 0, 1000)));
        // Every receive, the contiguous and grouped ones marked for a device's reads (flag 8).
        put("fuzz_socket_stream", "marked",
            std::string(1, '\x0f') + rec(0, inline_msg(0, 50, 0)) +
                rec(1, chunk(1, 21007, 0, 8192)) + rec(2, chunk(1, 21007, 8192, 12815)) +
                rec(0, inline_msg(2, 4096, 0)) + rec(1, chunk(3, 30000, 0, 30000)));
    }

    // The engine bench's target: a byte (its low bit: --bidir; the next: endpoints without a
    // progress thread, which the target polls between commands), then command lines. A session as
    // an initiator runs it (within the fuzzer's limits: 2 endpoints, 1 MiB per memory type), the
    // --bidir commands with descriptors of the target's own regions' shape, the raw baseline's
    // commands (raw-accept times out: nobody connects), and numbers past every bound.
    put("fuzz_bench_target", "session",
        std::string(1, '\0') +
            "endpoints 1\nchannels\nmem host 262144\nprep write host 1 0 4096 1\n"
            "check host 1 0 4096 1\nprep read host 2 100 1000 1\ncheck host 2 100 1000 1\n"
            "kvshape 2 16 1 128 2 262144 2\nkvfill host 1 0\nkvcheck host 1 0\ncpu\nstats\n"
            "quit\n");
    m.kind = tcpx::MemKind::kHost;
    m.device = -1;
    m.len = 4096;
    const std::string desc = tcpx::bench::hex_blob(m.serialize());
    put("fuzz_bench_target", "bidir",
        std::string(1, '\x01') + "endpoints 2\nmem host 65536\nrmem host " + desc + " " + desc +
            "\naccept 1\nxfer write host 1 4096 1 1 1\nprep read host 1 0 4096 2 rev\n"
            "check host 1 0 4096 2 rev\nquit\n");
    put("fuzz_bench_target", "polled",
        std::string(1, '\x03') + "endpoints 2\nmem host 65536\nrmem host " + desc + " " + desc +
            "\naccept 1\nxfer write host 1 4096 1 1 1\nstats\nquit\n");
    put("fuzz_bench_target", "raw",
        std::string(1, '\0') +
            "raw-listen\nraw-accept 1\nraw-stream 4096 1 1\nraw-pingpong 64 1 32\nquit\n");
    put("fuzz_bench_target", "bounds",
        std::string(1, '\0') +
            "endpoints 99999999999999999999\nendpoints 3\nendpoints 1 pergpu\n"
            "mem host 18446744073709551615\nmem vram 4096\naccept -1\naccept 86400001\n"
            "raw-listen\nraw-accept 2147483647\nraw-stream 9223372036854775808 1 2\n"
            "kvshape 1 1 1 1 1 68719476736 1\nprep write host 1 18446744073709551615 2 1\n"
            "xfer read host 1 1 1 1 0\nrmem host zz\n\n  \nnothing\n");
    // Found by a long run: a command naming no bytes of a region that has no memory.
    put("fuzz_bench_target", "empty-view",
        std::string(1, '\0') + "endpoints 1\nprep write host 1 0 0 1\ncheck host 1 0 0 1\nquit\n");
    return 0;
}
