// The NIXL backend "TCPX" between agents in different processes: the other agent lives in
// tcpx_nixl_peer, driven through its stdin/stdout (metadata crosses the pipe as hex). Transfers
// both ways with notifications, and a peer killed in the middle of a transfer.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "nixl_test_util.h"

extern char** environ;

namespace tcpx::nixl_test {
namespace {

using std::chrono::milliseconds;

// tcpx_nixl_peer as a child process, talked to line by line.
class Peer {
 public:
    Peer() = default;
    ~Peer() {
        if (pid_ > 0) {
            ::kill(pid_, SIGKILL);
            ::waitpid(pid_, nullptr, 0);
        }
        if (to_ >= 0) ::close(to_);
        if (from_ >= 0) ::close(from_);
    }
    Peer(const Peer&) = delete;
    Peer& operator=(const Peer&) = delete;

    // Starts the peer; fills addr and md from its "ready" line.
    // `env`: NAME=VALUE entries added to (or replacing) the environment it inherits.
    ::testing::AssertionResult start(const std::string& name, size_t size, uint64_t seed,
                                     const std::vector<std::string>& env = {}) {
        std::vector<std::string> entries;
        for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
            const std::string entry(*e);
            bool replaced = false;
            for (const std::string& mine : env) {
                replaced |=
                    entry.substr(0, entry.find('=') + 1) == mine.substr(0, mine.find('=') + 1);
            }
            if (!replaced) entries.push_back(entry);
        }
        entries.insert(entries.end(), env.begin(), env.end());
        std::vector<char*> envp;
        for (std::string& e : entries) envp.push_back(e.data());
        envp.push_back(nullptr);
        ::signal(SIGPIPE, SIG_IGN);  // a dead peer's stdin must not kill the test
        int in[2], out[2];
        if (::pipe2(in, O_CLOEXEC) != 0 || ::pipe2(out, O_CLOEXEC) != 0) {
            return ::testing::AssertionFailure() << "pipe: " << std::strerror(errno);
        }
        const std::string size_text = std::to_string(size), seed_text = std::to_string(seed);
        pid_ = ::fork();
        if (pid_ < 0) return ::testing::AssertionFailure() << "fork: " << std::strerror(errno);
        if (pid_ == 0) {
            ::dup2(in[0], 0);
            ::dup2(out[1], 1);
            const char* argv[] = {TCPX_NIXL_PEER_PATH, name.c_str(), size_text.c_str(),
                                  seed_text.c_str(), nullptr};
            ::execve(argv[0], const_cast<char* const*>(argv), envp.data());
            ::_exit(127);
        }
        ::close(in[0]);
        ::close(out[1]);
        to_ = in[1];
        from_ = out[0];
        std::string line = read_line(kTimeout);
        std::istringstream ready(line);
        std::string word, hex;
        ready >> word >> addr_ >> hex;
        if (word != "ready") {
            return ::testing::AssertionFailure() << "the peer said '" << line << "'";
        }
        md_ = from_hex(hex);
        return ::testing::AssertionSuccess();
    }

    // Sends a command, returns the reply line ("" on timeout or exit).
    std::string ask(const std::string& command) {
        const std::string line = command + "\n";
        if (::write(to_, line.data(), line.size()) != static_cast<ssize_t>(line.size())) return "";
        return read_line(kTimeout);
    }

    void send_signal(int sig) { ::kill(pid_, sig); }
    // Kills the peer and reaps it.
    void kill_now() {
        ::kill(pid_, SIGKILL);
        ::waitpid(pid_, nullptr, 0);
        pid_ = -1;
    }
    // Asks the peer to quit; its exit status.
    int quit() {
        ask("quit");
        int status = -1;
        ::waitpid(pid_, &status, 0);
        pid_ = -1;
        return status;
    }

    uintptr_t addr() const { return addr_; }
    const std::string& md() const { return md_; }

