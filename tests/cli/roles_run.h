// The two roles of `tcpx-p2p bench engine` (or of tcpx-nixl-bench, which has the same) as two
// processes: the target (--listen) started in the background and its banner read for the address
// it listens on, the initiator (--connect) run to completion. `prefix` runs the target under
// another command (`ip netns exec NS`).
#pragma once

#include <gtest/gtest.h>

#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <chrono>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "common/socket.h"
#include "tests/cli/cli_run.h"
#include "tests/support/closed_port.h"
#include "tests/support/subprocess.h"

namespace tcpx::testing {

class ListeningTarget {
 public:
    // Starts `cli bench engine --listen <listen> <extra>...` and waits for its banner; false (with
    // a test failure) when it does not print one.
    bool start(const std::string& cli, const std::string& listen,
               std::vector<std::string> extra = {}, std::vector<std::string> prefix = {}) {
        std::vector<std::string> argv = std::move(prefix);
        for (const std::string& a :
             {cli, std::string("bench"), std::string("engine"), std::string("--listen"), listen}) {
            argv.push_back(a);
        }
        argv.insert(argv.end(), extra.begin(), extra.end());
        return start_program(argv);
    }

    // Starts another program's target (`argv` holds its --listen) with `env` added to the
    // environment, and waits for its banner as start() does.
    bool start_program(const std::vector<std::string>& argv,
                       const std::map<std::string, std::string>& env = {}) {
        if (!p_.start(argv, env, /*merge_stderr=*/true)) {
            ADD_FAILURE() << "could not start the target";
            return false;
        }
        for (std::string line; p_.read_line(&line, std::chrono::seconds(20));) {
            output_ += line + "\n";
            const std::string mark = "listening on ";
            const size_t at = line.find(mark);
            if (at == std::string::npos) continue;
            const size_t end = line.find(' ', at + mark.size());
            address_ = line.substr(at + mark.size(), end - (at + mark.size()));
            return true;
        }
        ADD_FAILURE() << "the target printed no banner:\n" << output_;
        return false;
    }

    // HOST:PORT from the banner.
    const std::string& address() const { return address_; }
    std::string port() const { return address_.substr(address_.rfind(':') + 1); }

    // Reads what is left of its output and waits for its exit (as from waitpid; -1: none within
    // `timeout`).
    int finish(std::chrono::seconds timeout = std::chrono::seconds(30)) {
        for (std::string line; p_.read_line(&line, timeout);) output_ += line + "\n";
        return p_.wait(timeout);
    }
    const std::string& output() const { return output_; }

 private:
    Subprocess p_;
    std::string address_;
    std::string output_;
};

// A raw client of the target's side channel: sends `lines`, returns what came back until the
// target closed (or 5 s passed).
inline std::string side_channel_exchange(const ListeningTarget& target, const std::string& lines) {
    const auto addr =
        SocketAddress::parse("127.0.0.1", static_cast<uint16_t>(std::stoi(target.port())));
    EXPECT_TRUE(addr.ok());
    auto fd = connect_blocking(*addr, 5000);
    EXPECT_TRUE(fd.ok());
    if (!fd.ok()) return "";
    EXPECT_TRUE(send_all(fd->get(), lines.data(), lines.size()).ok());
    timeval tv{5, 0};
    ::setsockopt(fd->get(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    std::string got;
    char buf[4096];
    for (ssize_t n; (n = ::recv(fd->get(), buf, sizeof(buf), 0)) > 0;) {
        got.append(buf, static_cast<size_t>(n));
    }
    return got;
}

}  // namespace tcpx::testing
