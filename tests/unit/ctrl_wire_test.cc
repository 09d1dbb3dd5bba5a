// The engine's control messages: round trips, and every malformed body refused (never read past
// its end, never an allocation sized by a forged count).
#include "engine/ctrl_wire.h"

#include <gtest/gtest.h>

#include <cstring>

#include "common/strings.h"

namespace tcpx::engine::wire {
namespace {

std::string_view body_of(const std::string& msg) {
    return std::string_view(msg).substr(sizeof(Header));
}

uint16_t flags_of(const std::string& msg) {
    Header h;
    std::memcpy(&h, msg.data(), sizeof(h));
    return h.flags;
}

TEST(CtrlWire, HeaderCarriesTypeFlagsAndLength) {
    std::string msg = encode_notif("hello");
    Header h;
    std::memcpy(&h, msg.data(), sizeof(h));
    EXPECT_EQ(h.magic, kMagic);
    EXPECT_EQ(h.type, static_cast<uint16_t>(MsgType::kNotif));
    EXPECT_EQ(h.length, msg.size() - sizeof(Header));
}

TEST(CtrlWire, WriteRequestRoundTrip) {
    WriteReq req;
    req.xfer = 77;
    req.flags = kFlagNotif | kFlagInline;
    req.segs = {{1, 2, 3}, {4, 5, 0}, {6, 7, 2}};
    req.notification = std::string_view("n\0t", 3);
    std::string msg = encode_write_req(req);
    msg += "abcde";  // 3 + 0 + 2 bytes of inline data
    end_message(&msg);
    WriteReq out;
    ASSERT_TRUE(decode_write_req(body_of(msg), flags_of(msg), &out).ok());
    EXPECT_EQ(out.xfer, 77u);
    ASSERT_EQ(out.segs.size(), 3u);
    EXPECT_EQ(out.segs[2].key, 6u);
    EXPECT_EQ(out.segs[2].len, 2u);
    EXPECT_EQ(out.notification, std::string_view("n\0t", 3));
    EXPECT_EQ(out.data, "abcde");
    EXPECT_EQ(out.chunk, 0u);
}

TEST(CtrlWire, RequestsCarryTheirChunkSize) {
    WriteReq w;
    w.xfer = 5;
    w.segs = {{1, 0, 1 << 20}};
    std::string msg = encode_write_req(w);
    end_message(&msg);
    set_request_chunk(&msg, 256 * 1024);
    WriteReq wout;
    ASSERT_TRUE(decode_write_req(body_of(msg), flags_of(msg), &wout).ok());
    EXPECT_EQ(wout.chunk, 256u * 1024);
    EXPECT_EQ(wout.xfer, 5u);
    ReadReq r;
    r.xfer = 6;
    r.chunk = kMinChunk;
    r.segs = {{1, 0, 10}};
    ReadReq rout;
    msg = encode_read_req(r);
    ASSERT_TRUE(decode_read_req(body_of(msg), flags_of(msg), &rout).ok());
    EXPECT_EQ(rout.chunk, kMinChunk);
    EXPECT_EQ(rout.flags, 0);
    // The reader's "inline welcome" travels in the header; other bits are ignored.
    r.flags = kFlagInline;
    ASSERT_TRUE(
        decode_read_req(body_of(encode_read_req(r)), flags_of(encode_read_req(r)), &rout).ok());
    EXPECT_EQ(rout.flags, kFlagInline);
    ASSERT_TRUE(decode_read_req(body_of(msg), 0xfffc, &rout).ok());
    EXPECT_EQ(rout.flags, 0);
    // Its notification follows the segments, with kFlagNotif.
    r.flags = kFlagNotif;
    r.notification = "blocks 3-9 read";
    const std::string with_note = encode_read_req(r);
    ASSERT_TRUE(decode_read_req(body_of(with_note), flags_of(with_note), &rout).ok());
    EXPECT_EQ(rout.flags, kFlagNotif);
    EXPECT_EQ(rout.notification, "blocks 3-9 read");
    EXPECT_EQ(decode_read_req(body_of(with_note), 0, &rout).code(), StatusCode::kProtocol);
    EXPECT_EQ(decode_read_req(body_of(msg), kFlagNotif, &rout).code(), StatusCode::kProtocol);
    r.notification = {};
    r.flags = 0;
    // READ_DONE: the id and whether the data arrived (0 or 1, nothing else).
    ReadDone done;
    ASSERT_TRUE(decode_read_done(body_of(encode_read_done(ReadDone{77, true})), &done).ok());
    EXPECT_EQ(done.xfer, 77u);
    EXPECT_TRUE(done.delivered);
    ASSERT_TRUE(decode_read_done(body_of(encode_read_done(ReadDone{78, false})), &done).ok());
    EXPECT_FALSE(done.delivered);
    std::string bad(body_of(encode_read_done(ReadDone{79, true})));
    bad.back() = 2;
    EXPECT_EQ(decode_read_done(bad, &done).code(), StatusCode::kProtocol);
    // Below the smallest chunk (but not 0, "the agreed one"): malformed.
    set_request_chunk(&msg, kMinChunk - 1);
    EXPECT_EQ(decode_read_req(body_of(msg), 0, &rout).code(), StatusCode::kProtocol);
    msg = encode_write_req(w);
    end_message(&msg);
    set_request_chunk(&msg, 1);
    EXPECT_EQ(decode_write_req(body_of(msg), flags_of(msg), &wout).code(), StatusCode::kProtocol);
}

// A heartbeat carries the count of chunks its sender moved with us, or nothing (during the
// handshake); any other body is refused.
TEST(CtrlWire, PingCarriesTheChunksMovedOrNothing) {
    std::optional<uint64_t> moved;
    ASSERT_TRUE(decode_ping(body_of(encode_ping(0xfedcba9876543210ull)), &moved).ok());
    ASSERT_TRUE(moved.has_value());
    EXPECT_EQ(*moved, 0xfedcba9876543210ull);
    ASSERT_TRUE(decode_ping(body_of(encode_empty(MsgType::kPing)), &moved).ok());
    EXPECT_FALSE(moved.has_value());
    const std::string full(body_of(encode_ping(7)));
    for (size_t n = 1; n < full.size(); ++n) {
        EXPECT_EQ(decode_ping(full.substr(0, n), &moved).code(), StatusCode::kProtocol) << n;
    }
    EXPECT_EQ(decode_ping(full + "x", &moved).code(), StatusCode::kProtocol);
}

TEST(CtrlWire, EveryTruncationIsRefused) {
    WriteReq req;
    req.xfer = 1;
    req.flags = kFlagNotif | kFlagInline;
    req.segs = {{1, 0, 4}, {2, 8, 4}};
    req.notification = "note";
    std::string w = encode_write_req(req);
    w += "12345678";
    end_message(&w);
    const std::string messages[] = {
        w,
        encode_write_ack(5, Status(StatusCode::kNotFound, "nope")),
        encode_read_req(ReadReq{kFlagInline | kFlagNotif, 9, 0, {{1, 2, 3}}, "note"}),
        encode_read_done(ReadDone{9, true}),
        encode_recv_cts(1, 2, Status()),
        encode_send_rts(SendRts{1, 2, 3}),
        encode_notif("payload"),
    };
    for (const std::string& msg : messages) {
        const std::string_view body = body_of(msg);
        const uint16_t flags = flags_of(msg);
        Header h;
        std::memcpy(&h, msg.data(), sizeof(h));
        for (size_t cut = 0; cut < body.size(); ++cut) {
            const std::string_view part = body.substr(0, cut);
            Status st;
            switch (static_cast<MsgType>(h.type)) {
                case MsgType::kWriteReq: {
                    WriteReq m;
                    st = decode_write_req(part, flags, &m);
                    break;
                }
                case MsgType::kWriteAck: {
                    WriteAck m;
                    st = decode_write_ack(part, &m);
                    break;
                }
                case MsgType::kReadReq: {
                    ReadReq m;
                    st = decode_read_req(part, flags, &m);
                    break;
                }
                case MsgType::kRecvCts: {
                    RecvCts m;
                    st = decode_recv_cts(part, &m);
                    break;
                }
                case MsgType::kSendRts: {
                    SendRts m;
                    st = decode_send_rts(part, &m);
                    break;
                }
                case MsgType::kNotif: {
                    std::string_view m;
                    st = decode_notif(part, &m);
                    break;
                }
                case MsgType::kReadDone: {
                    ReadDone m;
                    st = decode_read_done(part, &m);
                    break;
                }
                default:
                    FAIL();
            }
            EXPECT_EQ(st.code(), StatusCode::kProtocol)
                << msg_type_name(static_cast<MsgType>(h.type)) << " cut at " << cut;
        }
    }
}

TEST(CtrlWire, ForgedCountsAndLengthsAreRefused) {
    // A segment count far beyond the body: refused before any allocation.
    std::string body;
    Writer w(&body);
    w.u64(1);
    w.u32(0x7fffffff);
    WriteReq m;
    EXPECT_EQ(decode_write_req(body, 0, &m).code(), StatusCode::kProtocol);
    // Inline data shorter or longer than the segments say.
    WriteReq req;
    req.flags = kFlagInline;
    req.segs = {{1, 0, 10}};
    std::string msg = encode_write_req(req);
    msg += "short";
    end_message(&msg);
    EXPECT_EQ(decode_write_req(body_of(msg), kFlagInline, &m).code(), StatusCode::kProtocol);
    msg = encode_write_req(req);
    msg += std::string(11, 'x');
    end_message(&msg);
    EXPECT_EQ(decode_write_req(body_of(msg), kFlagInline, &m).code(), StatusCode::kProtocol);
    // Trailing bytes without the inline flag.
    msg = encode_write_req(WriteReq{1, 0, 0, {{1, 0, 10}}, {}, {}});
    msg += "junk";
    end_message(&msg);
    EXPECT_EQ(decode_write_req(body_of(msg), 0, &m).code(), StatusCode::kProtocol);
    // Segment lengths that overflow when summed.
    msg = encode_write_req(WriteReq{1, 0, 0, {{1, 0, UINT64_MAX}, {2, 0, 2}}, {}, {}});
    end_message(&msg);
    EXPECT_EQ(decode_write_req(body_of(msg), 0, &m).code(), StatusCode::kProtocol);
    // The same for a read: its server adds them up too.
    ReadReq rm;
    msg = encode_read_req(ReadReq{0, 1, 0, {{1, 0, UINT64_MAX}, {2, 0, 2}}, {}});
    EXPECT_EQ(decode_read_req(body_of(msg), 0, &rm).code(), StatusCode::kProtocol);
    msg = encode_read_req(ReadReq{0, 1, 0, {{1, 0, UINT64_MAX - 2}, {2, 0, 2}}, {}});
    EXPECT_TRUE(decode_read_req(body_of(msg), 0, &rm).ok());
    // SEND_DATA whose inline bytes disagree with its length.
    msg = encode_send_data(1, kFlagInline, 4);
    msg += "abc";
    end_message(&msg);
    SendData d;
    EXPECT_EQ(decode_send_data(body_of(msg), kFlagInline, &d).code(), StatusCode::kProtocol);
    // Inline data of kMaxInlineData is taken; one byte more (the body's limit allows 64 MiB) is
    // malformed, in each of the three messages that carry a transfer's bytes.
    for (const size_t len : {size_t{kMaxInlineData}, size_t{kMaxInlineData} + 1}) {
        SCOPED_TRACE(len);
        const bool ok = len <= kMaxInlineData;
        const std::string data(len, 'd');
        req.segs = {{1, 0, len}};
        msg = encode_write_req(req);
        msg += data;
        end_message(&msg);
        EXPECT_EQ(decode_write_req(body_of(msg), kFlagInline, &m).ok(), ok);
        msg = encode_read_resp(1, kFlagInline, Status());
        msg += data;
        end_message(&msg);
        ReadResp rr;
        EXPECT_EQ(decode_read_resp(body_of(msg), kFlagInline, &rr).ok(), ok);
        msg = encode_send_data(1, kFlagInline, len);
        msg += data;
        end_message(&msg);
        EXPECT_EQ(decode_send_data(body_of(msg), kFlagInline, &d).ok(), ok);
    }
}

TEST(CtrlWire, HelloIsCheckedWhole) {
    Hello hello;
    hello.channels = 2;
    hello.name = "x";
    hello.handles.resize(2);
    std::string msg = encode_hello(hello);
    Hello out;
    ASSERT_TRUE(decode_hello(body_of(msg), &out).ok());
    EXPECT_EQ(out.handles.size(), 2u);
    hello.handles.resize(1);  // fewer handles than channels
    msg = encode_hello(hello);
    EXPECT_EQ(decode_hello(body_of(msg), &out).code(), StatusCode::kProtocol);
    hello.handles.resize(2);
    hello.version = 9;
    msg = encode_hello(hello);
    Status st = decode_hello(body_of(msg), &out);
    EXPECT_EQ(st.code(), StatusCode::kProtocol);
    EXPECT_NE(st.message().find("version 9"), std::string::npos) << st.to_string();
    hello.version = kVersion;
    hello.name = std::string(kMaxName + 1, 'n');
    msg = encode_hello(hello);
    EXPECT_EQ(decode_hello(body_of(msg), &out).code(), StatusCode::kProtocol);
    // A MAC is the last kAuthBytes, or nothing: the signed part is everything before it.
    hello.name = "x";
    const std::string unsigned_body(body_of(encode_hello(hello)));
    hello.mac = std::string(kAuthBytes, 'm');
    msg = encode_hello(hello);
    ASSERT_TRUE(decode_hello(body_of(msg), &out).ok());
    EXPECT_EQ(out.mac, hello.mac);
    EXPECT_EQ(hello_signed_part(body_of(msg), out), unsigned_body);
    for (const size_t n : {size_t{1}, kAuthBytes - 1, kAuthBytes + 1}) {
        hello.mac = std::string(n, 'm');
        msg = encode_hello(hello);
        EXPECT_EQ(decode_hello(body_of(msg), &out).code(), StatusCode::kProtocol) << n;
    }
}

// A peer's name reaches logs, errors and the application: no control characters in it, from
// the first message on. Other bytes (UTF-8) are names like any.
TEST(CtrlWire, NamesWithControlCharactersAreRefused) {
    const std::string bad[] = {std::string("a\0b", 3), "esc\x1b[31m", "line\nbreak", "del\x7f"};
    for (const std::string& name : bad) {
        EXPECT_FALSE(valid_name(name)) << printable(name);
        Hello hello;
        hello.channels = 1;
        hello.name = name;
        hello.handles.resize(1);
        Hello out;
        EXPECT_EQ(decode_hello(body_of(encode_hello(hello)), &out).code(), StatusCode::kProtocol);
        const std::string nonce(kAuthBytes, 'n');
        AuthInit init{kVersion, nonce, name};
        AuthInit init_out;
        EXPECT_EQ(decode_auth_init(body_of(encode_auth_init(init)), &init_out).code(),
                  StatusCode::kProtocol);
    }
    EXPECT_TRUE(valid_name("node-1:port/gpu_0 (spare)"));
    EXPECT_TRUE(valid_name("\xe3\x83\x8e\xe3\x83\xbc\xe3\x83\x89"));  // UTF-8
    EXPECT_TRUE(valid_name(""));
    EXPECT_FALSE(valid_name(std::string(kMaxName + 1, 'n')));
}

TEST(CtrlWire, PeerResultsKeepTheirCode) {
    Status st =
        to_status(Result{static_cast<uint32_t>(StatusCode::kOutOfRange), "too far"}, "peer 'b'");
    EXPECT_EQ(st.code(), StatusCode::kOutOfRange);
    EXPECT_EQ(st.message(), "peer 'b': too far");
    EXPECT_EQ(to_status(Result{999, "odd"}, "p").code(), StatusCode::kRemote);
    EXPECT_TRUE(to_status(Result{0, ""}, "p").ok());
}

TEST(CtrlWire, PeerMessagesArePrintableAndBounded) {
    // A reply's message is the peer's words: terminal escapes and newlines do not reach ours,
    // and a message of megabytes (the body may be 64 MiB) keeps only its first kMaxPeerMessage.
    Status st = to_status(Result{static_cast<uint32_t>(StatusCode::kNotFound),
                                 std::string("no \x1b[2Jkey\n\0here", 16)},
                          "peer 'b'");
    EXPECT_EQ(st.code(), StatusCode::kNotFound);
    EXPECT_EQ(st.message(), "peer 'b': no ?[2Jkey??here");
    const std::string huge(4u << 20, 'x');
    st = to_status(Result{static_cast<uint32_t>(StatusCode::kInternal), huge}, "p");
    EXPECT_EQ(st.message(), "p: " + std::string(kMaxPeerMessage, 'x') + " [" +
                                std::to_string(huge.size() - kMaxPeerMessage) + " more bytes]");
}

}  // namespace
}  // namespace tcpx::engine::wire
