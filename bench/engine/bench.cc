// `tcpx-p2p bench engine`: the transfer engine against raw TCP over loopback.
//
// The initiator (this process) owns one endpoint and connects it to `peers` target endpoints,
// which live in the responder: a thread of this process (--procs 1) or a child process
// (--procs 2). Targets need no application action for one-sided transfers; the responder only
// creates the endpoints, registers their memory and hands out the metadata and memory
// descriptors (hex on the line channel), and prepares and checks bytes for --verify.
//
// Two hosts: the target runs with --listen HOST:PORT, the initiator with --connect HOST:PORT
// and every measurement option; the same commands then travel over the harness's TCP side
// channel (side_channel.cc).
//
// With --mem vram every peer has that memory twice on each side: GPU memory (the initiator's on
// one GPU, the targets' on another or the same) for the measured transfers, and host memory for
// the raw TCP baseline and for the same transfers between host memory (the host figures). Both
// are registered with the same endpoints, so the two figures differ only in the memory.
//
// The files of bench/engine/, each with one job (the entry points are bench/engine_bench.h's):
//   bench.cc        the entry points: the options' checks, the GPUs, the roles (this file)
//   side_channel.*  two hosts: --connect's greeting, --listen's target
//   common.{h,cc}   the operations, the counters' line, each side's settings, registered
//                   regions, and the lanes of transfers in flight
//   target.{h,cc}   the targets: their endpoints and memory, and the initiator's commands
//   initiator.*     the initiator's endpoints and memory; transfers in flight, one at a time,
//                   the raw TCP baseline, --verify
//   sweep.{h,cc}    every size and op (or the KV workload) measured, --stats, then the report
//   report.{h,cc}   the rows, header lines, table, JSON and counters
// Timing, windows, latency summaries, cells, roles and memory are the harness's (bench/harness/).
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "bench/engine/common.h"
#include "bench/engine/report.h"
#include "bench/engine/side_channel.h"
#include "bench/engine/sweep.h"
#include "bench/engine/target.h"
#include "bench/engine_bench.h"
#include "bench/harness/memory.h"
#include "bench/harness/roles.h"
#include "common/status_util.h"
#include "common/strings.h"
#include "tcpx/config.h"

