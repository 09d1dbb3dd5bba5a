// tcpx-nixl-bench: NIXL backends side by side (TCPX and UCX by default), in one run, through
// NIXL's public agent API only (nixlAgent) — what an application using NIXL would see.
//
// Two processes on this host (the default): the program forks before any agent or thread exists;
// the child is the target, the parent the initiator, and a socketpair between them carries the
// line-oriented commands of the harness (bench/harness/roles.h: a ForkPeer; metadata as hex,
// preparing and checking bytes for --verify). For each backend, both processes create an agent
// holding that backend alone (with NIXL's progress thread unless --progress-thread off), register
// one region each and the initiator loads the target's metadata. Then, for every op and size, the
// initiator creates one transfer request per slot (createXferReq, `--batch` descriptors of `size`
// each) and measures
//   - throughput: `--depth` requests in flight, each reposted (postXferReq on the same handle) as
//     soon as it completes, for about `--time` seconds and at least `--iters` rounds of `--depth`;
//   - latency: one request at a time, post to completion, median and p99.
// The target application does nothing but poll getNotifs until the initiator says stop: the
// transfers are one-sided. A backend that cannot be created is reported and skipped.
//
// Two hosts: the target runs with --listen HOST:PORT, the initiator with --connect HOST:PORT
// and every measurement option; the same commands then travel over the harness's TCP side
// channel (side_channel.cc), and the output is the same as on one host.
//
// UCX: unless UCX_TLS is set, the program sets UCX_TLS=tcp before the fork (so both agents see
// it; on two hosts, each side for its own), for a TCP-against-TCP comparison.
//
// The files of bench/nixl/, each with one job:
//   main.cc         the options, the environment, the roles (this file)
//   side_channel.*  two hosts: --connect's greeting, --listen's target
//   common.{h,cc}   the names, operations and options both sides share; depth and region sizes
//   environment.*   NIXL_PLUGIN_DIR and UCX_TLS before any agent exists; the machine
//   agent.{h,cc}    a side's registered region (with --verify's slots) and its NIXL agent
//   target.{h,cc}   the target: its command protocol, polling notifications between commands
//   initiator.*     the initiator's agent and transfer requests: windows, singles, --verify
//   sweep.{h,cc}    every backend, op and size (or the KV workload) measured, then the report
//   report.{h,cc}   the rows, header lines, table and JSON
// Timing, windows, latency summaries, cells, roles and memory are the harness's (bench/harness/).
#include <signal.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "bench/harness/measure.h"
#include "bench/harness/roles.h"
#include "bench/kv_workload.h"
#include "bench/nixl/common.h"
#include "bench/nixl/environment.h"
#include "bench/nixl/side_channel.h"
#include "bench/nixl/sweep.h"
#include "bench/nixl/target.h"
#include "common/params.h"
#include "common/status_util.h"
#include "common/strings.h"

