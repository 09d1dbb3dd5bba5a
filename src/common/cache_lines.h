// Writing what the CPU just wrote back to memory, for memory a device reads next.
//
// A receive into host memory is the kernel copying the bytes with the CPU: they end in its
// caches, modified. A GPU copy engine that then reads that memory by DMA takes each such line out
// of the cache that holds it modified, which took an H2D copy of 1 MiB 46 µs against 20-28 µs
// from clean lines on the H200 hosts (docs/benchmarking.md). Written back in the threads that
// received the bytes (many, in parallel; CLWB, which leaves the lines cached, clean), the copy
// reads clean lines.
#pragma once

#include <cstddef>
#include <cstdint>

namespace tcpx {

// Writes the modified lines of [data, data + len) back to memory (CLWB, which keeps them cached;
// nothing on CPUs without it). The bytes are unchanged. No fence: a device's DMA reads are
// coherent with the CPU's caches either way, so this only decides where they find the lines.
void write_back_lines(const void* data, size_t len);

// Bytes asked to be written back so far in this process, whether or not the CPU can (a
// diagnostic, for tests).
uint64_t bytes_written_back();

}  // namespace tcpx
