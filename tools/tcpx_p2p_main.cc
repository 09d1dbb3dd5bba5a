// tcpx-p2p: the command-line tool (benchmarks, parameters).
#include <CLI/CLI.hpp>
#include <cstdio>
#include <string>
#include <type_traits>
#include <vector>

#include "bench/engine_bench.h"
#include "bench/harness/measure.h"
#include "bench/harness/roles.h"
#include "bench/net_bench.h"
#include "bench/soak_bench.h"
#ifdef TCPX_P2P_HAVE_CUDA
#include "bench/unpack_bench.h"
#endif
#include "common/params.h"
#include "common/strings.h"
#include "tcpx/version.h"
#include "tools/doctor.h"

int main(int argc, char** argv) {
    CLI::App app{"tcpx-p2p: GPU-to-GPU point-to-point transfers over TCP"};
    app.require_subcommand(1);
    app.set_version_flag("--version", std::string("tcpx-p2p ") + tcpx::version_string());

    // params
    auto* params = app.add_subcommand("params", "Print every TCPX_P2P_* parameter");
    bool show_values = false;
    params->add_flag("--values", show_values,
                     "Print the values in effect (defaults overridden by the environment)");

    // doctor
    auto* doctor = app.add_subcommand(
        "doctor",
        "What this machine offers tcpx-p2p and what would stop it: kernel, limits, interfaces, "
        "GPUs, the net plugin (probed in a child process), RxDM, the environment; exit code 1 "
        "when something would stop a run");
    tcpx::tools::DoctorOptions doctor_opts;
    doctor->add_flag("--json", doctor_opts.json, "Print JSON instead of a table");

    // bench net
    auto* bench = app.add_subcommand("bench", "Benchmarks");
    bench->require_subcommand(1);
    auto* bench_net = bench->add_subcommand(
        "net", "Socket transport vs raw TCP over loopback: throughput and round trips per size");
    tcpx::bench::NetBenchOptions net_opts;
    std::string sizes = "4K..64M";
    bool serve = false;
    bool no_baseline = false;
    bool no_latency = false;
    bool no_progress = false;
    bench_net
        ->add_option("--sizes", sizes, "Message sizes: a list (4K,1M) or a range (4K..64M, x4)")
        ->capture_default_str();
    bench_net->add_option("--nsocks", net_opts.nsocks, "Data sockets per comm = raw TCP streams")
        ->capture_default_str()
        ->check(CLI::Range(1, 64));
    bench_net->add_option("--io-threads", net_opts.io_threads, "I/O threads (0: default)")
        ->capture_default_str()
        ->check(CLI::Range(0, 256));
    bench_net->add_option("--window", net_opts.window, "Messages in flight when streaming")
        ->capture_default_str()
        ->check(CLI::Range(1, 32));
    bench_net->add_option("--time", net_opts.min_seconds, "Seconds per measurement")
        ->capture_default_str()
        ->check(CLI::Range(0.01, 600.0));
    bench_net->add_option("--iters", net_opts.min_iters, "Minimum iterations per measurement")
        ->capture_default_str()
        ->check(CLI::Range(1, 1000000));
    bench_net->add_option("--procs", net_opts.processes, "1: one process; 2: receiver in a child")
        ->capture_default_str()
        ->check(CLI::IsMember({1, 2}));
    bench_net
        ->add_option("--interface", net_opts.interface,
                     "Interface (TCPX_P2P_SOCKET_IFNAME syntax); both ends are on this host")
        ->capture_default_str();
    bench_net->add_flag("--no-baseline", no_baseline, "Skip the raw TCP baseline");
    bench_net->add_flag("--no-latency", no_latency, "Skip the round-trip measurements");
    bench_net->add_flag("--json", net_opts.json, "Print JSON instead of a table");
    bench_net->add_flag("--no-progress", no_progress, "No progress display on stderr");
    bench_net->add_flag("--serve", serve, "(internal) the responder of --procs 2")->group("");

    // bench engine
    auto* bench_engine = bench->add_subcommand(
        "engine",
        "Transfer engine (WRITE/READ) vs raw TCP: throughput and latency per size, on this host "
        "or two (--listen / --connect)");
    tcpx::bench::EngineBenchOptions eng_opts;
    std::string eng_sizes = "4K..64M";
    std::string eng_op = "both";
    std::string eng_mem = "host";
    std::string eng_gpus;
    bool eng_serve = false;
    bool eng_no_baseline = false;
    bool eng_no_host_baseline = false;
    bool eng_no_latency = false;
    bool eng_no_single_peer = false;
    bool eng_no_progress = false;
    bench_engine
        ->add_option("--sizes", eng_sizes,
                     "Transfer sizes (per piece with --batch): a list (4K,1M) or a range (4K..64M, "
                     "x4)")
        ->capture_default_str();
    bench_engine->add_option("--op", eng_op, "Operations to measure")
        ->capture_default_str()
        ->check(CLI::IsMember({"write", "read", "both"}));
    bench_engine
        ->add_option("--batch", eng_opts.batch,
                     "Pieces per transfer (writev/readv of N pieces of the size when > 1)")
        ->capture_default_str()
        ->check(CLI::Range(1, 65536));
    bench_engine
        ->add_option("--concurrency", eng_opts.concurrency,
                     "Transfers in flight per peer (at most 512 MiB in flight in all)")
        ->capture_default_str()
        ->check(CLI::Range(1, 4096));
    bench_engine
        ->add_option("--peers", eng_opts.peers,
                     "Target endpoints the initiator connects to (all in the second process with "
                     "--procs 2)")
        ->capture_default_str()
        ->check(CLI::Range(1, 256));
    auto* eng_procs_opt =
        bench_engine
            ->add_option("--procs", eng_opts.processes, "1: one process; 2: the targets in a child")
            ->capture_default_str()
            ->check(CLI::IsMember({1, 2}));
    auto* eng_pairs_opt = bench_engine->add_option(
        "--pairs", eng_opts.peers,
        "Endpoint pairs busy at once, each initiator endpoint with its own target (host memory; "
        "for GPU memory --gpus all)");
    eng_pairs_opt->check(CLI::Range(1, 256));
    bench_engine->add_flag("--bidir", eng_opts.bidir,
                           "Both directions at once: the targets post the same transfers toward "
                           "the initiator; each direction's GB/s and the sum");
    auto* eng_listen_opt = bench_engine->add_option(
        "--listen", eng_opts.listen,
        "Be the target side of two hosts: serve the initiator's commands on a TCP side channel "
        "at HOST:PORT (port 0: any; the banner says which); plaintext, unauthenticated");
    auto* eng_connect_opt = bench_engine->add_option(
        "--connect", eng_opts.connect,
        "Be the initiator side of two hosts: drive the target listening at HOST:PORT");
    bench_engine
        ->add_option("--connect-timeout", eng_opts.connect_timeout,
                     "Seconds --connect keeps trying while nothing listens there yet")
        ->capture_default_str()
        ->check(CLI::Range(0.1, 3600.0));
    bench_engine
        ->add_option("--mem", eng_mem,
                     "Memory of every registered region: host, or vram (GPU memory from "
                     "cudaMalloc; needs a GPU and a build with the CUDA parts)")
        ->capture_default_str()
        ->check(CLI::IsMember({"host", "vram"}));
    auto* eng_gpus_opt = bench_engine->add_option(
        "--gpus", eng_gpus,
        "With --mem vram: the initiator's GPU and the targets' GPU, A,B (default: 0,1 on a "
        "machine with two GPUs or more, else 0,0); or all: one endpoint pair per GPU, GPU i to "
        "GPU i, all busy at once");
    bench_engine->add_option(
        "--channels", eng_opts.channels,
        "Data channels per peer and direction (default: TCPX_P2P_CHANNELS, else automatic: 2 "
        "with 16 usable cores or more, else 1)");
    bench_engine->add_option(
        "--nsocks", eng_opts.nsocks,
        "Data sockets per channel (default: TCPX_P2P_NSOCKS, else automatic: half the usable "
        "cores, 2 to 8); raw TCP streams = channels x nsocks");
    bench_engine->add_option(
        "--chunk", eng_opts.chunk,
        "Transfer chunk size, XFER_CHUNK_SIZE (default: TCPX_P2P_XFER_CHUNK_SIZE or 4M)");
    bench_engine->add_option(
        "--window", eng_opts.window,
        "Transport requests in flight per channel (default: TCPX_P2P_WINDOW or 16)");
    bench_engine
        ->add_option("--progress-thread", eng_opts.progress_thread,
                     "PROGRESS_THREAD of every endpoint, on or off (off: the calls make progress "
                     "and the target side polls get_notifications(), as NIXL agents without a "
                     "progress thread do; default: TCPX_P2P_PROGRESS_THREAD or on)")
        ->check(CLI::IsMember({"on", "off"}));
    auto* eng_interface_opt =
        bench_engine
            ->add_option("--interface", eng_opts.interface,
                         "Interface (TCPX_P2P_SOCKET_IFNAME syntax) of this host's endpoints "
                         "(default: =lo; with --listen / --connect the side channel's)")
            ->capture_default_str();
    bench_engine->add_option("--time", eng_opts.min_seconds, "Seconds per measurement")
        ->capture_default_str()
        ->check(CLI::Range(0.01, 600.0));
    bench_engine->add_option("--iters", eng_opts.min_iters, "Minimum iterations per measurement")
        ->capture_default_str()
        ->check(CLI::Range(1, 1000000));
    tcpx::bench::KvCommandLine eng_kv;
    tcpx::bench::add_kv_options(bench_engine, &eng_kv, &eng_opts.kv_shape);
    bench_engine->add_flag("--verify", eng_opts.verify,
                           "Check the bytes of every measurement's last transfer");
    bench_engine->add_flag("--no-baseline", eng_no_baseline, "Skip the raw TCP baseline");
    bench_engine->add_flag("--no-host-baseline", eng_no_host_baseline,
                           "With --mem vram: skip the same transfers between host memory");
    bench_engine->add_flag("--no-latency", eng_no_latency,
                           "Skip the one-at-a-time (latency) measurements");
    bench_engine->add_flag("--no-single-peer", eng_no_single_peer,
                           "With --peers > 1, skip the single-peer throughput");
    bench_engine->add_flag("--json", eng_opts.json, "Print JSON instead of a table");
    bench_engine->add_flag("--stats", eng_opts.stats,
                           "Also print the endpoints' counters (bytes, transfers, errors, retries, "
                           "time on a full window), initiator and target side");
    bench_engine->add_flag("--no-progress", eng_no_progress, "No progress display on stderr");
    bench_engine->add_flag("--serve", eng_serve, "(internal) the targets of --procs 2")->group("");

    // bench soak
    auto* bench_soak = bench->add_subcommand(
        "soak", "Many peers with many writes in flight for a long time: errors, fds, memory");
    tcpx::bench::SoakOptions soak_opts;
    std::string soak_size = "64K";
    bench_soak->add_option("--peers", soak_opts.peers, "Initiator endpoints")
        ->capture_default_str()
        ->check(CLI::Range(1, 4096));
    bench_soak->add_option("--inflight", soak_opts.inflight, "Writes in flight per peer")
        ->capture_default_str()
        ->check(CLI::Range(1, 1024));
    bench_soak->add_option("--size", soak_size, "Bytes per write")->capture_default_str();
    bench_soak->add_option("--seconds", soak_opts.seconds, "How long")
        ->capture_default_str()
        ->check(CLI::Range(1.0, 86400.0));
    bench_soak->add_option("--report", soak_opts.report_seconds, "Seconds between reports")
        ->capture_default_str()
        ->check(CLI::Range(1, 3600));
    bench_soak->add_option("--threads", soak_opts.threads, "Posting and polling threads")
        ->capture_default_str()
        ->check(CLI::Range(1, 256));

#ifdef TCPX_P2P_HAVE_CUDA
    // bench unpack (built with the CUDA parts)
    auto* bench_unpack = bench->add_subcommand(
        "unpack",
        "The devmem-TCP unpack kernel vs cudaMemcpy device-to-device, and small copies of pageable "
        "memory through a pinned buffer vs without, on this GPU");
    tcpx::bench::UnpackBenchOptions unpack_opts;
    bench_unpack->add_option("--iters", unpack_opts.iters, "Launches per figure")
        ->capture_default_str()
        ->check(CLI::Range(1, 100000));
    bench_unpack->add_flag("--json", unpack_opts.json, "Print JSON instead of a table");
#endif

    CLI11_PARSE(app, argc, argv);

#ifdef TCPX_P2P_HAVE_CUDA
    if (bench_unpack->parsed()) return tcpx::bench::run_unpack_bench(unpack_opts);
#endif

    if (doctor->parsed()) return tcpx::tools::run_doctor(doctor_opts);
    if (params->parsed()) {
        if (!show_values) {
            std::fputs(tcpx::param_table_markdown().c_str(), stdout);
            return 0;
        }
        auto settings = tcpx::Settings::from_env();
        if (!settings.ok()) {
            std::fprintf(stderr, "tcpx-p2p: %s\n", settings.status().to_string().c_str());
            return 1;
        }
        // One line per parameter, in table order, with the value in effect.
        auto text = [](const auto& v) {
            if constexpr (std::is_same_v<std::decay_t<decltype(v)>, std::string>) {
                return v.empty() ? std::string("(empty)") : v;
            } else {
                return std::to_string(v);
            }
        };
        // Secrets are never printed, only whether they are set.
        auto shown = [&](std::string_view name, const std::string& value) {
            if (name.find("SECRET") == std::string_view::npos || value.empty()) return value;
            return std::string("(set)");
        };
#define SHOW(field, NAME) \
    std::printf("TCPX_P2P_%-22s %s\n", #NAME, text(shown(#NAME, text(settings->field))).c_str());
#define TCPX_PARAM_INT(field, NAME, def, lo, hi, doc) SHOW(field, NAME)
#define TCPX_PARAM_SIZE(field, NAME, def, lo, hi, doc) SHOW(field, NAME)
#define TCPX_PARAM_CHOICE(field, NAME, def, choices, doc) SHOW(field, NAME)
#define TCPX_PARAM_STRING(field, NAME, def, doc) SHOW(field, NAME)
#include "tcpx/config_params.inc"
#undef TCPX_PARAM_INT
#undef TCPX_PARAM_SIZE
#undef TCPX_PARAM_CHOICE
#undef TCPX_PARAM_STRING
#undef SHOW
        return 0;
    }
    if (bench_net->parsed()) {
        if (!tcpx::bench::parse_size_list(sizes, &net_opts.sizes)) {
            std::fprintf(stderr, "tcpx-p2p bench net: --sizes '%s' is not a size list or range\n",
                         sizes.c_str());
            return 2;
        }
        net_opts.baseline = !no_baseline;
        net_opts.latency = !no_latency;
        net_opts.progress = !no_progress;
        if (serve) return tcpx::bench::serve_net_bench(net_opts);
        return tcpx::bench::run_net_bench(net_opts);
    }
    if (bench_soak->parsed()) {
        if (!tcpx::parse_size(soak_size, &soak_opts.size) || soak_opts.size == 0) {
            std::fprintf(stderr, "tcpx-p2p bench soak: --size '%s' is not a size\n",
                         soak_size.c_str());
            return 2;
        }
        return tcpx::bench::run_soak_bench(soak_opts);
    }
    if (bench_engine->parsed()) {
        eng_opts.mem =
            eng_mem == "vram" ? tcpx::bench::MemType::kVram : tcpx::bench::MemType::kHost;
        // Roles: the combinations that cannot work, before anything starts.
        auto usage = [](const char* why) {
            std::fprintf(stderr, "tcpx-p2p bench engine: %s\n", why);
            return 2;
        };
        const bool listen = eng_listen_opt->count() > 0;
        const bool connect = eng_connect_opt->count() > 0;
        if (listen && connect) return usage("--listen and --connect: one host has one role");
        if (eng_serve && (listen || connect)) {
            return usage("--serve is the child of --procs 2; not with --listen or --connect");
        }
        if ((listen || connect) && eng_procs_opt->count() > 0) {
            return usage(
                "--procs: the roles are on two hosts with --listen / --connect (no --procs)");
        }
        if (eng_pairs_opt->count() > 0) {
            if (eng_opts.peers > 1 && bench_engine->get_option("--peers")->count() > 0) {
                return usage("--pairs and --peers: pick one");
            }
            eng_opts.pairs = true;
        }
        if ((listen || connect) && eng_interface_opt->count() == 0) eng_opts.interface.clear();
        if (listen) {
            // What the initiator chooses (the greeting carries what the target needs of it).
            const std::vector<std::string> initiator_only = tcpx::bench::words(
                "--pairs --bidir --peers --gpus --sizes --op --json --verify --mem --batch "
                "--concurrency --kv --kv-shape --kv-pool --kv-blocks --time --iters --stats "
                "--no-baseline --no-host-baseline --no-latency --no-single-peer --connect-timeout");
            const tcpx::Status st =
                tcpx::bench::check_initiator_only(initiator_only, [&](const std::string& name) {
                    return bench_engine->get_option(name)->count() > 0;
                });
            if (!st.ok()) return usage(std::string(st.message()).c_str());
            return tcpx::bench::listen_engine_bench(eng_opts);
        }
        if (eng_gpus_opt->count() > 0 && eng_gpus == "all") {
            if (eng_pairs_opt->count() > 0 || bench_engine->get_option("--peers")->count() > 0) {
                return usage("--gpus all: one pair per GPU (no --pairs or --peers)");
            }
            eng_opts.per_gpu = true;
            eng_opts.pairs = true;
        } else if (eng_gpus_opt->count() > 0 &&
                   !tcpx::bench::parse_gpu_pair(eng_gpus, &eng_opts.gpus)) {
            std::fprintf(stderr,
                         "tcpx-p2p bench engine: --gpus '%s' is not two GPU indices A,B (e.g. "
                         "0,1) nor all\n",
                         eng_gpus.c_str());
            return 2;
        }
        if (eng_serve) return tcpx::bench::serve_engine_bench(eng_opts);
        if (!tcpx::bench::parse_size_list(eng_sizes, &eng_opts.sizes)) {
            std::fprintf(stderr,
                         "tcpx-p2p bench engine: --sizes '%s' is not a size list or range\n",
                         eng_sizes.c_str());
            return 2;
        }
        eng_opts.kv = eng_kv.kv;
        if (auto st = tcpx::bench::parse_kv_options(eng_kv, &eng_opts.kv_shape); !st.ok()) {
            std::fprintf(stderr, "tcpx-p2p bench engine: %s\n", std::string(st.message()).c_str());
            return 2;
        }
        eng_opts.write = eng_op != "read";
        eng_opts.read = eng_op != "write";
        eng_opts.baseline = !eng_no_baseline;
        eng_opts.host_baseline = !eng_no_host_baseline;
        eng_opts.latency = !eng_no_latency;
        eng_opts.single_peer = !eng_no_single_peer;
        eng_opts.progress = !eng_no_progress;
        return tcpx::bench::run_engine_bench(eng_opts);
    }
    return 0;
}
