// tcpx/version.h — the library's version.
#pragma once

#include "tcpx/api.h"

namespace tcpx {

// "MAJOR.MINOR.PATCH" of the loaded libtcpx_p2p.
TCPX_API const char* version_string();

}  // namespace tcpx
