#include "tests/support/netns_pair.h"

#include <fcntl.h>
#include <sched.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <sstream>

namespace tcpx::testing {

int sh(const std::string& cmd) {
    const int rc = std::system((cmd + " >/dev/null 2>&1").c_str());
    return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

bool send_msg(int fd, const std::string& m) {
    const uint64_t n = m.size();
    std::string out(reinterpret_cast<const char*>(&n), sizeof(n));
    out += m;
    size_t at = 0;
    while (at < out.size()) {
        const ssize_t w = ::write(fd, out.data() + at, out.size() - at);
        if (w <= 0) return false;
        at += static_cast<size_t>(w);
    }
    return true;
}

namespace {

bool recv_all(int fd, char* p, size_t n) {
    while (n > 0) {
        const ssize_t r = ::read(fd, p, n);
        if (r <= 0) return false;
        p += r;
        n -= static_cast<size_t>(r);
    }
    return true;
}

}  // namespace

bool recv_msg(int fd, std::string* m) {
    uint64_t n = 0;
    if (!recv_all(fd, reinterpret_cast<char*>(&n), sizeof(n)) || n > (1u << 20)) return false;
    m->resize(n);
    return recv_all(fd, m->data(), n);
}

uint64_t tx_bytes(const std::string& name) {
    std::ifstream in("/proc/self/net/dev");
    std::string line;
    while (std::getline(in, line)) {
        const size_t colon = line.find(':');
        if (colon == std::string::npos) continue;
        std::string ifname = line.substr(0, colon);
        ifname.erase(0, ifname.find_first_not_of(' '));
        if (ifname != name) continue;
        std::istringstream fields(line.substr(colon + 1));
        uint64_t v[9] = {};
        for (uint64_t& x : v) fields >> x;
        return v[8];  // rx: bytes packets errs drop fifo frame compressed multicast; tx: bytes
    }
    return 0;
}

NetnsPair::~NetnsPair() {
    for (int side = 0; side < 2; ++side) {
        if (made_[side]) sh("ip netns del " + ns_[side]);
    }
}

std::string NetnsPair::make(int links, bool* skip) {
    *skip = true;
    if (::geteuid() != 0) return "network namespaces need root";
    if (sh("ip -V") != 0) return "no `ip` (iproute2)";
    const std::string tag = std::to_string(::getpid() % 100000);
    ns_[0] = "tcpxA" + tag;
    ns_[1] = "tcpxB" + tag;
    if (sh("ip netns add " + ns_[0]) != 0) return "`ip netns add` failed (no namespace support)";
    made_[0] = true;
    *skip = false;
    if (sh("ip netns add " + ns_[1]) != 0) return "ip netns add " + ns_[1];
    made_[1] = true;
    for (int k = 0; k < links; ++k) {
        const std::string a = link(0, k), b = link(1, k);
        const std::string add = "ip link add " + a + " netns " + ns_[0] + " type veth peer name " +
                                b + " netns " + ns_[1];
        if (sh(add) != 0) return add;
        for (int side = 0; side < 2; ++side) {
            const std::string dev = link(side, k);
            const std::string addr =
                "10.201." + std::to_string(k + 1) + "." + std::to_string(side + 1) + "/24";
            for (const std::string& cmd :
                 {"ip -n " + ns_[side] + " addr add " + addr + " dev " + dev,
                  "ip -n " + ns_[side] + " link set " + dev + " up"}) {
                if (sh(cmd) != 0) return cmd;
            }
        }
    }
    for (int side = 0; side < 2; ++side) {
        const std::string up = "ip -n " + ns_[side] + " link set lo up";
        if (sh(up) != 0) return up;
    }
    return "";
}

std::string NetnsPair::link(int side, int k) const {
    return std::string(side == 0 ? "ta" : "tb") + std::to_string(k + 1) + "-" + ns_[0].substr(5);
}

pid_t NetnsPair::fork_in(int side, const std::function<int()>& fn) const {
    const pid_t pid = ::fork();
    if (pid != 0) return pid;
    const int fd = ::open(("/var/run/netns/" + ns_[side]).c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0 || ::setns(fd, CLONE_NEWNET) != 0) _exit(90);
    ::close(fd);
    _exit(fn());
}

}  // namespace tcpx::testing
