// The C API (tcpx/tcpx.h). Being written; see include/tcpx/tcpx.h.
