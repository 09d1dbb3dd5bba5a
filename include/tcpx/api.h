// tcpx/api.h — symbol visibility of the public API. libtcpx_p2p is built with hidden visibility;
// what the public headers declare with TCPX_API is all it exports.
#pragma once

#if defined(__GNUC__) || defined(__clang__)
#define TCPX_API [[gnu::visibility("default")]]
#else
#define TCPX_API
#endif
