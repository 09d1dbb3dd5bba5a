// Out of memory on demand: a test binary that links alloc_fault.cc has its global operator new
// replaced by one that, while an AllocFault is armed, throws std::bad_alloc (the nothrow forms
// return null) for chosen allocations. Only binaries that list alloc_fault.cc among their sources
// get the replacement; unarmed, it costs one relaxed atomic load per allocation.
#pragma once

#include <gtest/gtest.h>

#include <string>

namespace tcpx::test {

class AllocFault {
 public:
    // Fails allocations made by threads whose name (pthread_getname_np) starts with
    // `thread_prefix`, or by the constructing thread when the prefix is empty: the first `skip`
    // such allocations succeed, the next `count` fail, the rest succeed again.
    AllocFault(std::string thread_prefix, long skip, long count);
    ~AllocFault();  // disarms
    AllocFault(const AllocFault&) = delete;
    AllocFault& operator=(const AllocFault&) = delete;

    // How many allocations have failed so far.
    long failed() const;
};

// Runs `call` with one allocation of the calling thread failing, after its first `skip`.
// Returns whether the fault hit (the call allocated that many times); when it did, the call
// must have returned `expected` (a gtest failure names `what` otherwise).
template <typename Result, typename Call>
bool fails_with(Result expected, const char* what, long skip, Call call) {
    bool hit;
    Result result;
    {
        AllocFault fault("", skip, 1);
        result = call();
        hit = fault.failed() > 0;
    }
    if (hit) {
        EXPECT_EQ(result, expected) << what << ", allocation " << skip;
    }
    return hit;
}

}  // namespace tcpx::test
