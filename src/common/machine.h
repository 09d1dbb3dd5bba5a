// What this process may use of the machine it runs on, for defaults that adapt to it.
#pragma once

namespace tcpx {

// CPUs this process may run on (its affinity mask, which cpusets and `taskset` narrow), at least
// 1. Read once; a later change of affinity is not seen.
int usable_cores();

}  // namespace tcpx
