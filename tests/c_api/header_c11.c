// Compiled by the c_api_header_* tests with -Wall -Wextra -Werror -pedantic, as C11 and as C++:
// tcpx/tcpx.h must stand alone in both languages.
#include "tcpx/tcpx.h"

int tcpx_header_check(void);
int tcpx_header_check(void) {
    tcpx_endpoint_info_t info;
    tcpx_iov_t iov;
    tcpx_status_t st = TCPX_ERR_INTERNAL;
    info.port = 1;
    iov.len = 2;
    return (int)sizeof(info.name) + (int)info.port + (int)iov.len + (int)st;
}
