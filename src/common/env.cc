#include "common/env.h"

#include <cstdlib>
#include <mutex>

extern char** environ;

namespace tcpx {
namespace {

// Immortal: a plugin's init may run while another thread's exit destroys statics.
std::mutex& env_mutex() {
    static auto* mu = new std::mutex();
    return *mu;
}

}  // namespace

std::unique_lock<std::mutex> lock_env() { return std::unique_lock<std::mutex>(env_mutex()); }

std::optional<std::string> env_get(const char* name) {
    std::lock_guard<std::mutex> lock(env_mutex());
    const char* value = std::getenv(name);
    if (value == nullptr) return std::nullopt;
    return std::string(value);
}

std::vector<std::pair<std::string, std::string>> env_with_prefix(std::string_view prefix) {
    std::vector<std::pair<std::string, std::string>> out;
    std::lock_guard<std::mutex> lock(env_mutex());
    for (char** env = environ; env != nullptr && *env != nullptr; ++env) {
        const std::string_view entry(*env);
        if (entry.substr(0, prefix.size()) != prefix) continue;
        const size_t eq = entry.find('=');
        if (eq == std::string_view::npos) continue;
        out.emplace_back(std::string(entry.substr(0, eq)), std::string(entry.substr(eq + 1)));
    }
    return out;
}

int env_set(const char* name, const char* value, bool overwrite) {
    std::lock_guard<std::mutex> lock(env_mutex());
    return ::setenv(name, value, overwrite ? 1 : 0);
}

int env_unset(const char* name) {
    std::lock_guard<std::mutex> lock(env_mutex());
    return ::unsetenv(name);
}

}  // namespace tcpx
