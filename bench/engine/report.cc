#include "bench/engine/report.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "bench/harness/report.h"
#include "common/strings.h"

namespace tcpx::bench::engine_bench {

// The GB/s of each direction and peer in a measurement of `iters` transfers of `bytes` per peer,
// from each peer's seconds.
void split_directions(const std::vector<double>& secs, uint64_t bytes, uint64_t iters, double* all,
                      std::vector<double>* per_peer) {
    double longest = 0;
    per_peer->clear();
    for (double v : secs) {
        longest = std::max(longest, v);
        per_peer->push_back(v > 0 ? static_cast<double>(bytes * iters) / v / 1e9 : 0);
    }
    *all = longest > 0 ? static_cast<double>(bytes * iters * secs.size()) / longest / 1e9 : 0;
}

namespace {

// How the roles ran: "1 process", "2 processes", "targets at HOST:PORT".
std::string roles_text(const EngineBenchOptions& o) {
    if (!o.connect.empty()) return "targets on " + o.connect + " (side channel)";
    return o.processes == 1 ? "1 process" : "2 processes";
}

// What "peers" are: target endpoints of one initiator endpoint, or pairs of endpoints.
std::string peers_text(const EngineBenchOptions& o) {
    if (o.per_gpu)
        return strformat("%d GPU pair%s (GPU i to GPU i)", o.peers, o.peers == 1 ? "" : "s");
    if (o.pairs) return strformat("%d endpoint pair%s", o.peers, o.peers == 1 ? "" : "s");
    return strformat("%d peer%s", o.peers, o.peers == 1 ? "" : "s");
}

// With an ncclNet plugin the data sockets are the plugin's, not NSOCKS: Google's plugin opens
// NCCL_NSOCKS_PERTHREAD x NCCL_SOCKET_NTHREADS per comm.
std::string plugin_sockets_text() {
    const char* per_thread = std::getenv("NCCL_NSOCKS_PERTHREAD");
    const char* threads = std::getenv("NCCL_SOCKET_NTHREADS");
    if (per_thread != nullptr && threads != nullptr) {
        return strformat("the plugin's own: NCCL_NSOCKS_PERTHREAD x NCCL_SOCKET_NTHREADS = %s x %s",
                         per_thread, threads);
    }
    return "the plugin's own (NCCL_NSOCKS_PERTHREAD x NCCL_SOCKET_NTHREADS, not set here: the "
           "plugin's defaults)";
}

}  // namespace

// Whether the rows carry the host figures of --mem vram.
bool host_figures(const EngineBenchOptions& o) {
    return o.mem == MemType::kVram && o.host_baseline;
}

std::string io_threads_phrase(int io_threads, bool progress_thread) {
    const char* progress =
        progress_thread ? "" : "; no progress thread: the calls make progress, the target polls";
    if (io_threads > 0) return strformat("%d I/O threads per endpoint%s", io_threads, progress);
    return progress_thread ? std::string("socket I/O by each endpoint's progress thread (caller)")
                           : strformat("socket I/O in the calls (caller)%s", progress);
}

namespace {

// The size column is followed by a mark: `*` where the concurrency was cut.
std::vector<Column<Row>> table_columns(const EngineBenchOptions& o) {
    const bool multi = o.peers > 1 && o.single_peer;
    const bool host = host_figures(o);
    std::vector<Column<Row>> cols;
    cols.push_back({0, -5, "op", [](const Row& r) { return std::string(op_name(r.op)); }});
    cols.push_back({1, 9, "size", [batch = o.batch](const Row& r) {
                        std::string size = format_bytes(r.size);
                        return batch > 1 ? strformat("%dx%s", batch, size.c_str()) : size;
                    }});
    cols.push_back({0, 1, "", [conc = o.concurrency](const Row& r) {
                        return std::string(r.concurrency < conc ? "*" : " ");
                    }});
    cols.push_back({1, 8, "GB/s", [](const Row& r) { return gbps_cell(r.ours); }});
    auto number = [](double v) { return v > 0 ? gbps_text(v) : std::string("-"); };
    if (o.bidir) {
        cols.push_back({1, 7, "i->t", [=](const Row& r) { return number(r.fwd); }});
        cols.push_back({1, 7, "t->i", [=](const Row& r) { return number(r.rev); }});
    }
    if (o.pairs && o.peers > 1) {
        for (int i = 0; i < o.peers; ++i) {
            const auto k = static_cast<size_t>(i);
            cols.push_back({1, 7, "#" + std::to_string(i), [=](const Row& r) {
                                double v = k < r.per_peer.size() ? r.per_peer[k] : 0;
                                if (k < r.per_peer_rev.size()) v += r.per_peer_rev[k];
                                return number(v);
                            }});
        }
    }
    if (host) {
        cols.push_back({1, 8, "host", [](const Row& r) { return gbps_cell(r.host); }});
        cols.push_back(
            {1, 9, "vram/host", [](const Row& r) { return ratio(r.ours.gbps, r.host.gbps); }});
    }
    cols.push_back({1, 8, "raw", [](const Row& r) { return gbps_cell(r.raw); }});
    cols.push_back({1, 8, "ours/raw", [bidir = o.bidir](const Row& r) {
                        return ratio(bidir ? r.fwd : r.ours.gbps, r.raw.gbps);
                    }});
    cols.push_back({2, 8, "CPU s/GB", [](const Row& r) { return cpu_cell(r.ours); }});
    if (host) cols.push_back({1, 8, "host CPU", [](const Row& r) { return cpu_cell(r.host); }});
    cols.push_back({1, 8, "raw CPU", [](const Row& r) { return cpu_cell(r.raw); }});
    cols.push_back({1, 10, "CPU vs TCP",
                    [](const Row& r) { return ratio(cpu_per_gb(r.ours), cpu_per_gb(r.raw)); }});
    if (multi) {
        cols.push_back({2, 8, o.pairs ? "1 pair" : "1 peer",
                        [](const Row& r) { return gbps_cell(r.single); }});
        cols.push_back({1, 7, strformat("%d/1", o.peers),
                        [](const Row& r) { return ratio(r.ours.gbps, r.single.gbps); }});
    }
    auto p50 = [](const Latency& l) { return usecs_cell(l.p50_us, l.iters); };
    auto p99 = [](const Latency& l) { return usecs_cell(l.p99_us, l.iters); };
    cols.push_back({2, 10, "lat p50", [=](const Row& r) { return p50(r.ours_lat); }});
    if (host) {
        cols.push_back({1, 10, "host p50", [=](const Row& r) { return p50(r.host_lat); }});
        cols.push_back({1, 9, "vram/host",
                        [](const Row& r) { return ratio(r.ours_lat.p50_us, r.host_lat.p50_us); }});
    }
    cols.push_back({1, 10, "raw p50", [=](const Row& r) { return p50(r.raw_lat); }});
    cols.push_back({1, 8, "ours/raw",
                    [](const Row& r) { return ratio(r.ours_lat.p50_us, r.raw_lat.p50_us); }});
    cols.push_back({2, 10, "lat p99", [=](const Row& r) { return p99(r.ours_lat); }});
    cols.push_back({1, 10, "raw p99", [=](const Row& r) { return p99(r.raw_lat); }});
    return cols;
}

// The inline limits: every transfer's, a host-memory one's under load, then a lone host-memory
// WRITE's and READ's.
std::string inline_text(const Config& c) {
    const uint64_t busy = std::max(c.xfer_inline_threshold, c.xfer_inline_busy);
    return strformat(
        "inline up to %s (host: %s; alone: WRITE %s, READ %s)",
        format_bytes(c.xfer_inline_threshold).c_str(), format_bytes(busy).c_str(),
        format_bytes(std::max(busy, c.xfer_inline_alone)).c_str(),
        format_bytes(std::max(c.xfer_inline_threshold, c.xfer_inline_alone_read)).c_str());
}

// Whether the progress threads poll after their work before they sleep (PROGRESS_QUIET_SPIN),
// which lone transfers' latency depends on: said where there is a progress thread to do it.
std::string quiet_spin_text(const Config& c) {
    if (c.progress_thread != "on") return "";
    return c.progress_quiet_spin == "on" ? "; progress quiet spin on" : "; progress quiet spin off";
}

// The engine's settings as they ran (Config::effective: automatic values resolved).
void print_engine_line(const Config& c, const Setup& s) {
    if (c.net_plugin.empty()) {
        std::printf(
            "engine: %lld channel%s x %lld data sockets = %d raw streams, chunk %s, window %lld, "
            "%s, %s%s\n",
            static_cast<long long>(c.channels), c.channels == 1 ? "" : "s",
            static_cast<long long>(c.nsocks), s.raw_streams,
            format_bytes(c.xfer_chunk_size).c_str(), static_cast<long long>(c.window),
            inline_text(c).c_str(),
            io_threads_phrase(s.io_threads, c.progress_thread == "on").c_str(),
            quiet_spin_text(c).c_str());
    } else {
        std::printf(
            "engine: %lld channel%s, chunk %s, window %lld, %s%s; net: ncclNet plugin "
            "%s, data sockets and their threads %s\n",
            static_cast<long long>(c.channels), c.channels == 1 ? "" : "s",
            format_bytes(c.xfer_chunk_size).c_str(), static_cast<long long>(c.window),
            inline_text(c).c_str(), quiet_spin_text(c).c_str(), c.net_plugin.c_str(),
            plugin_sockets_text().c_str());
    }
    if (!s.target.empty()) std::printf("target: %s\n", printable(s.target).c_str());
}

}  // namespace

// --stats: both sides' counters, after the table; with --json as one JSON line on stderr, so
// that stdout stays one document.
void print_stats(const EngineBenchOptions& o, const Stats& ours, const Stats& theirs) {
    if (o.json) {
        nlohmann::json j;
        for (size_t i = 0; i < std::size(kStatFields); ++i) {
            j["initiator"][kStatNames[i]] = ours.*kStatFields[i];
            j["target"][kStatNames[i]] = theirs.*kStatFields[i];
        }
        std::fprintf(stderr, "%s\n", json_text(nlohmann::json{{"stats", j}}).c_str());
        return;
    }
    std::printf("\ncounters (Endpoint::stats, all of this run's endpoints):\n");
    std::printf("  %-20s %20s %20s\n", "", "initiator", "target");
    for (size_t i = 0; i < std::size(kStatFields); ++i) {
        std::printf("  %-20s %20llu %20llu\n", kStatNames[i],
                    static_cast<unsigned long long>(ours.*kStatFields[i]),
                    static_cast<unsigned long long>(theirs.*kStatFields[i]));
    }
}

void print_table(const EngineBenchOptions& o, const Config& c, const Setup& s,
                 const std::vector<Row>& rows) {
    const bool multi = o.peers > 1 && o.single_peer;
    std::printf(
        "tcpx-p2p bench engine: transfer engine vs raw TCP, %s, %s, %s x %d transfers in flight, "
        "batch %d%s\n",
        o.interface.c_str(), roles_text(o).c_str(), peers_text(o).c_str(), o.concurrency, o.batch,
        o.bidir ? ", both directions at once" : "");
    if (o.mem == MemType::kVram && o.per_gpu) {
        std::printf(
            "memory: GPU (cudaMalloc), pair i on GPU i of both sides%s\n",
            host_figures(o) ? "; host, vram/host: the same transfers between host memory" : "");
    } else if (o.mem == MemType::kVram) {
        std::printf(
            "memory: GPU (cudaMalloc), the initiator's on GPU %d, the targets' on GPU %d%s\n",
            o.gpus[0], o.gpus[1],
            host_figures(o) ? "; host, vram/host: the same transfers between host memory" : "");
    } else {
        std::printf("memory: host (page-aligned, pageable)\n");
    }
    print_engine_line(c, s);
    std::printf(
        "throughput: GB/s (10^9 B/s) of all %s together%s; raw: %d TCP streams, each "
        "transfer's bytes split evenly, same %sbuffers, one direction\n",
        o.pairs ? "pairs" : "peers", o.bidir ? " and both directions" : "", s.raw_streams,
        o.mem == MemType::kVram ? "host " : "");
    if (o.bidir) {
        std::printf(
            "both directions: i->t the initiator's transfers toward the targets, t->i the "
            "targets' own toward the initiator, at the same time; ours/raw: i->t over raw\n");
    }
    if (o.pairs && o.peers > 1) {
        std::printf("#i: pair i's GB/s%s\n", o.bidir ? " (both directions)" : "");
    }
    std::printf(
        "CPU s/GB: CPU seconds (user + system, every thread) of both sides, initiator and "
        "targets, per GB moved by the throughput run;\n  raw CPU: the raw TCP baseline's; CPU vs "
        "TCP: the engine's over raw TCP's\n");
    if (multi) {
        std::printf("1 peer: the same with one peer; %d/1: all %d peers over one peer\n", o.peers,
                    o.peers);
    }
    std::printf(
        "latency: one transfer from post to completion, nothing else in flight (1 peer); raw: "
        "ping-pong over 1 TCP stream, receives polling,\n"
        "  WRITE vs the data there and %llu B back (data + ack), READ vs %llu B there and the "
        "data back (request + data)\n\n",
        static_cast<unsigned long long>(kSmallMessage),
        static_cast<unsigned long long>(kSmallMessage));
    const std::vector<Column<Row>> cols = table_columns(o);
    std::printf("%s\n", table_head(cols).c_str());
    bool capped = false;
    for (const Row& r : rows) {
        capped = capped || r.concurrency < o.concurrency;
        std::printf("%s\n", table_row(cols, r).c_str());
    }
    if (capped) {
        std::printf("\n* fewer transfers in flight per peer (at most %s in flight in all):",
                    format_bytes(kMaxInFlightBytes).c_str());
        uint64_t last = 0;
        for (const Row& r : rows) {
            if (r.concurrency < o.concurrency && r.size != last) {
                std::printf(" %s: %d", format_bytes(r.size).c_str(), r.concurrency);
                last = r.size;
            }
        }
        std::printf("\n");
    }
    if (o.verify) std::printf("\nverified: the last transfer of every measurement\n");
}

void print_json(const EngineBenchOptions& o, const Config& c, const Setup& s,
                const std::vector<Row>& rows) {
    using nlohmann::json;
    // transfers: in all (per peer times peers).
    auto tp = [](const Throughput& t, int npeers) {
        json j = throughput_json(t, "transfers", t.iters * static_cast<uint64_t>(npeers));
        if (npeers > 1) j["transfers_per_peer"] = t.iters;
        return j;
    };
    auto lat = latency_json;
    json out;
    out["benchmark"] = "engine";
    out["config"] = {
        {"interface", o.interface},
        {"processes", o.processes},
        {"connect", o.connect},
        {"peers", o.peers},
        {"pairs", o.pairs},
        {"per_gpu", o.per_gpu},
        {"bidir", o.bidir},
        {"concurrency", o.concurrency},
        {"batch", o.batch},
        {"net_plugin", c.net_plugin},
        {"channels", c.channels},
        {"nsocks", c.net_plugin.empty() ? json(c.nsocks) : json(plugin_sockets_text())},
        {"raw_streams", s.raw_streams},
        {"xfer_chunk_size", c.xfer_chunk_size},
        {"window", c.window},
        {"xfer_inline_threshold", c.xfer_inline_threshold},
        {"io_threads_per_endpoint", s.io_threads},  // 0: caller mode (no I/O thread)
        {"progress_thread", c.progress_thread},
        {"progress_quiet_spin", c.progress_quiet_spin},
        {"target", s.target},
        {"min_seconds", o.min_seconds},
        {"min_iters", o.min_iters},
        {"verify", o.verify},
        {"mem", mem_name(o.mem)},
        {"host_baseline", host_figures(o)},
        {"latency", "one transfer, post to completion, nothing else in flight, 1 peer"},
        {"raw_latency", strformat("ping-pong on 1 TCP stream: WRITE = data there, %llu B back; "
                                  "READ = %llu B there, data back",
                                  static_cast<unsigned long long>(kSmallMessage),
                                  static_cast<unsigned long long>(kSmallMessage))}};
    if (o.mem == MemType::kVram) {
        out["config"]["gpus"] = {{"initiator", o.gpus[0]}, {"targets", o.gpus[1]}};
    }
    out["results"] = json::array();
    for (const Row& r : rows) {
        const uint64_t bytes = r.size * static_cast<uint64_t>(o.batch);
        json row = {{"op", r.op == Op::kWrite ? "write" : "read"},
                    {"size", r.size},
                    {"batch", o.batch},
                    {"bytes_per_transfer", bytes},
                    {"concurrency", r.concurrency}};
        if (r.ours.iters) row["ours"] = tp(r.ours, o.peers);
        if (r.ours.iters && (o.bidir || o.pairs)) {
            row["initiator_to_targets_gbps"] = r.fwd;
            row["per_peer_gbps"] = r.per_peer;
            if (o.bidir) {
                row["targets_to_initiator_gbps"] = r.rev;
                row["per_peer_targets_to_initiator_gbps"] = r.per_peer_rev;
            }
        }
        if (r.host.iters) {
            row["host"] = tp(r.host, o.peers);
            row["vram_host_ratio"] = r.ours.gbps / r.host.gbps;
        }
        if (r.single.iters) {
            row["single_peer"] = tp(r.single, 1);
            row["peers_ratio"] = r.ours.gbps / r.single.gbps;
        }
        if (r.raw.iters) row["raw"] = tp(r.raw, 1);
        if (r.ours.iters && r.raw.iters) row["throughput_ratio"] = r.ours.gbps / r.raw.gbps;
        if (cpu_per_gb(r.ours) > 0 && cpu_per_gb(r.raw) > 0) {
            row["cpu_vs_tcp"] = cpu_per_gb(r.ours) / cpu_per_gb(r.raw);
        }
        if (r.ours_lat.iters) row["ours_latency"] = lat(r.ours_lat);
        if (r.host_lat.iters) {
            row["host_latency"] = lat(r.host_lat);
            row["latency_p50_vram_host_ratio"] = r.ours_lat.p50_us / r.host_lat.p50_us;
            row["latency_p99_vram_host_ratio"] = r.ours_lat.p99_us / r.host_lat.p99_us;
        }
        if (r.raw_lat.iters) {
            json l = lat(r.raw_lat);
            l["request_bytes"] = r.op == Op::kWrite ? bytes : kSmallMessage;
            l["reply_bytes"] = r.op == Op::kWrite ? kSmallMessage : bytes;
            row["raw_pingpong"] = l;
        }
        if (r.ours_lat.iters && r.raw_lat.iters) {
            row["latency_p50_ratio"] = r.ours_lat.p50_us / r.raw_lat.p50_us;
            row["latency_p99_ratio"] = r.ours_lat.p99_us / r.raw_lat.p99_us;
        }
        out["results"].push_back(row);
    }
    std::printf("%s\n", json_text(out, 2).c_str());
}

// --- the KV workload's report (the rows' layout is bench/kv_workload's) --------------------------

void print_kv_table(const EngineBenchOptions& o, const Config& c, const Setup& s,
                    const std::vector<KvRow>& rows) {
    std::printf("tcpx-p2p bench engine --kv: a paged KV cache, %s, %s, one request at a time\n",
                o.interface.c_str(), roles_text(o).c_str());
    print_kv_shape(o.kv_shape);
    if (o.mem == MemType::kVram) {
        std::printf("memory: GPU (cudaMalloc), the initiator's on GPU %d, the target's on GPU %d\n",
                    o.gpus[0], o.gpus[1]);
    }
    // With an ncclNet plugin the data sockets and their threads are the plugin's (not NSOCKS nor
    // our I/O threads): the line says so, as the sweep's header does.
    if (c.net_plugin.empty()) {
        std::printf("engine: %lld channel%s x %lld data sockets, chunk %s, window %lld, %s\n",
                    static_cast<long long>(c.channels), plural(c.channels),
                    static_cast<long long>(c.nsocks), format_bytes(c.xfer_chunk_size).c_str(),
                    static_cast<long long>(c.window),
                    io_threads_phrase(s.io_threads, c.progress_thread == "on").c_str());
    } else {
        std::printf("engine: %lld channel%s, chunk %s, window %lld\n",
                    static_cast<long long>(c.channels), plural(c.channels),
                    format_bytes(c.xfer_chunk_size).c_str(), static_cast<long long>(c.window));
        std::printf("net: ncclNet plugin %s, data sockets and their threads %s\n",
                    c.net_plugin.c_str(), plugin_sockets_text().c_str());
    }
    if (!s.target.empty()) std::printf("target: %s\n", printable(s.target).c_str());
    print_kv_rows(rows, o.verify);
}

void print_kv_json(const EngineBenchOptions& o, const Config& c, const std::vector<KvRow>& rows) {
    using nlohmann::json;
    json out;
    out["benchmark"] = "engine-kv";
    out["config"] = {
        {"interface", o.interface},
        {"processes", o.processes},
        {"connect", o.connect},
        {"mem", mem_name(o.mem)},
        {"net_plugin", c.net_plugin},
        {"channels", c.channels},
        {"nsocks", c.net_plugin.empty() ? json(c.nsocks) : json(plugin_sockets_text())},
        {"xfer_chunk_size", c.xfer_chunk_size},
        {"window", c.window}};
    out["kv"] = kv_shape_json(o.kv_shape);
    json results = json::array();
    for (const KvRow& r : rows) results.push_back(kv_row_json(r));
    out["results"] = results;
    std::printf("%s\n", json_text(out, 2).c_str());
}

}  // namespace tcpx::bench::engine_bench
