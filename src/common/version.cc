#include "tcpx/version.h"

#ifndef TCPX_P2P_VERSION
#error "TCPX_P2P_VERSION must be defined by the build"
#endif

namespace tcpx {

const char* version_string() { return TCPX_P2P_VERSION; }

}  // namespace tcpx
