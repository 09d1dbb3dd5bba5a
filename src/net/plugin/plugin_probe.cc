#include "net/plugin/plugin_probe.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "common/env.h"
#include "common/log.h"
#include "common/socket.h"
#include "common/status_util.h"
#include "common/strings.h"

extern char** environ;

namespace tcpx::net {
namespace {

constexpr char kProbeName[] = "tcpx-p2p-probe";
constexpr size_t kMaxCapture = 64 * 1024;  // of the probe's output, the end is kept
constexpr int kTailLines = 10;

bool is_executable(const std::string& path) {
    struct stat st {};
    return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) &&
           ::access(path.c_str(), X_OK) == 0;
}

std::string dir_of(const std::string& path) {
    const size_t slash = path.rfind('/');
    return slash == std::string::npos ? "." : path.substr(0, slash);
}

// The last `n` non-empty lines of `text`, each indented, for an error message.
std::string tail_lines(std::string_view text, int n) {
    std::vector<std::string_view> lines;
    size_t start = 0;
    while (start < text.size()) {
        size_t end = text.find('\n', start);
        if (end == std::string_view::npos) end = text.size();
        std::string_view line = text.substr(start, end - start);
        if (!trim(line).empty()) lines.push_back(line);
        start = end + 1;
    }
    std::string out;
    const size_t first = lines.size() > static_cast<size_t>(n) ? lines.size() - n : 0;
    for (size_t i = first; i < lines.size(); ++i) out += "\n    " + std::string(lines[i]);
    return out.empty() ? " (it printed nothing)" : out;
}

class FileActions {
 public:
    FileActions() { ok_ = ::posix_spawn_file_actions_init(&actions_) == 0; }
    ~FileActions() {
        if (ok_) ::posix_spawn_file_actions_destroy(&actions_);
    }
    FileActions(const FileActions&) = delete;
    FileActions& operator=(const FileActions&) = delete;
    bool ok() const { return ok_; }
    posix_spawn_file_actions_t* get() { return &actions_; }

 private:
    posix_spawn_file_actions_t actions_;
    bool ok_ = false;
};

}  // namespace

StatusOr<std::string> find_plugin_probe(const Settings& settings) {
    if (!settings.plugin_probe_path.empty()) {
        if (!is_executable(settings.plugin_probe_path)) {
            return not_found(
                strformat("plugin probe %s (TCPX_P2P_PLUGIN_PROBE_PATH) is not an "
                          "executable file",
                          settings.plugin_probe_path.c_str()));
        }
        return settings.plugin_probe_path;
    }
    std::vector<std::string> tried;
    Dl_info info{};
    if (::dladdr(reinterpret_cast<const void*>(&find_plugin_probe), &info) != 0 &&
        info.dli_fname != nullptr && info.dli_fname[0] != '\0') {
        // The module holding this code: libtcpx_p2p.so (installed in lib/, the probe in
        // libexec/), a plugin (the NIXL backend in lib/nixl-plugins/) or a program linking the
        // library statically (the CLI in bin/). The build tree has the same shape.
        std::string module = info.dli_fname;
        if (module.find('/') == std::string::npos) {
            // A program started through PATH: dladdr names it as typed.
            char self[4096];
            const ssize_t n = ::readlink("/proc/self/exe", self, sizeof(self) - 1);
            if (n > 0) module.assign(self, static_cast<size_t>(n));
        }
        const std::string dir = dir_of(module);
        for (const std::string& candidate :
             {dir + "/" + kProbeName, dir + "/../libexec/" + kProbeName,
              dir + "/../../libexec/" + kProbeName}) {
            if (is_executable(candidate)) return candidate;
            tried.push_back(candidate);
        }
    }
    if (const auto path = env_get("PATH"); path.has_value()) {
        for (const std::string& dir : split_trimmed(*path, ':')) {
            if (dir.empty()) continue;
            const std::string candidate = dir + "/" + kProbeName;
            if (is_executable(candidate)) return candidate;
        }
        tried.push_back("PATH");
    }
    std::string where;
    for (const auto& t : tried) where += (where.empty() ? "" : ", ") + t;
    return not_found(strformat(
        "the plugin probe %s was not found (looked in %s): set TCPX_P2P_PLUGIN_PROBE_PATH to it, "
        "or TCPX_P2P_PLUGIN_PROBE=off to load plugins without probing them",
        kProbeName, where.empty() ? "nowhere" : where.c_str()));
}

