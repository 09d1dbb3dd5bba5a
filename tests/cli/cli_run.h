// Running a built program (the tcpx-p2p tool, tcpx-nixl-bench) as a user runs it, and reading
// what it printed: its exit, the text, and the cells of its tables.
#pragma once

#include <gtest/gtest.h>
#include <sys/wait.h>

#include <chrono>
#include <cstdlib>
#include <initializer_list>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "tests/support/subprocess.h"

namespace tcpx::testing {

struct CliResult {
    int status = -1;     // as from waitpid; -1: it did not exit in time
    std::string output;  // stdout and stderr together
};

// Runs `program` with `args` (and `env` added to the environment) to completion.
inline CliResult run_program(const std::string& program, std::vector<std::string> args,
                             const std::map<std::string, std::string>& env = {}) {
    args.insert(args.begin(), program);
    Subprocess p;
    CliResult r;
    if (!p.start(args, env, /*merge_stderr=*/true)) {
        ADD_FAILURE() << "could not start " << program;
        return r;
    }
    for (std::string line; p.read_line(&line, std::chrono::seconds(120));) r.output += line + "\n";
    r.status = p.wait(std::chrono::seconds(30));
    return r;
}

#ifdef TCPX_P2P_CLI_PATH
// The tcpx-p2p tool of this build.
inline CliResult run_cli(std::vector<std::string> args,
                         const std::map<std::string, std::string>& env = {}) {
    return run_program(TCPX_P2P_CLI_PATH, std::move(args), env);
}
#endif

// Exited by itself with `code` (not killed by a signal).
inline ::testing::AssertionResult exited_with(const CliResult& r, int code) {
    if (r.status == -1) return ::testing::AssertionFailure() << "did not exit\n" << r.output;
    if (!WIFEXITED(r.status)) {
        return ::testing::AssertionFailure() << "killed by signal " << WTERMSIG(r.status) << "\n"
                                             << r.output;
    }
    if (WEXITSTATUS(r.status) != code) {
        return ::testing::AssertionFailure()
               << "exit code " << WEXITSTATUS(r.status) << ", expected " << code << "\n"
               << r.output;
    }
    return ::testing::AssertionSuccess();
}

inline bool contains(const std::string& text, const std::string& part) {
    return text.find(part) != std::string::npos;
}

// Every one of `parts` is in `text`.
inline ::testing::AssertionResult has_all(const std::string& text,
                                          std::initializer_list<const char*> parts) {
    for (const char* part : parts) {
        if (!contains(text, part)) {
            return ::testing::AssertionFailure() << "no '" << part << "' in:\n" << text;
        }
    }
    return ::testing::AssertionSuccess();
}

// The JSON document a run printed: from its line "{" to its line "}" (the rest is stderr's); a
// discarded value when there is none.
inline nlohmann::json json_of(const std::string& output) {
    const std::string text = "\n" + output;
    const size_t begin = text.find("\n{\n");
    const size_t end = text.rfind("\n}\n");
    if (begin == std::string::npos || end == std::string::npos || end < begin) {
        return nlohmann::json(nlohmann::json::value_t::discarded);
    }
    return nlohmann::json::parse(text.substr(begin + 1, end + 2 - (begin + 1)), nullptr,
                                 /*allow_exceptions=*/false);
}

// The lines of `text`.
inline std::vector<std::string> lines_of(const std::string& text) {
    std::vector<std::string> out;
    std::istringstream in(text);
    for (std::string line; std::getline(in, line);) out.push_back(line);
    return out;
}

// The cell of `row` under the right-aligned column `head` of `header` (the word of the row that
// ends where the heading ends); empty when there is none.
inline std::string cell_under(const std::string& header, const std::string& row,
                              const std::string& head) {
    const size_t at = header.find(head);
    if (at == std::string::npos) return "";
    const size_t end = at + head.size();
    if (row.size() < end || (row.size() > end && row[end] != ' ')) return "";
    const size_t begin = row.find_last_of(' ', end - 1);
    return row.substr(begin == std::string::npos ? 0 : begin + 1,
                      end - (begin == std::string::npos ? 0 : begin + 1));
}

// The cell as a number; false when it is not one (a "-" where nothing was measured).
inline bool number(const std::string& cell, double* v) {
    if (cell.empty()) return false;
    char* end = nullptr;
    *v = std::strtod(cell.c_str(), &end);
    return end != cell.c_str() && (*end == '\0' || (*end == 'x' && end[1] == '\0'));
}

// Every row of the table whose header line is the first to start with `header` (the rows that
// follow it up to an empty line) has a positive number under each of `heads`.
inline ::testing::AssertionResult positive_under(const std::string& text, const char* header,
                                                 std::initializer_list<const char*> heads) {
    const std::vector<std::string> lines = lines_of(text);
    size_t h = 0;
    while (h < lines.size() && lines[h].rfind(header, 0) != 0) ++h;
    if (h == lines.size()) return ::testing::AssertionFailure() << "no table in:\n" << text;
    int rows = 0;
    for (size_t i = h + 1; i < lines.size() && !lines[i].empty(); ++i, ++rows) {
        for (const char* col : heads) {
            double v = 0;
            const std::string cell = cell_under(lines[h], lines[i], col);
            if (!number(cell, &v) || !(v > 0)) {
                return ::testing::AssertionFailure()
                       << "'" << col << "' is '" << cell << "' in row '" << lines[i] << "' of:\n"
                       << text;
            }
        }
    }
    if (rows == 0) return ::testing::AssertionFailure() << "a table without rows:\n" << text;
    return ::testing::AssertionSuccess();
}

}  // namespace tcpx::testing
