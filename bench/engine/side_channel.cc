#include "bench/engine/side_channel.h"

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <utility>

#include "bench/engine/common.h"
#include "bench/engine/report.h"
#include "bench/engine/target.h"
#include "bench/harness/measure.h"
#include "bench/harness/memory.h"
#include "common/status_util.h"
#include "common/strings.h"
#include "tcpx/config.h"

namespace tcpx::bench::engine_bench {
namespace {

// Version 2: the raw TCP baseline's connections start with raw-listen's token.
constexpr const char* kHello = "hello tcpx-p2p-bench-engine 2";

std::string hello_line(const EngineBenchOptions& o) {
    return greeting_line(
        kHello, {{"mem", mem_name(o.mem)},
                 {"gpus", o.gpus.size() == 2 ? strformat("%d,%d", o.gpus[0], o.gpus[1]) : ""},
                 {"channels", o.channels},
                 {"nsocks", o.nsocks},
                 {"chunk", o.chunk},
                 {"window", o.window},
                 {"progress", o.progress_thread},
                 {"bidir", o.bidir ? "1" : "0"},
                 {"time", strformat("%g", o.min_seconds)}});
}

// The target's options from a hello line (its own --interface stays), checked as the target's
// engine would check them: a greeting the target could not serve is refused, and the target goes
// on listening for another.
Status parse_hello(const std::string& line, EngineBenchOptions* o) {
    TCPX_ASSIGN_OR_RETURN(auto settings, greeting_settings(line, kHello, "tcpx-p2p bench engine"));
    for (const auto& [key, value] : settings) {
        if (key == "mem") {
            if (!parse_mem(value, &o->mem)) return invalid_argument("hello: bad mem");
        } else if (key == "gpus") {
            if (!parse_gpu_pair(value, &o->gpus)) return invalid_argument("hello: bad gpus");
        } else if (key == "channels") {
            o->channels = value;
        } else if (key == "nsocks") {
            o->nsocks = value;
        } else if (key == "chunk") {
            o->chunk = value;
        } else if (key == "window") {
            o->window = value;
        } else if (key == "progress") {
            o->progress_thread = value;
        } else if (key == "bidir" && (value == "0" || value == "1")) {
            o->bidir = value == "1";
        } else if (key == "time") {
            if (!parse_seconds(value, &o->min_seconds) || !(o->min_seconds > 0) ||
                o->min_seconds > 600) {
                return invalid_argument("hello: bad time");
            }
        } else {
            return invalid_argument("hello: unknown '" + (key + "=" + value).substr(0, 64) + "'");
        }
    }
    // GPU memory this side cannot give (no GPU, no CUDA parts, a GPU it does not have) is
    // refused here, where the target goes on listening, not at the endpoints' creation.
    if (o->mem == MemType::kVram) {
        TCPX_ASSIGN_OR_RETURN(const int gpus, usable_gpus());
        if (o->gpus.size() == 2 && o->gpus[1] >= gpus) {
            return invalid_argument(strformat("hello: gpus %d,%d: this host has %d GPU%s",
                                              o->gpus[0], o->gpus[1], gpus, gpus == 1 ? "" : "s"));
        }
    }
    return bench_config(*o, kTargetSide).status().with_context("hello");
}

// The engine's settings as a line for the other side's header.
std::string engine_summary(const Config& c) {
    if (!c.net_plugin.empty()) {
        return strformat("%lld channel%s, ncclNet plugin %s", static_cast<long long>(c.channels),
                         c.channels == 1 ? "" : "s", c.net_plugin.c_str());
    }
    return strformat(
        "%lld channel%s x %lld data sockets, %s", static_cast<long long>(c.channels),
        c.channels == 1 ? "" : "s", static_cast<long long>(c.nsocks),
        io_threads_phrase(io_threads_per_endpoint(c), c.progress_thread == "on").c_str());
}

}  // namespace

StatusOr<std::unique_ptr<Peer>> connect_targets(EngineBenchOptions* o, std::string* target) {
    TCPX_ASSIGN_OR_RETURN(auto peer, connect_to_target(o->connect, o->connect_timeout,
                                                       reply_timeout_ms(o->min_seconds)));
    if (o->interface.empty()) {
        TCPX_ASSIGN_OR_RETURN(o->interface, side_channel_interface(peer->local(), "--connect"));
    }
    TCPX_ASSIGN_OR_RETURN(std::string said, greet_target(peer.get(), kHello, hello_line(*o),
                                                         "tcpx-p2p bench engine", o->connect));
    *target = o->connect + ": " + said;
    return std::unique_ptr<Peer>(std::move(peer));
}

Status listen_and_serve(const EngineBenchOptions& options) {
    EngineBenchOptions o = options;
    TCPX_ASSIGN_OR_RETURN(Fd listener,
                          listen_side_channel("tcpx-p2p bench engine", options.listen));
    TCPX_ASSIGN_OR_RETURN(SideChannel side, accept_initiator("tcpx-p2p bench engine", listener,
                                                             [&](const std::string& line) {
                                                                 o = options;
                                                                 return parse_hello(line, &o);
                                                             }));
    FdChannel& ch = *side.channel;
    Status st;
    TCPX_RETURN_IF_ERROR(target_interface(side, &o.interface));
    // The greeting's settings passed already (parse_hello): what fails here is the target's own
    // --interface, or the one its end of the side channel is on.
    StatusOr<Config> config = bench_config(o, kTargetSide);
    if (!config.ok()) {
        st = Status(config.status()).with_context("target");
        ch.write_line("error " + st.to_string());
        return st;
    }
    std::fprintf(stderr, "tcpx-p2p bench engine: serving %s on %s\n", side.who.c_str(),
                 o.interface.c_str());
    if (!ch.write_line(std::string(kHello) + " " + o.interface + ", " + engine_summary(*config))) {
        return unavailable("initiator " + side.who + " went away");
    }
    ch.set_timeout(reply_timeout_ms(o.min_seconds));
    return serve_targets(*config, o.interface, o.bidir, &ch).with_context("initiator " + side.who);
}

}  // namespace tcpx::bench::engine_bench
