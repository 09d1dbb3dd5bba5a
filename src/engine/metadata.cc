#include "engine/metadata.h"

#include <netinet/in.h>
#include <sys/socket.h>

#include <cstring>

#include "common/status_util.h"
#include "common/strings.h"
#include "engine/ctrl_wire.h"
#include "tcpx/endpoint.h"

namespace tcpx {
namespace engine {

namespace {
constexpr uint32_t kMetadataMagic = 0x44585054;   // "TPXD"
constexpr uint32_t kRemoteMemMagic = 0x4b585054;  // "TPXK"
constexpr uint16_t kFormatVersion = 1;
}  // namespace

std::string encode_metadata(const EndpointAddress& a) {
    std::string out;
    wire::Writer w(&out);
    w.u32(kMetadataMagic);
    w.u16(kFormatVersion);
    w.u16(static_cast<uint16_t>(a.address.family()));
    uint8_t addr[16] = {};
    if (a.address.family() == AF_INET) {
        std::memcpy(addr, &reinterpret_cast<const sockaddr_in*>(a.address.get())->sin_addr, 4);
    } else {
        std::memcpy(addr, &reinterpret_cast<const sockaddr_in6*>(a.address.get())->sin6_addr, 16);
    }
    w.raw(addr, sizeof(addr));
    const uint32_t scope =
        a.address.family() == AF_INET6
            ? reinterpret_cast<const sockaddr_in6*>(a.address.get())->sin6_scope_id
            : 0;
    w.u32(scope);
    w.u16(a.address.port());
    w.u32(static_cast<uint32_t>(a.gpu));
    w.u64(a.nonce);
    w.str(a.name);
    return out;
}

StatusOr<EndpointAddress> decode_metadata(std::string_view bytes) {
    wire::Reader r(bytes);
    const uint32_t magic = r.u32();
    const uint16_t version = r.u16();
    if (r.failed() || magic != kMetadataMagic) {
        return invalid_argument("not tcpx-p2p endpoint metadata");
    }
    if (version != kFormatVersion) {
        return invalid_argument(
            strformat("endpoint metadata of format version %u; this build "
                      "reads version %u",
                      version, kFormatVersion));
    }
    const uint16_t family = r.u16();
    std::string_view addr = r.raw(16);
    const uint32_t scope = r.u32();
    const uint16_t port = r.u16();
    EndpointAddress out;
    out.gpu = static_cast<int32_t>(r.u32());
    out.nonce = r.u64();
    out.name = std::string(r.str(wire::kMaxName));
    if (r.failed() || r.left() != 0)
        return invalid_argument("truncated or malformed endpoint metadata");
    // The name is checked as a peer's HELLO would be, where it is compared with this one.
    if (!wire::valid_name(out.name)) {
        return invalid_argument("endpoint metadata names an endpoint with control characters");
    }
    sockaddr_storage ss{};
    socklen_t len = 0;
    if (family == AF_INET) {
        auto* in = reinterpret_cast<sockaddr_in*>(&ss);
        in->sin_family = AF_INET;
        std::memcpy(&in->sin_addr, addr.data(), 4);
        in->sin_port = htons(port);
        len = sizeof(sockaddr_in);
    } else if (family == AF_INET6) {
        auto* in6 = reinterpret_cast<sockaddr_in6*>(&ss);
        in6->sin6_family = AF_INET6;
        std::memcpy(&in6->sin6_addr, addr.data(), 16);
        in6->sin6_port = htons(port);
        in6->sin6_scope_id = scope;
        len = sizeof(sockaddr_in6);
    } else {
        return invalid_argument(strformat("endpoint metadata with address family %u", family));
    }
    TCPX_ASSIGN_OR_RETURN(out.address,
                          SocketAddress::from_sockaddr(reinterpret_cast<sockaddr*>(&ss), len));
    if (port == 0) return invalid_argument("endpoint metadata without a port");
    return out;
}

}  // namespace engine

std::string RemoteMem::serialize() const {
    std::string out;
    engine::wire::Writer w(&out);
    w.u32(engine::kRemoteMemMagic);
    w.u16(engine::kFormatVersion);
    w.u8(static_cast<uint8_t>(kind));
    w.u8(0);
    w.u64(addr);
    w.u64(len);
    w.u64(key);
    w.u32(static_cast<uint32_t>(device));
    return out;
}

StatusOr<RemoteMem> RemoteMem::parse(std::string_view bytes) {
    engine::wire::Reader r(bytes);
    const uint32_t magic = r.u32();
    const uint16_t version = r.u16();
    if (r.failed() || magic != engine::kRemoteMemMagic) {
        return invalid_argument("not a tcpx-p2p memory descriptor");
    }
    if (version != engine::kFormatVersion) {
        return invalid_argument(
            strformat("memory descriptor of format version %u; this build "
                      "reads version %u",
                      version, engine::kFormatVersion));
    }
    RemoteMem m;
    const uint8_t kind = r.u8();
    r.u8();
    m.addr = r.u64();
    m.len = r.u64();
    m.key = r.u64();
    m.device = static_cast<int32_t>(r.u32());
    if (r.failed() || r.left() != 0) return invalid_argument("truncated memory descriptor");
    if (kind > static_cast<uint8_t>(MemKind::kCuda)) {
        return invalid_argument(strformat("memory descriptor of unknown kind %u", kind));
    }
    m.kind = static_cast<MemKind>(kind);
    return m;
}

}  // namespace tcpx
