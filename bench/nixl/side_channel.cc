#include "bench/nixl/side_channel.h"

#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "bench/harness/measure.h"
#include "bench/harness/report.h"
#include "bench/nixl/greeting_params.h"
#include "bench/nixl/target.h"
#include "common/status_util.h"
#include "common/strings.h"

namespace tcpx::bench::nixl_bench {
namespace {

constexpr char kHello[] = "hello tcpx-nixl-bench 1";

// The settings the target's agents need, which the forked child inherits: every --param a target
// takes from a greeting (greeting_params.h; as hex: a value may hold any byte but a newline), the
// rest as words.
std::string hello_line(const Options& o) {
    std::vector<std::pair<std::string, std::string>> settings = {
        {"mem", o.vram ? "vram" : "dram"},
        {"gpus", o.vram ? strformat("%d,%d", o.initiator_gpu, o.target_gpu) : ""},
        {"progress_thread", o.progress_thread ? "on" : "off"},
        {"timeout", strformat("%g", o.stall_seconds)},
        {"time", strformat("%g", o.min_seconds)}};
    for (const auto& [backend, kv] : o.params) {
        if (!greeting_param_allowed(backend, kv.first)) continue;  // (this host's own)
        settings.emplace_back("param", hex_blob(backend + ":" + kv.first + "=" + kv.second));
    }
    return greeting_line(kHello, settings);
}

// A number in (0, max]; false otherwise.
bool parse_seconds(const std::string& v, double max, double* out) {
    char* end = nullptr;
    const double d = std::strtod(v.c_str(), &end);
    if (end == v.c_str() || *end != '\0' || !(d > 0) || d > max) return false;
    *out = d;
    return true;
}

// The target's options from a hello line (its own --interface stays).
Status parse_hello(const std::string& line, Options* o) {
    TCPX_ASSIGN_OR_RETURN(auto settings, greeting_settings(line, kHello, kProgram));
    for (const auto& [key, value] : settings) {
        if (key == "mem" && (value == "dram" || value == "vram")) {
            o->vram = value == "vram";
        } else if (key == "gpus") {
            std::vector<int> g;
            if (!parse_gpu_pair(value, &g)) return invalid_argument("hello: bad gpus");
            o->initiator_gpu = g[0];
            o->target_gpu = g[1];
        } else if (key == "progress_thread" && (value == "on" || value == "off")) {
            o->progress_thread = value == "on";
        } else if (key == "timeout") {
            if (!parse_seconds(value, 3600, &o->stall_seconds)) {
                return invalid_argument("hello: bad timeout");
            }
        } else if (key == "time") {
            if (!parse_seconds(value, 600, &o->min_seconds)) {
                return invalid_argument("hello: bad time");
            }
        } else if (key == "param") {
            std::string p;
            const size_t colon = unhex_blob(value, &p) ? p.find(':') : std::string::npos;
            const size_t eq = colon == std::string::npos ? colon : p.find('=', colon);
            if (colon == 0 || eq == std::string::npos || eq == colon + 1) {
                return invalid_argument("hello: bad param");
            }
            // Only what shapes the transfers: a greeting naming a library for the backend to
            // load, a program to run as its probe, a secret or an interface would hand this host
            // to whoever reaches its port.
            const std::string backend = p.substr(0, colon);
            const std::string setting = p.substr(colon + 1, eq - colon - 1);
            if (!greeting_param_allowed(backend, setting)) {
                return invalid_argument(
                    "hello: param '" + printable((backend + ":" + setting).substr(0, 64)) +
                    "' is the target's own (set it in its environment), not the initiator's");
            }
            o->params.push_back(
                {p.substr(0, colon), {p.substr(colon + 1, eq - colon - 1), p.substr(eq + 1)}});
        } else {
            return invalid_argument("hello: unknown '" + (key + "=" + value).substr(0, 64) + "'");
        }
    }
    return Status();
}

}  // namespace

StatusOr<std::unique_ptr<Peer>> connect_target(Options* o, std::string* target) {
    TCPX_ASSIGN_OR_RETURN(auto peer,
                          connect_to_target(o->connect, o->connect_timeout, side_timeout_ms(*o)));
    if (o->interface.empty()) {
        TCPX_ASSIGN_OR_RETURN(o->interface, side_channel_interface(peer->local(), "--connect"));
    }
    for (const auto& [backend, kv] : o->params) {
        if (!greeting_param_allowed(backend, kv.first)) {
            std::fprintf(stderr,
                         "%s: --param %s:%s applies on this host only (a target takes only "
                         "transfer-shaping settings from the greeting; set the rest in its "
                         "environment)\n",
                         kProgram, backend.c_str(), kv.first.c_str());
        }
    }
    TCPX_ASSIGN_OR_RETURN(std::string said,
                          greet_target(peer.get(), kHello, hello_line(*o), kProgram, o->connect));
    *target = o->connect + ": " + said;
    return std::unique_ptr<Peer>(std::move(peer));
}

Status listen_and_serve(const Options& options, const Machine& machine) {
    TCPX_ASSIGN_OR_RETURN(Fd listener, listen_side_channel(kProgram, options.listen));
    Options o = options;
    TCPX_ASSIGN_OR_RETURN(SideChannel side,
                          accept_initiator(kProgram, listener, [&](const std::string& line) {
                              o = options;
                              return parse_hello(line, &o);
                          }));
    FdChannel& ch = *side.channel;
    TCPX_RETURN_IF_ERROR(target_interface(side, &o.interface));
    std::fprintf(stderr, "%s: serving %s on %s\n", kProgram, side.who.c_str(), o.interface.c_str());
    if (!ch.write_line(std::string(kHello) + " " + o.interface + ", " + describe(machine))) {
        return unavailable("initiator " + side.who + " went away");
    }
    ch.set_timeout(side_timeout_ms(o));
    return serve_target(o, &ch, kMaxSideRegion).with_context("initiator " + side.who);
}

}  // namespace tcpx::bench::nixl_bench
