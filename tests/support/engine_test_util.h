// Helpers for engine tests: endpoints on loopback, connected pairs, patterned buffers with
// canaries.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "tcpx/config.h"
#include "tcpx/endpoint.h"

namespace tcpx::testing {

// Loopback only, small socket counts, short timeouts so failures show quickly.
Config engine_test_config();

std::unique_ptr<Endpoint> make_endpoint(const std::string& name,
                                        const Config& config = engine_test_config());

// a connects to b; returns (a's id for b, b's id for a). Asserts (via gtest) on failure.
struct Link {
    PeerId a_to_b = 0;
    PeerId b_to_a = 0;
};
Link link(Endpoint* a, Endpoint* b);

// A buffer with `canary` bytes of 0xa5 on both sides of its `size` usable bytes, so a test can
// prove nothing outside the usable part (the registered region) changed.
class GuardedBuffer {
 public:
    static constexpr size_t kCanary = 4096;
    explicit GuardedBuffer(size_t size, uint8_t fill = 0);
    uint8_t* data() { return storage_.data() + kCanary; }
    size_t size() const { return size_; }
    // True when every canary byte is intact.
    bool canaries_intact() const;

 private:
    size_t size_;
    std::vector<uint8_t> storage_;
};

}  // namespace tcpx::testing
