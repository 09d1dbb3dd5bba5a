// A child process for multi-process tests: spawned with extra environment, its stdout read
// line by line, killed or waited for.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <map>
#include <string>
#include <vector>

namespace tcpx::testing {

class Subprocess {
 public:
    Subprocess() = default;
    ~Subprocess();  // kills the child if still running
    Subprocess(const Subprocess&) = delete;
    Subprocess& operator=(const Subprocess&) = delete;

    // Starts `argv[0]` with `argv`, the current environment plus `env`; with `merge_stderr` its
    // stderr goes where its stdout goes. False on failure.
    bool start(const std::vector<std::string>& argv, const std::map<std::string, std::string>& env,
               bool merge_stderr = false);
    // The next line of the child's stdout (without the newline); false on EOF or timeout.
    bool read_line(std::string* line, std::chrono::milliseconds timeout);
    // Writes a line to the child's stdin (which stays open until this object goes away).
    bool write_line(const std::string& line);
    void kill_now();
    // SIGSTOP, and waits until every thread of the child has stopped (kill() only queues the
    // signal: a thread already running goes on until the one woken handles it); false when it
    // did not stop within `timeout` or exited.
    bool stop(std::chrono::milliseconds timeout);
    // Waits for exit; returns the exit status as from waitpid, or -1 on timeout.
    int wait(std::chrono::milliseconds timeout);
    pid_t pid() const { return pid_; }

 private:
    pid_t pid_ = -1;
    int out_fd_ = -1;
    int in_fd_ = -1;
    std::string buffer_;
};

}  // namespace tcpx::testing
