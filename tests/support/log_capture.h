// Captures this library's log messages for a test's duration.
#pragma once

#include <mutex>
#include <string>
#include <vector>

#include "common/log.h"

namespace tcpx::testing {

class LogCapture {
 public:
    explicit LogCapture(LogLevel level = LogLevel::kInfo) : saved_level_(log_level()) {
        set_log_level(level);
        set_log_sink([this](LogLevel lvl, const char*, int, std::string_view msg) {
            std::lock_guard<std::mutex> lock(mu_);
            lines_.push_back(std::string(log_level_name(lvl)) + " " + std::string(msg));
        });
    }
    ~LogCapture() {
        set_log_sink(nullptr);
        set_log_level(saved_level_);
    }
    // Whether some captured line contains `text`.
    bool contains(const std::string& text) const {
        std::lock_guard<std::mutex> lock(mu_);
        for (const auto& l : lines_) {
            if (l.find(text) != std::string::npos) return true;
        }
        return false;
    }
    // How many captured lines contain `text`.
    int count(const std::string& text) const {
        std::lock_guard<std::mutex> lock(mu_);
        int n = 0;
        for (const auto& l : lines_) n += l.find(text) != std::string::npos ? 1 : 0;
        return n;
    }
    std::string all() const {
        std::lock_guard<std::mutex> lock(mu_);
        std::string out;
        for (const auto& l : lines_) out += l + "\n";
        return out;
    }

 private:
    LogLevel saved_level_;
    mutable std::mutex mu_;
    std::vector<std::string> lines_;
};

}  // namespace tcpx::testing