namespace tcpx::bench {

// This driver's own pieces (bench/engine/).
using namespace engine_bench;

namespace {

// The initiator's options: the combinations that cannot work, before anything starts.
Status check_options(const EngineBenchOptions& o) {
    if (o.kv) {
        if (o.peers != 1) return invalid_argument("--kv: one peer (--peers 1)");
        if (o.batch != 1) return invalid_argument("--kv: a request is its own batch (no --batch)");
        TCPX_RETURN_IF_ERROR(check_kv_shape(o.kv_shape));
        // The pool is one registered region on each side (the target refuses more).
        if (o.kv_shape.pool > kSideBytes) {
            return invalid_argument("--kv-pool: at most " + format_bytes(kSideBytes) +
                                    " (the memory of one side per memory type)");
        }
    }
    if (o.sizes.empty()) return invalid_argument("no sizes");
    if (o.batch < 1) return invalid_argument("--batch must be at least 1");
    if (o.peers < 1) return invalid_argument("--peers must be at least 1");
    for (uint64_t s : o.sizes) {
        if (s == 0) return invalid_argument("--sizes: a size of 0");
        // The least memory a size takes per side: two slots (one in flight, the last one) of
        // --batch pieces per peer, and per direction. prepare() checks the rest (the transfers in
        // flight, the raw baseline) once the concurrency is known.
        uint64_t slot = 0;
        uint64_t least = 0;
        if (__builtin_mul_overflow(s, static_cast<uint64_t>(o.batch), &slot) ||
            __builtin_mul_overflow(slot, 2 * static_cast<uint64_t>(o.peers) * (o.bidir ? 2 : 1),
                                   &least) ||
            least > kSideBytes) {
            return invalid_argument(
                strformat("--sizes %s%s: more than %s of memory per side", format_bytes(s).c_str(),
                          o.batch > 1 ? strformat(" x --batch %d", o.batch).c_str() : "",
                          format_bytes(kSideBytes).c_str()));
        }
    }
    if (!o.write && !o.read) return invalid_argument("no operation to measure");
    if (o.processes != 1 && o.processes != 2) return invalid_argument("--procs must be 1 or 2");
    if (o.concurrency < 1) return invalid_argument("--concurrency must be at least 1");
    if (!o.listen.empty()) return invalid_argument("--listen: the target runs listen_engine_bench");
    if (!o.connect.empty() && o.processes != 2) {
        return invalid_argument("--connect: the targets are on the other host; no --procs");
    }
    if (o.kv && (o.bidir || o.pairs)) {
        return invalid_argument("--kv: one direction, one peer (no --bidir, --pairs, --gpus all)");
    }
    if (o.per_gpu && o.mem != MemType::kVram) {
        return invalid_argument("--gpus all: one endpoint pair per GPU, with --mem vram");
    }
    if (o.pairs && !o.per_gpu && o.mem == MemType::kVram) {
        return invalid_argument(
            "--pairs: host memory; for GPU memory, --gpus all (a pair per GPU)");
    }
    if (!o.gpus.empty()) {
        if (o.mem != MemType::kVram) return invalid_argument("--gpus applies to --mem vram only");
        if (o.gpus.size() != 2) return invalid_argument("--gpus takes two GPU indices: A,B");
        for (int g : o.gpus) {
            if (g < 0) return invalid_argument("--gpus: a GPU index below 0");
        }
    }
    return Status();
}

// --mem vram: fails unless GPUs can be used, refuses GPUs that do not exist, and picks the
// default pair when --gpus was not given (two GPUs when there are, so that the copies of both
// sides do not share one).
Status choose_gpus(EngineBenchOptions* o) {
    if (o->mem != MemType::kVram) return Status();
    StatusOr<int> n = usable_gpus();
    if (!n.ok()) return Status(n.status()).with_context(o->per_gpu ? "--gpus all" : "--mem vram");
    if (o->per_gpu) {
        o->peers = *n;  // pair i on GPU i of both sides
        return Status();
    }
    if (o->gpus.empty()) o->gpus = *n >= 2 ? std::vector<int>{0, 1} : std::vector<int>{0, 0};
    for (int g : o->gpus) {
        if (g >= *n) {
            return invalid_argument(strformat("--gpus %d,%d: there is no GPU %d (%d usable)",
                                              o->gpus[0], o->gpus[1], g, *n));
        }
    }
    return Status();
}

std::vector<std::string> serve_args(const EngineBenchOptions& o) {
    std::vector<std::string> args = {"bench", "engine", "--serve", "--interface", o.interface};
    auto add = [&](const char* flag, const std::string& v) {
        if (v.empty()) return;
        args.push_back(flag);
        args.push_back(v);
    };
    add("--channels", o.channels);
    add("--nsocks", o.nsocks);
    add("--chunk", o.chunk);
    add("--window", o.window);
    add("--progress-thread", o.progress_thread);
    add("--mem", mem_name(o.mem));
    if (o.gpus.size() == 2) add("--gpus", strformat("%d,%d", o.gpus[0], o.gpus[1]));
    if (o.bidir) args.push_back("--bidir");
    return args;
}

// --listen: the roles that cannot be the target side of two hosts.
Status check_listen_options(const EngineBenchOptions& o) {
    if (!o.connect.empty()) return invalid_argument("--listen and --connect: pick one role");
    if (o.processes != 2) {
        return invalid_argument("--listen: the target side of two hosts; no --procs");
    }
    return Status();
}

// The initiator's run: the options checked, the targets reached (--connect), spawned or started
// on a thread, then the sweep.
Status run(const EngineBenchOptions& options) {
    EngineBenchOptions o = options;
    // --kv: the contiguous transfer of the same bytes is the baseline.
    if (o.kv) o.baseline = false;
    TCPX_RETURN_IF_ERROR(check_options(o));
    TCPX_RETURN_IF_ERROR(choose_gpus(&o));
    // The engine's settings before any target hears of them (with --connect they go in the
    // greeting; the interface may be the side channel's, not known yet).
    TCPX_RETURN_IF_ERROR(bench_config(o, kInitiatorSide).status());
    Setup setup;
    std::unique_ptr<Peer> peer;
    if (!o.connect.empty()) {
        TCPX_ASSIGN_OR_RETURN(peer, connect_targets(&o, &setup.target));
    }
    TCPX_ASSIGN_OR_RETURN(Config config, bench_config(o, kInitiatorSide));
    // The emulated TCPX plugin without a wire (tests/fakes) connects comms inside one process
    // only: with targets in a child every transfer would stall until the timeout.
    const char* no_wire = std::getenv("FAKETCPX_NO_WIRE");
    if (o.processes == 2 && !config.net_plugin.empty() && no_wire != nullptr &&
        std::string(no_wire) == "1") {
        return invalid_argument(
            "FAKETCPX_NO_WIRE=1: the emulated plugin without a wire needs both ends in one "
            "process; use --procs 1");
    }
    if (peer) {
        // connected already (--connect)
    } else if (o.processes == 2) {
        TCPX_ASSIGN_OR_RETURN(peer, ProcessPeer::spawn(serve_args(o)));
    } else {
        TCPX_ASSIGN_OR_RETURN(Config target_config, bench_config(o, kTargetSide));
        peer = std::make_unique<ThreadPeer>([target_config, &o](Channel* ch) {
            (void)serve_targets(target_config, o.interface, o.bidir, ch);
        });
    }
    return run_initiator(o, config, setup, peer.get());
}

}  // namespace

int run_engine_bench(const EngineBenchOptions& options) {
    ::signal(SIGPIPE, SIG_IGN);
    Status st = run(options);
    if (!st.ok()) {
        // (the status may quote the target's words: shown safely)
        std::fprintf(stderr, "tcpx-p2p bench engine: %s\n", printable(st.to_string()).c_str());
        return 1;
    }
    return 0;
}

int serve_engine_bench(const EngineBenchOptions& options) {
    ::signal(SIGPIPE, SIG_IGN);
    FdChannel channel(STDIN_FILENO, STDOUT_FILENO);
    auto config = bench_config(options, kTargetSide);
    if (!config.ok()) {
        // Every command fails with the reason; the initiator reports it.
        refuse_commands(&channel, config.status());
        return 1;
    }
    Status st = serve_targets(*config, options.interface, options.bidir, &channel);
    return st.ok() ? 0 : 1;
}

int listen_engine_bench(const EngineBenchOptions& options) {
    ::signal(SIGPIPE, SIG_IGN);
    Status st = check_listen_options(options);
    if (st.ok()) st = listen_and_serve(options);
    if (!st.ok()) {
        std::fprintf(stderr, "tcpx-p2p bench engine: %s\n", st.to_string().c_str());
        return 1;
    }
    std::fprintf(stderr, "tcpx-p2p bench engine: the initiator is done\n");
    return 0;
}

}  // namespace tcpx::bench
