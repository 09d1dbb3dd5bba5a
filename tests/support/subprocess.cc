#include "tests/support/subprocess.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <thread>

extern char** environ;

namespace tcpx::testing {

Subprocess::~Subprocess() {
    if (pid_ > 0) {
        kill_now();
        wait(std::chrono::seconds(10));
    }
    if (out_fd_ >= 0) ::close(out_fd_);
    if (in_fd_ >= 0) ::close(in_fd_);
}

bool Subprocess::start(const std::vector<std::string>& argv,
                       const std::map<std::string, std::string>& env, bool merge_stderr) {
    int fds[2];
    int in[2];
    if (::pipe2(fds, O_CLOEXEC) != 0) return false;
    if (::pipe2(in, O_CLOEXEC) != 0) {
        ::close(fds[0]);
        ::close(fds[1]);
        return false;
    }
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, fds[1], STDOUT_FILENO);
    if (merge_stderr) posix_spawn_file_actions_adddup2(&actions, fds[1], STDERR_FILENO);
    posix_spawn_file_actions_adddup2(&actions, in[0], STDIN_FILENO);

    std::map<std::string, std::string> merged;
    for (char** e = environ; e && *e; ++e) {
        const char* eq = std::strchr(*e, '=');
        if (eq != nullptr) merged[std::string(*e, static_cast<size_t>(eq - *e))] = eq + 1;
    }
    for (const auto& [k, v] : env) merged[k] = v;
    std::vector<std::string> env_strings;
    for (const auto& [k, v] : merged) env_strings.push_back(k + "=" + v);
    std::vector<char*> envp;
    for (auto& s : env_strings) envp.push_back(s.data());
    envp.push_back(nullptr);
    std::vector<std::string> args = argv;
    std::vector<char*> argp;
    for (auto& a : args) argp.push_back(a.data());
    argp.push_back(nullptr);

    // SIGPIPE's default action in the child, whatever the test process has (a loaded plugin
    // ignores it here).
    posix_spawnattr_t attr;
    posix_spawnattr_init(&attr);
    sigset_t sigdefault;
    sigemptyset(&sigdefault);
    sigaddset(&sigdefault, SIGPIPE);
    posix_spawnattr_setsigdefault(&attr, &sigdefault);
    posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGDEF);
    const int rc = ::posix_spawn(&pid_, argp[0], &actions, &attr, argp.data(), envp.data());
    posix_spawnattr_destroy(&attr);
    posix_spawn_file_actions_destroy(&actions);
    ::close(fds[1]);
    ::close(in[0]);
    if (rc != 0) {
        ::close(fds[0]);
        ::close(in[1]);
        pid_ = -1;
        return false;
    }
    out_fd_ = fds[0];
    in_fd_ = in[1];
    return true;
}

bool Subprocess::write_line(const std::string& line) {
    const std::string data = line + "\n";
    size_t off = 0;
    while (off < data.size()) {
        const ssize_t n = ::write(in_fd_, data.data() + off, data.size() - off);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return false;
        off += static_cast<size_t>(n);
    }
    return true;
}

bool Subprocess::read_line(std::string* line, std::chrono::milliseconds timeout) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (true) {
        const size_t nl = buffer_.find('\n');
        if (nl != std::string::npos) {
            *line = buffer_.substr(0, nl);
            buffer_.erase(0, nl + 1);
            return true;
        }
        const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
            deadline - std::chrono::steady_clock::now());
        if (left.count() <= 0) return false;
        pollfd pfd{out_fd_, POLLIN, 0};
        if (::poll(&pfd, 1, static_cast<int>(left.count())) <= 0) continue;
        char buf[4096];
        const ssize_t n = ::read(out_fd_, buf, sizeof(buf));
        if (n <= 0) return false;
        buffer_.append(buf, static_cast<size_t>(n));
    }
}

void Subprocess::kill_now() {
    if (pid_ > 0) ::kill(pid_, SIGKILL);
}

bool Subprocess::stop(std::chrono::milliseconds timeout) {
    if (pid_ <= 0 || ::kill(pid_, SIGSTOP) != 0) return false;
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < deadline) {
        int status = 0;
        // Reported once every thread has stopped (wait() below does not ask for stops).
        const pid_t r = ::waitpid(pid_, &status, WUNTRACED | WNOHANG);
        if (r == pid_) {
            if (WIFSTOPPED(status)) return true;
            pid_ = -1;  // exited instead: reaped here
            return false;
        }
        if (r < 0) return false;
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    return false;
}

int Subprocess::wait(std::chrono::milliseconds timeout) {
    if (pid_ <= 0) return -1;
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (true) {
        int status = 0;
        const pid_t r = ::waitpid(pid_, &status, WNOHANG);
        if (r == pid_) {
            pid_ = -1;
            return status;
        }
        if (std::chrono::steady_clock::now() > deadline) return -1;
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
}

}  // namespace tcpx::testing
