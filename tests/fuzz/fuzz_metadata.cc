// An endpoint's metadata as a peer hands it over (engine::decode_metadata): what decodes must
// encode back to bytes that decode to the same endpoint, and re-encoding is a fixed point.
// (Bytes the format ignores, the unused tail of an IPv4 address and its scope, do not survive.)
#include <cstddef>
#include <cstdint>

#include "engine/ctrl_wire.h"
#include "engine/metadata.h"
#include "fuzz_check.h"

namespace {

bool same(const tcpx::engine::EndpointAddress& a, const tcpx::engine::EndpointAddress& b) {
    return a.name == b.name && a.gpu == b.gpu && a.nonce == b.nonce &&
           a.address.family() == b.address.family() && a.address.port() == b.address.port() &&
           a.address.to_string() == b.address.to_string() && a.address.same_host(b.address);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    auto decoded = tcpx::engine::decode_metadata(as_view(data, size));
    if (!decoded.ok()) {
        FUZZ_CHECK(decoded.status().code() == tcpx::StatusCode::kInvalidArgument);
        return 0;
    }
    const tcpx::engine::EndpointAddress& a = *decoded;
    FUZZ_CHECK(a.name.size() <= tcpx::engine::wire::kMaxName);
    FUZZ_CHECK(a.address.port() != 0);
    const std::string bytes = tcpx::engine::encode_metadata(a);
    FUZZ_CHECK(bytes.size() == size);
    auto again = tcpx::engine::decode_metadata(bytes);
    FUZZ_CHECK(again.ok());
    FUZZ_CHECK(same(*again, a));
    FUZZ_CHECK(tcpx::engine::encode_metadata(*again) == bytes);
    return 0;
}
