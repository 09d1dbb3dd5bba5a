// A loopback port where nothing listens, for tests of "nothing answers there". Header-only.
#pragma once

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>

namespace tcpx::testing {

// A port of 127.0.0.1 where nothing listens for as long as it lives: bound, never listening, so a
// connection there is refused, and no other process (a test running beside this one) can take
// it meanwhile, as it could a port found free and closed again.
class ClosedPort {
 public:
    ClosedPort() {
        fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        sockaddr_in addr{};
        addr.sin_family = AF_INET;
        addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        socklen_t len = sizeof(addr);
        EXPECT_TRUE(fd_ >= 0 && ::bind(fd_, reinterpret_cast<sockaddr*>(&addr), len) == 0 &&
                    ::getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len) == 0);
        port_ = std::to_string(ntohs(addr.sin_port));
    }
    ~ClosedPort() {
        if (fd_ >= 0) ::close(fd_);
    }
    ClosedPort(const ClosedPort&) = delete;
    ClosedPort& operator=(const ClosedPort&) = delete;
    const std::string& port() const { return port_; }

 private:
    int fd_ = -1;
    std::string port_;
};

}  // namespace tcpx::testing
