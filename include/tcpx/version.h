// tcpx/version.h — the library's version.
#pragma once

namespace tcpx {

// "MAJOR.MINOR.PATCH" of the loaded libtcpx_p2p.
const char* version_string();

}  // namespace tcpx