 private:
    std::string read_line(std::chrono::milliseconds timeout) {
        const auto deadline = std::chrono::steady_clock::now() + timeout;
        while (true) {
            const size_t nl = buffer_.find('\n');
            if (nl != std::string::npos) {
                std::string line = buffer_.substr(0, nl);
                buffer_.erase(0, nl + 1);
                return line;
            }
            const auto left = std::chrono::duration_cast<milliseconds>(
                deadline - std::chrono::steady_clock::now());
            if (left.count() <= 0) return "";
            pollfd p{from_, POLLIN, 0};
            if (::poll(&p, 1, static_cast<int>(left.count())) <= 0) continue;
            char chunk[65536];
            const ssize_t n = ::read(from_, chunk, sizeof(chunk));
            if (n <= 0) return "";
            buffer_.append(chunk, static_cast<size_t>(n));
        }
    }

    pid_t pid_ = -1;
    int to_ = -1;
    int from_ = -1;
    std::string buffer_;
    uintptr_t addr_ = 0;
    std::string md_;
};

// A descriptor list of {offset, length} ranges of the peer's buffer.
nixl_xfer_dlist_t peer_list(const Peer& peer,
                            const std::vector<std::pair<uint64_t, uint64_t>>& ranges) {
    nixl_xfer_dlist_t list(DRAM_SEG);
    for (const auto& [offset, len] : ranges)
        list.addDesc(nixlBasicDesc(peer.addr() + offset, len, 0));
    return list;
}

std::string check_cmd(uint64_t seed, uint64_t start, uint64_t offset, uint64_t len) {
    return "check " + std::to_string(seed) + " " + std::to_string(start) + " " +
           std::to_string(offset) + " " + std::to_string(len);
}

// --- 10: what the plugin advertises ------------------------------------------------------------

// getPluginParams advertises the settings as they would run, the environment's included: an
// application that creates the backend with exactly those (as NIXL's examples do) must not
// replace what TCPX_P2P_* says. The secret is never advertised (the parameters get logged).
TEST(NixlProcess, AdvertisedParametersFollowTheEnvironmentButNeverTheSecret) {
    Peer peer;
    ASSERT_TRUE(peer.start("params-env", 4096, 1,
                           {"TCPX_P2P_NSOCKS=3", "TCPX_P2P_CHANNELS=3", "TCPX_P2P_PORT=0",
                            "TCPX_P2P_XFER_CHUNK_SIZE=1M", "TCPX_P2P_SOCKET_IFNAME==lo",
                            "TCPX_P2P_AUTH_SECRET=a-secret-of-twenty-chars"}));
    const std::string line = peer.ask("params");
    std::map<std::string, std::string> got;
    std::istringstream in(line);
    std::string word;
    in >> word;
    ASSERT_EQ(word, "params") << line;
    while (in >> word) got[word.substr(0, word.find('='))] = word.substr(word.find('=') + 1);
    EXPECT_EQ(got["nsocks"], "3") << line;
    EXPECT_EQ(got["channels"], "3") << line;
    EXPECT_EQ(got["chunk_size"], "1048576") << line;
    EXPECT_EQ(got["interface"], "=lo") << line;
    EXPECT_EQ(got["auth_secret"], "") << line;
    EXPECT_EQ(line.find("a-secret-of"), std::string::npos) << line;
    EXPECT_EQ(peer.quit(), 0);
}

// --- 9: WRITE and READ between processes --------------------------------------------------------

TEST(NixlProcess, WriteAndReadBetweenProcesses) {
    constexpr size_t kSize = 8 << 20;
    constexpr uint64_t kPeerSeed = 3, kOurSeed = 5, kPeerSeed2 = 9;
    Peer peer;
    ASSERT_TRUE(peer.start("proc-b", kSize, kPeerSeed));
    auto buf = Buffer::create(DRAM_SEG, kSize);
    ASSERT_TRUE(buf);
    buf->fill(kOurSeed);
    TestAgent a("proc-a");
    ASSERT_TRUE(a.reg(*buf));
    ASSERT_EQ(a.load(peer.md()), "proc-b");

    // Pieces at different offsets on each side; the peer's bytes between them must not change.
    const std::vector<std::pair<uint64_t, uint64_t>> ours = {
        {100, 1}, {7000, 4096}, {20000, 3 << 20}, {(4 << 20) + 1, 65537}, {6 << 20, 1 << 20}};
    const std::vector<std::pair<uint64_t, uint64_t>> theirs = {
        {3, 1}, {50, 4096}, {5000, 3 << 20}, {(3 << 20) + 9000, 65537}, {(7 << 20) - 5, 1 << 20}};

    // WRITE with a notification, checked by the peer when it sees it.
    {
        const nixl_opt_args_t args = with_notif("proc write");
        nixlXferReqH* req = nullptr;
        ASSERT_EQ(a->createXferReq(NIXL_WRITE, xfer_list(*buf, ours), peer_list(peer, theirs),
                                   "proc-b", req, &args),
                  NIXL_SUCCESS);
        ASSERT_EQ(post_and_wait(a, req), NIXL_SUCCESS);
        EXPECT_EQ(a->releaseXferReq(req), NIXL_SUCCESS);
        EXPECT_EQ(peer.ask("wait_notif " + to_hex("proc write")), "notif proc-a");
        uint64_t gap_start = 0;
        for (size_t i = 0; i < ours.size(); ++i) {
            EXPECT_EQ(peer.ask(check_cmd(kOurSeed, ours[i].first, theirs[i].first, ours[i].second)),
                      "ok")
                << "piece " << i;
            EXPECT_EQ(
                peer.ask(check_cmd(kPeerSeed, gap_start, gap_start, theirs[i].first - gap_start)),
                "ok")
                << "gap before piece " << i;
            gap_start = theirs[i].first + theirs[i].second;
        }
        EXPECT_EQ(peer.ask(check_cmd(kPeerSeed, gap_start, gap_start, kSize - gap_start)), "ok");
        EXPECT_EQ(peer.ask("count " + to_hex("proc write")), "count 1");
    }

    // READ the peer's new bytes back, with a notification.
    {
        ASSERT_EQ(peer.ask("fill " + std::to_string(kPeerSeed2)), "ok");
        const auto before = buf->read_all();
        const nixl_opt_args_t args = with_notif("proc read");
        nixlXferReqH* req = nullptr;
        ASSERT_EQ(a->createXferReq(NIXL_READ, xfer_list(*buf, ours), peer_list(peer, theirs),
                                   "proc-b", req, &args),
                  NIXL_SUCCESS);
        ASSERT_EQ(post_and_wait(a, req), NIXL_SUCCESS);
        EXPECT_EQ(a->releaseXferReq(req), NIXL_SUCCESS);
        auto want = before;
        for (size_t i = 0; i < ours.size(); ++i) {
            fill_pattern(want.data() + ours[i].first, ours[i].second, kPeerSeed2, theirs[i].first);
        }
        const auto got = buf->read_all();
        EXPECT_TRUE(got == want) << "first difference at byte "
                                 << (std::mismatch(got.begin(), got.end(), want.begin()).first -
                                     got.begin());
        EXPECT_EQ(peer.ask("wait_notif " + to_hex("proc read")), "notif proc-a");
        EXPECT_TRUE(buf->guards_intact());
    }

    // The peer, once it knows us, notifies us.
    EXPECT_EQ(peer.ask("load " + to_hex(a.metadata())), "ok proc-a");
    const std::string binary("\0\x01\xff reply", 9);
    EXPECT_EQ(peer.ask("notify proc-a " + to_hex(binary)), "ok");
    ASSERT_TRUE(wait_notifs(a, 1));
    pump_for(milliseconds(100), {&a});
    EXPECT_EQ(a.received(), (std::vector<Notif>{{"proc-b", binary}}));

    const int status = peer.quit();
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
}

// --- 8: the peer dies in the middle of a transfer -----------------------------------------------

class PeerKilled : public ::testing::TestWithParam<nixl_xfer_op_t> {};

// The peer is stopped (SIGSTOP) so that a large transfer is certainly in flight, then killed.
// The initiator's transfer must fail with NIXL_ERR_REMOTE_DISCONNECT within a bounded time (a
// dead peer is the peer's problem, not the backend's), the agent then forgets the peer, and the
// initiator goes on working with another agent.
TEST_P(PeerKilled, MidTransferFailsPromptlyAndInitiatorGoesOn) {
    const nixl_xfer_op_t op = GetParam();
    constexpr size_t kSize = 96 << 20;  // far more than socket buffers hold
    const std::string peer_name = std::string("killed-") + (op == NIXL_WRITE ? "w" : "r");
    Peer peer;
    ASSERT_TRUE(peer.start(peer_name, kSize, 1));
    auto buf = Buffer::create(DRAM_SEG, kSize);
    ASSERT_TRUE(buf);
    buf->fill(2);
    TestAgent a("survivor");
    ASSERT_TRUE(a.reg(*buf));
    ASSERT_EQ(a.load(peer.md()), peer_name);
    // Connected (a small transfer done) before the peer stops.
    ASSERT_EQ(a->makeConnection(peer_name), NIXL_SUCCESS);
    nixlXferReqH* warm = nullptr;
    ASSERT_EQ(a->createXferReq(op, xfer_list(*buf, {{0, 4096}}), peer_list(peer, {{0, 4096}}),
                               peer_name, warm),
              NIXL_SUCCESS);
    ASSERT_EQ(post_and_wait(a, warm), NIXL_SUCCESS);
    EXPECT_EQ(a->releaseXferReq(warm), NIXL_SUCCESS);

    peer.send_signal(SIGSTOP);
    nixlXferReqH* req = nullptr;
    ASSERT_EQ(a->createXferReq(op, xfer_list(*buf, {{0, kSize}}), peer_list(peer, {{0, kSize}}),
                               peer_name, req),
              NIXL_SUCCESS);
    ASSERT_EQ(a->postXferReq(req), NIXL_IN_PROG);
    std::this_thread::sleep_for(milliseconds(200));
    ASSERT_EQ(a->getXferStatus(req), NIXL_IN_PROG) << "the stopped peer was expected to stall it";

    peer.kill_now();
    const auto t0 = std::chrono::steady_clock::now();
    const nixl_status_t st = wait_xfer(a, req, {}, std::chrono::seconds(15));
    const auto took =
        std::chrono::duration_cast<milliseconds>(std::chrono::steady_clock::now() - t0);
    EXPECT_EQ(st, NIXL_ERR_REMOTE_DISCONNECT) << nixlEnumStrings::statusStr(st);
    EXPECT_LT(took, std::chrono::seconds(5)) << "the failure took " << took.count() << " ms";
    EXPECT_EQ(a->releaseXferReq(req), NIXL_SUCCESS);
    // A disconnected peer's metadata is dropped by the agent: new requests to it are refused.
    nixlXferReqH* again = nullptr;
    EXPECT_EQ(a->createXferReq(op, xfer_list(*buf, {{0, 4096}}), peer_list(peer, {{0, 4096}}),
                               peer_name, again),
              NIXL_ERR_NOT_FOUND);

    // Another agent, and the initiator works with it as before, both ways.
    auto other_buf = Buffer::create(DRAM_SEG, 4 << 20);
    ASSERT_TRUE(other_buf);
    TestAgent c("bystander");
    ASSERT_TRUE(c.reg(*other_buf));
    ASSERT_EQ(a.load(c), "bystander");
    for (nixl_xfer_op_t op2 : {NIXL_WRITE, NIXL_READ}) {
        buf->fill(op2 == NIXL_WRITE ? 20 : 21);
        other_buf->fill(op2 == NIXL_WRITE ? 22 : 23);
        const nixl_opt_args_t args = with_notif("still here");
        nixlXferReqH* next = nullptr;
        ASSERT_EQ(a->createXferReq(op2, xfer_list(*buf, {{0, 4 << 20}}),
                                   xfer_list(*other_buf, {{0, 4 << 20}}), "bystander", next, &args),
                  NIXL_SUCCESS);
        EXPECT_EQ(post_and_wait(a, next, {&c}), NIXL_SUCCESS);
        EXPECT_EQ(a->releaseXferReq(next), NIXL_SUCCESS);
        std::vector<uint8_t> ours(4 << 20);
        buf->read(0, ours.data(), ours.size());
        EXPECT_TRUE(ours == other_buf->read_all());
    }
    ASSERT_TRUE(wait_notifs(c, 2));
    EXPECT_EQ(c.count({"survivor", "still here"}), 2u);
}

INSTANTIATE_TEST_SUITE_P(Op, PeerKilled, ::testing::Values(NIXL_WRITE, NIXL_READ),
                         [](const ::testing::TestParamInfo<nixl_xfer_op_t>& info) {
                             return info.param == NIXL_WRITE ? "Write" : "Read";
                         });

}  // namespace
}  // namespace tcpx::nixl_test
