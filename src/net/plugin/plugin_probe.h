// Trying a net plugin in a child process before trusting it with this one.
//
// Google's TCPX plugin calls exit(1) on many failure paths of init (and may crash or hang on a
// misconfigured machine), which would take the application with it. So the loader first runs a
// small executable, tcpx-p2p-probe (probe_main.cc), that loads the plugin the same way, calls its
// init, devices and getProperties, prints a summary and exits 0. It is started with posix_spawn
// (fork would copy CUDA state and locks held by other threads), inherits the environment, and is
// killed after PLUGIN_PROBE_TIMEOUT_MS. The verdict is kept per plugin path for the process.
#pragma once

#include <cstdint>
#include <string>

#include "common/params.h"
#include "tcpx/status.h"

namespace tcpx::net {

// The probe's exit status when the plugin refused cleanly (not loadable, no table, init or
// devices returned an error): loading it here is safe and reports the same error the usual way.
inline constexpr int kProbeCleanRefusal = 3;
// The probe's last line once its checks are over, whatever their verdict: a plugin that ends
// the probe itself with a status of 0 or 3 (exit() in its init) has not let it be written.
inline constexpr const char* kProbeDoneMarker = "tcpx-p2p-probe: done";

// The probe executable: PLUGIN_PROBE_PATH when set, else tcpx-p2p-probe beside the module holding
// this code (the library, a plugin or the program), then in ../libexec/ and ../../libexec/ from
// there, then on PATH.
StatusOr<std::string> find_plugin_probe(const Settings& settings);

// Runs `probe` on `plugin`, killing it after `timeout_ms`. OK (with what it printed) when it
// exits 0 or with kProbeCleanRefusal; otherwise an error naming the plugin, the exit code or
// signal, and the last lines it printed.
StatusOr<std::string> run_plugin_probe(const std::string& probe, const std::string& plugin,
                                       int64_t timeout_ms);

// find_plugin_probe + run_plugin_probe, once per plugin path and process (later calls return the
// first verdict).
Status probe_plugin(const std::string& plugin, const Settings& settings);

}  // namespace tcpx::net