StatusOr<std::string> run_plugin_probe(const std::string& probe, const std::string& plugin,
                                       int64_t timeout_ms) {
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC) != 0) return errno_status(errno, "plugin probe: pipe");
    Fd read_end(fds[0]);
    Fd write_end(fds[1]);
    FileActions actions;
    if (!actions.ok()) return internal_error("plugin probe: posix_spawn_file_actions_init");
    // Both streams into the pipe (dup2 clears close-on-exec on the copies); stdin from
    // /dev/null; nothing else of this process's descriptors (sockets, devices) goes along.
    if (::posix_spawn_file_actions_addopen(actions.get(), 0, "/dev/null", O_RDONLY, 0) != 0 ||
        ::posix_spawn_file_actions_adddup2(actions.get(), write_end.get(), 1) != 0 ||
        ::posix_spawn_file_actions_adddup2(actions.get(), write_end.get(), 2) != 0 ||
        ::posix_spawn_file_actions_addclosefrom_np(actions.get(), 3) != 0) {
        return internal_error("plugin probe: posix_spawn_file_actions");
    }
    std::string probe_arg = probe;
    std::string plugin_arg = plugin;
    char* argv[] = {probe_arg.data(), plugin_arg.data(), nullptr};
    // The child starts with SIGPIPE's default action, whatever this process chose (loading a
    // plugin ignores it here: plugin_loader.cc), as a program expects to.
    posix_spawnattr_t attr;
    if (::posix_spawnattr_init(&attr) != 0) return internal_error("plugin probe: spawn attributes");
    sigset_t sigdefault;
    sigemptyset(&sigdefault);
    sigaddset(&sigdefault, SIGPIPE);
    ::posix_spawnattr_setsigdefault(&attr, &sigdefault);
    ::posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGDEF);
    pid_t pid = -1;
    int rc = 0;
    {
        // (environ handed over under the lock: no variable of ours moves it meanwhile)
        const auto env_lock = lock_env();
        rc = ::posix_spawn(&pid, probe.c_str(), actions.get(), &attr, argv, environ);
    }
    ::posix_spawnattr_destroy(&attr);
    if (rc != 0) {
        return errno_status(rc, "plugin probe: starting " + probe);
    }
    write_end.reset();

    std::string output;
    bool timed_out = false;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
    for (;;) {
        const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                              deadline - std::chrono::steady_clock::now())
                              .count();
        if (left <= 0) {
            timed_out = true;
            break;
        }
        pollfd p{read_end.get(), POLLIN, 0};
        const int n = ::poll(&p, 1, static_cast<int>(std::min<int64_t>(left, 1000)));
        if (n < 0 && errno != EINTR) break;
        if (n <= 0) continue;
        char buf[4096];
        const ssize_t got = ::read(read_end.get(), buf, sizeof(buf));
        if (got < 0 && (errno == EINTR || errno == EAGAIN)) continue;
        if (got <= 0) break;  // EOF: the probe (and whatever it started) closed its output
        output.append(buf, static_cast<size_t>(got));
        if (output.size() > 2 * kMaxCapture) output.erase(0, output.size() - kMaxCapture);
    }
    if (timed_out) ::kill(pid, SIGKILL);
    int wstatus = 0;
    pid_t waited = -1;
    for (;;) {
        waited = ::waitpid(pid, &wstatus, timed_out ? 0 : WNOHANG);
        if (waited < 0 && errno == EINTR) continue;
        if (waited == 0) {
            // The output closed but the probe lives on (it handed its descriptors to a child of
            // its own): wait out the rest of the timeout for it.
            if (std::chrono::steady_clock::now() >= deadline) {
                timed_out = true;
                ::kill(pid, SIGKILL);
                continue;
            }
            ::usleep(10000);
            continue;
        }
        break;
    }
    if (waited < 0) {
        // SIGCHLD ignored by the application reaps children itself: no status to be had.
        return errno_status(errno, "plugin probe: waitpid");
    }
    if (output.size() > kMaxCapture) output.erase(0, output.size() - kMaxCapture);
    // The probe's own last line, or the plugin ended it (exit() in its init, 0 or not).
    const std::string marker = std::string(kProbeDoneMarker) + "\n";
    const size_t at = output.rfind(marker);
    const bool finished = at != std::string::npos;
    if (finished) output.erase(at, marker.size());
    if (!timed_out && finished && WIFEXITED(wstatus) &&
        (WEXITSTATUS(wstatus) == 0 || WEXITSTATUS(wstatus) == kProbeCleanRefusal)) {
        return output;
    }
    std::string how;
    if (timed_out) {
        how = strformat(
            "did not finish within %lld ms (TCPX_P2P_PLUGIN_PROBE_TIMEOUT_MS) and "
            "was killed",
            static_cast<long long>(timeout_ms));
    } else if (WIFEXITED(wstatus) && !finished &&
               (WEXITSTATUS(wstatus) == 0 || WEXITSTATUS(wstatus) == kProbeCleanRefusal)) {
        how = strformat("ended the process (exit code %d) before the probe was done",
                        WEXITSTATUS(wstatus));
    } else if (WIFEXITED(wstatus)) {
        how = strformat("exited with code %d", WEXITSTATUS(wstatus));
    } else if (WIFSIGNALED(wstatus)) {
        how = strformat("was killed by signal %d (%s)", WTERMSIG(wstatus),
                        ::strsignal(WTERMSIG(wstatus)));
    } else {
        how = strformat("ended with wait status 0x%x", wstatus);
    }
    return unavailable(strformat(
        "net plugin %s: its init or device query %s in the probe process "
        "(%s), so it is not loaded into this one. Its last lines:%s",
        plugin.c_str(), how.c_str(), probe.c_str(), tail_lines(output, kTailLines).c_str()));
}

Status probe_plugin(const std::string& plugin, const Settings& settings) {
    static std::mutex mu;
    static auto* verdicts = new std::unordered_map<std::string, Status>;
    std::lock_guard<std::mutex> lock(mu);
    if (auto it = verdicts->find(plugin); it != verdicts->end()) return it->second;
    TCPX_ASSIGN_OR_RETURN(std::string probe, find_plugin_probe(settings));
    auto ran = run_plugin_probe(probe, plugin, settings.plugin_probe_timeout_ms);
    Status verdict = ran.status();
    if (ran.ok()) TCPX_DEBUG("net plugin %s: probe said:\n%s", plugin.c_str(), ran->c_str());
    verdicts->emplace(plugin, verdict);
    return verdict;
}

}  // namespace tcpx::net
