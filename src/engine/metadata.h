// The binary forms peers exchange out of band: an endpoint's metadata and the descriptor of a
// registration (RemoteMem). Both start with a magic number and a version, and every field is
// checked when parsed.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "common/socket.h"
#include "tcpx/status.h"

namespace tcpx::engine {

struct EndpointAddress {
    std::string name;
    SocketAddress address;  // the control listener
    int32_t gpu = -1;
    uint64_t nonce = 0;
};

std::string encode_metadata(const EndpointAddress& a);
StatusOr<EndpointAddress> decode_metadata(std::string_view bytes);

}  // namespace tcpx::engine
