// The two roles of `tcpx-p2p bench engine` (or of tcpx-nixl-bench, which has the same) as two
// processes: the target (--listen) started in the background and its banner read for the address
// it listens on, the initiator (--connect) run to completion. `prefix` runs the target under
// another command (`ip netns exec NS`).
#pragma once

#include <gtest/gtest.h>

#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <chrono>
#include <functional>
#include <map>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "common/socket.h"
#include "common/status_util.h"
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
    // A client connection to its side channel (it listens on 127.0.0.1 in these tests).
    StatusOr<Fd> connect() const {
        TCPX_ASSIGN_OR_RETURN(
            const SocketAddress addr,
            SocketAddress::parse("127.0.0.1", static_cast<uint16_t>(std::stoi(port()))));
        return connect_blocking(addr, 5000);
    }

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
    auto fd = target.connect();
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

// A man in the middle of the side channel, for hostile replies: listens on 127.0.0.1 (an
// ephemeral port) for one initiator, connects it to the target at `target_port`, and forwards the
// lines both ways, each of the target's through `rewrite(command, reply)` (`command`: the
// initiator's last line). Until either side closes, or 60 s.
class SideChannelProxy {
 public:
    using Rewrite =
        std::function<std::string(const std::string& command, const std::string& reply)>;

    bool start(const std::string& target_port, Rewrite rewrite) {
        auto listening = listen_tcp(*SocketAddress::parse("127.0.0.1", 0), 4);
        if (!listening.ok()) return false;
        listener_ = std::move(*listening);
        auto bound = local_address(listener_.get());
        if (!bound.ok()) return false;
        address_ = bound->to_string();
        const auto target =
            SocketAddress::parse("127.0.0.1", static_cast<uint16_t>(std::stoi(target_port)));
        thread_ = std::thread(
            [this, target = *target, rewrite = std::move(rewrite)] { run(target, rewrite); });
        return true;
    }
    ~SideChannelProxy() {
        if (thread_.joinable()) thread_.join();
    }
    const std::string& address() const { return address_; }

 private:
    void run(const SocketAddress& target, const Rewrite& rewrite) {
        pollfd lp{listener_.get(), POLLIN, 0};
        if (::poll(&lp, 1, 60000) != 1) return;
        Fd ini(::accept(listener_.get(), nullptr, nullptr));
        auto tgt = connect_blocking(target, 5000);
        if (!ini.valid() || !tgt.ok()) return;
        std::string from_ini;
        std::string from_tgt;
        std::string command;
        const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
        while (std::chrono::steady_clock::now() < deadline) {
            pollfd p[2] = {{ini.get(), POLLIN, 0}, {tgt->get(), POLLIN, 0}};
            if (::poll(p, 2, 1000) < 0) return;
            for (int k = 0; k < 2; ++k) {
                if (p[k].revents == 0) continue;
                char buf[65536];
                const ssize_t n = ::recv(p[k].fd, buf, sizeof(buf), 0);
                if (n <= 0) return;
                std::string& in = k == 0 ? from_ini : from_tgt;
                in.append(buf, static_cast<size_t>(n));
                for (size_t nl; (nl = in.find('\n')) != std::string::npos;) {
                    std::string line = in.substr(0, nl);
                    in.erase(0, nl + 1);
                    if (k == 0) command = line;
                    line = k == 0 ? line : rewrite(command, line);
                    line += "\n";
                    const int to = k == 0 ? tgt->get() : ini.get();
                    if (!send_all(to, line.data(), line.size()).ok()) return;
                }
            }
        }
    }

    Fd listener_;
    std::string address_;
    std::thread thread_;
};

}  // namespace tcpx::testing
