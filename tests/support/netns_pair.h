// Two network namespaces joined by veth pairs, for tests that need two "hosts" with real links
// between them (tests/netns): needs root and iproute2; elsewhere make() says why, to skip.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <string>

namespace tcpx::testing {

// Runs a shell command, its output discarded; its exit status (-1 if it did not exit).
int sh(const std::string& cmd);

// Whole messages over a stream socket: a length, then the bytes (at most 1 MiB).
bool send_msg(int fd, const std::string& m);
bool recv_msg(int fd, std::string* m);

// Bytes sent through interface `name` of this process's network namespace (/proc/self/net/dev).
uint64_t tx_bytes(const std::string& name);

// Namespaces A (side 0) and B (side 1), joined by `links` veth pairs: link k has
// 10.201.(k+1).(side+1)/24 on each side, and lo is up in both. Removed, with their links, when
// this is destroyed.
class NetnsPair {
 public:
    NetnsPair() = default;
    NetnsPair(const NetnsPair&) = delete;
    NetnsPair& operator=(const NetnsPair&) = delete;
    ~NetnsPair();

    // Makes them. Empty on success; else what is missing, with *skip set where the machine
    // cannot have them (not root, no `ip`, no namespace support) rather than a failure.
    std::string make(int links, bool* skip);

    const std::string& ns(int side) const { return ns_[side]; }
    // The name of link k on `side` (unique to this process).
    std::string link(int side, int k) const;
    // Runs `fn` in a child that entered namespace `side`; its exit status is fn's (90: the child
    // could not enter the namespace).
    pid_t fork_in(int side, const std::function<int()>& fn) const;

 private:
    std::string ns_[2];
    bool made_[2] = {false, false};
};

}  // namespace tcpx::testing
