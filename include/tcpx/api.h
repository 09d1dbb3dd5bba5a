// tcpx/api.h — symbol visibility of the public API. libtcpx_p2p is built with hidden visibility;
// what the public headers declare with TCPX_API (C++ headers) or TCPX_C_API (the C header,
// tcpx/tcpx.h) is all it exports.
#pragma once

#if defined(__GNUC__) || defined(__clang__)
#define TCPX_API [[gnu::visibility("default")]]
// The same, in a spelling that C11 compilers accept too (tcpx/tcpx.h is both C and C++).
#define TCPX_C_API __attribute__((visibility("default")))
#else
#define TCPX_API
#define TCPX_C_API
#endif
