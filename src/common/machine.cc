#include "common/machine.h"

#include <sched.h>

#include <thread>

namespace tcpx {

int usable_cores() {
    static const int cores = [] {
        cpu_set_t set;
        CPU_ZERO(&set);
        if (sched_getaffinity(0, sizeof(set), &set) == 0) {
            const int n = CPU_COUNT(&set);
            if (n > 0) return n;
        }
        const unsigned n = std::thread::hardware_concurrency();
        return n > 0 ? static_cast<int>(n) : 1;
    }();
    return cores;
}

}  // namespace tcpx
