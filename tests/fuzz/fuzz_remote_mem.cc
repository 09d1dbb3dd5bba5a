// The registration descriptor peers exchange (RemoteMem::parse, what tcpx_write/tcpx_read and
// Endpoint::write/read take from a peer): what parses must serialize back to bytes that parse to
// the same descriptor, and re-serializing is a fixed point. (The reserved byte does not survive.)
#include <cstddef>
#include <cstdint>

#include "fuzz_check.h"
#include "tcpx/endpoint.h"

namespace {

bool same(const tcpx::RemoteMem& a, const tcpx::RemoteMem& b) {
    return a.addr == b.addr && a.len == b.len && a.key == b.key && a.kind == b.kind &&
           a.device == b.device;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    auto parsed = tcpx::RemoteMem::parse(as_view(data, size));
    if (!parsed.ok()) {
        FUZZ_CHECK(parsed.status().code() == tcpx::StatusCode::kInvalidArgument);
        return 0;
    }
    const tcpx::RemoteMem& m = *parsed;
    FUZZ_CHECK(m.kind == tcpx::MemKind::kHost || m.kind == tcpx::MemKind::kCuda);
    const std::string bytes = m.serialize();
    FUZZ_CHECK(bytes.size() == size);
    auto again = tcpx::RemoteMem::parse(bytes);
    FUZZ_CHECK(again.ok());
    FUZZ_CHECK(same(*again, m));
    FUZZ_CHECK(again->serialize() == bytes);
    return 0;
}