namespace tcpx::bench::nixl_bench {
namespace {

// Splits "A,B" into words; false when empty.
bool split_list(const std::string& text, std::vector<std::string>* out) {
    *out = split_trimmed(text, ',');
    std::erase_if(*out, [](const std::string& s) { return s.empty(); });
    return !out->empty();
}

}  // namespace

int nixl_bench_main(int argc, char** argv) {
    CLI::App app{
        "tcpx-nixl-bench: NIXL backends (TCPX, UCX, ...) side by side through nixlAgent, "
        "initiator and target in two processes on this host, or on two hosts (--listen / "
        "--connect)"};
    Options o;
    std::string backends = "TCPX,UCX";
    std::string ops = "write,read";
    std::string sizes = "4K,64K,1M,16M,64M";
    std::string mem = "dram";
    std::string gpus = "0,0";
    std::string max_memory = "512M";
    std::vector<std::string> params;
    bool no_latency = false;
    bool no_progress = false;
    app.add_option("--backends", backends, "NIXL backends to measure, in this order")
        ->capture_default_str();
    app.add_option("--ops", ops, "Operations: write, read or both")->capture_default_str();
    app.add_option("--sizes", sizes,
                   "Bytes per descriptor: a list (4K,1M) or a range (4K..64M, x4)")
        ->capture_default_str();
    app.add_option("--depth", o.depth,
                   "Requests in flight for throughput (fewer where they would pass --max-memory)")
        ->capture_default_str()
        ->check(CLI::Range(1, 4096));
    app.add_option("--batch", o.batch, "Descriptors per request")
        ->capture_default_str()
        ->check(CLI::Range(1, 65536));
    app.add_option("--max-memory", max_memory,
                   "Registered bytes per side at most (depth x batch x size)")
        ->capture_default_str();
    app.add_option("--time", o.min_seconds, "Seconds per measurement")
        ->capture_default_str()
        ->check(CLI::Range(0.01, 600.0));
    app.add_option("--iters", o.min_iters, "Minimum rounds (of --depth requests) per measurement")
        ->capture_default_str()
        ->check(CLI::Range(1, 1000000));
    app.add_option("--mem", mem, "Memory on both sides")
        ->capture_default_str()
        ->check(CLI::IsMember({"dram", "vram"}));
    app.add_option("--gpus", gpus, "With --mem vram: initiator GPU,target GPU")
        ->capture_default_str();
    auto* interface_opt =
        app.add_option("--interface", o.interface,
                       "The TCPX backend's 'interface' parameter (TCPX_P2P_SOCKET_IFNAME syntax) "
                       "of this host's agent (default: =lo; with --listen / --connect the side "
                       "channel's)")
            ->capture_default_str();
    auto* listen_opt = app.add_option(
        "--listen", o.listen,
        "Be the target side of two hosts: serve the initiator's commands on a TCP side channel "
        "at HOST:PORT (port 0: any; the banner says which); plaintext, unauthenticated");
    auto* connect_opt = app.add_option(
        "--connect", o.connect,
        "Be the initiator side of two hosts: drive the target listening at HOST:PORT");
    app.add_option("--connect-timeout", o.connect_timeout,
                   "Seconds --connect keeps trying while nothing listens there yet")
        ->capture_default_str()
        ->check(CLI::Range(0.1, 3600.0));
    app.add_option("--param", params,
                   "A backend parameter over the plugin's default, BACKEND:key=value (repeatable), "
                   "e.g. TCPX:nsocks=4 or UCX:num_workers=2");
    app.add_flag("--verify,!--no-verify", o.verify,
                 "Check the bytes (and notifications) of the first round of every case")
        ->capture_default_str();
    app.add_flag("--no-latency", no_latency, "Skip the one-at-a-time (latency) measurements");
    app.add_option("--timeout", o.stall_seconds,
                   "Seconds without a completion before a backend counts as stuck")
        ->capture_default_str()
        ->check(CLI::Range(1.0, 3600.0));
    KvCommandLine kv;
    add_kv_options(&app, &kv, &o.kv_shape);
    app.add_flag("--json", o.json, "Print JSON instead of a table");
    app.add_flag("--no-progress", no_progress, "No progress display on stderr");
    std::string progress_thread = "on";
    app.add_option("--progress-thread", progress_thread,
                   "NIXL's progress thread in both agents: on, or off (as nixlbench runs: the "
                   "transfers progress only inside getXferStatus and getNotifs)")
        ->check(CLI::IsMember({"on", "off"}))
        ->capture_default_str();
    CLI11_PARSE(app, argc, argv);
    o.latency = !no_latency;
    o.progress = !no_progress;
    o.progress_thread = progress_thread == "on";

    auto usage = [](const std::string& msg) {
        std::fprintf(stderr, "%s: %s\n", kProgram, msg.c_str());
        return 2;
    };
    // Roles: the combinations that cannot work, before anything starts.
    const bool listen = listen_opt->count() > 0;
    const bool connect = connect_opt->count() > 0;
    if (listen && connect) return usage("--listen and --connect: one host has one role");
    if ((listen || connect) && interface_opt->count() == 0) o.interface.clear();
    if (listen) {
        const Status st = check_initiator_only(
            {"--backends",   "--ops",     "--sizes",      "--depth",   "--batch",
             "--max-memory", "--time",    "--iters",      "--mem",     "--gpus",
             "--param",      "--verify",  "--no-latency", "--timeout", "--kv",
             "--kv-shape",   "--kv-pool", "--kv-blocks",  "--json",    "--progress-thread"},
            [&](const std::string& name) { return app.get_option(name)->count() > 0; });
        if (!st.ok()) return usage(std::string(st.message()));
    }
    if (!split_list(backends, &o.backends)) return usage("--backends: no backend");
    o.kv = kv.kv;
    if (Status st = parse_kv_options(kv, &o.kv_shape); !st.ok()) {
        return usage(std::string(st.message()));
    }
    // As `tcpx-p2p bench engine --kv`: well-formed options that make no KV workload fail (1).
    if (o.kv) {
        Status st = o.batch != 1 ? invalid_argument("--kv: a request is its own batch (no --batch)")
                                 : check_kv_shape(o.kv_shape);
        if (!st.ok()) {
            std::fprintf(stderr, "%s: %s\n", kProgram, std::string(st.message()).c_str());
            return 1;
        }
    }
    std::vector<std::string> op_words;
    if (!split_list(ops, &op_words)) return usage("--ops: no operation");
    o.ops.clear();
    for (const std::string& w : op_words) {
        if (w == "write" || w == "WRITE") {
            o.ops.push_back(Op::kWrite);
        } else if (w == "read" || w == "READ") {
            o.ops.push_back(Op::kRead);
        } else {
            return usage("--ops: '" + w + "' is neither write nor read");
        }
    }
    if (!parse_size_list(sizes, &o.sizes)) {
        return usage("--sizes '" + sizes + "' is not a size list or range");
    }
    for (uint64_t s : o.sizes) {
        if (s == 0) return usage("--sizes: a size of 0");
        // A request is size x batch bytes, and a region up to --depth of them: a product that
        // wraps would register a few bytes and describe far more.
        uint64_t request = 0;
        uint64_t region = 0;
        if (__builtin_mul_overflow(s, static_cast<uint64_t>(o.batch), &request) ||
            __builtin_mul_overflow(request, static_cast<uint64_t>(o.depth), &region)) {
            return usage("--sizes x --batch x --depth overflows 64 bits");
        }
    }
    if (!parse_size(max_memory, &o.max_memory) || o.max_memory == 0) {
        return usage("--max-memory '" + max_memory + "' is not a size");
    }
    o.vram = mem == "vram";
    if (o.vram) {
#ifndef TCPX_P2P_HAVE_CUDA
        return usage("--mem vram: this build has no CUDA (built without TCPX_P2P_HAVE_CUDA)");
#endif
        std::vector<int> g;
        if (!parse_gpu_pair(gpus, &g)) {
            return usage("--gpus: expected two GPU indices, initiator,target (e.g. 0,1)");
        }
        o.initiator_gpu = g[0];
        o.target_gpu = g[1];
    }
    for (const std::string& p : params) {
        const size_t colon = p.find(':');
        const size_t eq = p.find('=', colon == std::string::npos ? 0 : colon);
        if (colon == std::string::npos || colon == 0 || eq == std::string::npos ||
            eq == colon + 1) {
            return usage("--param '" + p + "': expected BACKEND:key=value");
        }
        o.params.push_back(
            {p.substr(0, colon), {p.substr(colon + 1, eq - colon - 1), p.substr(eq + 1)}});
    }

    // Environment for both processes, before any agent exists.
    const Machine machine = prepare_environment(argv, o.json);

    ::signal(SIGPIPE, SIG_IGN);
    if (listen) {
        Status st = listen_and_serve(o, machine);
        if (!st.ok()) {
            std::fprintf(stderr, "%s: %s\n", kProgram, st.to_string().c_str());
            return 1;
        }
        std::fprintf(stderr, "%s: the initiator is done\n", kProgram);
        return 0;
    }
    if (connect) {
        Machine here = machine;
        StatusOr<std::unique_ptr<Peer>> peer = connect_target(&o, &here.target);
        if (!peer.ok()) {
            std::fprintf(stderr, "%s: %s\n", kProgram, peer.status().to_string().c_str());
            return 1;
        }
        return run_initiator(o, std::move(*peer), here);
    }
    // No agent, no thread and no CUDA context exists yet: both sides start clean.
    StatusOr<std::unique_ptr<ForkPeer>> peer = ForkPeer::fork([&o](int fd) {
        FdChannel channel(fd, fd);
        return serve_target(o, &channel).ok() ? 0 : 1;
    });
    if (!peer.ok()) {
        std::fprintf(stderr, "%s: %s\n", kProgram, peer.status().to_string().c_str());
        return 1;
    }
    return run_initiator(o, std::move(*peer), machine);
}

}  // namespace tcpx::bench::nixl_bench

int main(int argc, char** argv) { return tcpx::bench::nixl_bench::nixl_bench_main(argc, argv); }
