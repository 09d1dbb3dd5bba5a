// The process environment, read and written under one lock.
//
// glibc's setenv() may move the environ array and free the old one, so a thread walking it
// (Settings::from_env) or holding a getenv() pointer while another thread sets a variable reads
// freed memory. The library sets variables of its own at run time (defaults of Google's TCPX
// plugin at each load, NCCL_* defaults at each NCCL plugin init), possibly while another thread
// creates an endpoint, so every read and write of ours goes through here and copies what it
// reads. (An application calling setenv() itself while our calls run is its own race, as with
// any library that reads the environment.)
#pragma once

#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace tcpx {

// The value of `name`, copied; nullopt when it is not set.
std::optional<std::string> env_get(const char* name);
// Every variable whose name starts with `prefix`, copied, in the environment's order.
std::vector<std::pair<std::string, std::string>> env_with_prefix(std::string_view prefix);
// setenv / unsetenv, under the lock; 0 on success, -1 with errno as they set it.
int env_set(const char* name, const char* value, bool overwrite);
int env_unset(const char* name);
// The lock itself, for a call that reads environ directly (posix_spawn handing it to a child).
[[nodiscard]] std::unique_lock<std::mutex> lock_env();

}  // namespace tcpx
