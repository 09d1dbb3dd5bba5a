// Every decoder of the engine's control protocol (src/engine/ctrl_wire.h) on arbitrary bodies.
// Input: one byte that picks the message type (bits 0-3 and 6: the index in kTypes) and the
// header flags (bits 4-5: notification, inline data), then the body.
#include <cstddef>
#include <cstdint>

#include "ctrl_roundtrip.h"

namespace {

namespace w = tcpx::engine::wire;

constexpr w::MsgType kTypes[] = {
    w::MsgType::kHello,    w::MsgType::kWriteReq,      w::MsgType::kWriteAck,
    w::MsgType::kReadReq,  w::MsgType::kReadResp,      w::MsgType::kNotif,
    w::MsgType::kSendRts,  w::MsgType::kRecvCts,       w::MsgType::kSendData,
    w::MsgType::kReady,    w::MsgType::kPing,          w::MsgType::kBye,
    w::MsgType::kAuthInit, w::MsgType::kAuthChallenge, w::MsgType::kAuthProof,
    w::MsgType::kAuthFail, w::MsgType::kReadDone,
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    if (size < 1) return 0;
    const unsigned index = (data[0] & 0xfu) | ((data[0] >> 2) & 0x10u);
    const w::MsgType type = kTypes[index % std::size(kTypes)];
    const auto flags = static_cast<uint16_t>((data[0] >> 4) & (w::kFlagNotif | w::kFlagInline));
    tcpx::fuzz::check_message(type, flags, as_view(data + 1, size - 1));
    return 0;
}
