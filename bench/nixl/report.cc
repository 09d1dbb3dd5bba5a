#include "bench/nixl/report.h"

#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "bench/harness/report.h"
#include "common/strings.h"

namespace tcpx::bench::nixl_bench {
namespace {

// The ratio column's pair: TCPX against UCX.
const Row* find_row(const std::vector<Row>& rows, const std::string& backend, const Row& like) {
    for (const Row& r : rows) {
        if (r.backend == backend && r.op == like.op && r.size == like.size && r.error.empty()) {
            return &r;
        }
    }
    return nullptr;
}

std::string sorted_params(const nixl_b_params_t& params) {
    std::map<std::string, std::string> sorted(params.begin(), params.end());
    std::string out;
    for (const auto& [k, v] : sorted) {
        out += (out.empty() ? "" : ", ") + k + "=" + (v.empty() ? "\"\"" : v);
    }
    return out.empty() ? "(none)" : out;
}

std::string usecs(double v) {
    return v >= 10000 ? strformat("%.2f ms", v / 1000) : strformat("%.1f us", v);
}

// The machine, the environment and every backend's parameters.
void print_header(const Options& o, const Machine& m, const std::vector<BackendInfo>& backends) {
    const std::string where = o.connect.empty()
                                  ? "2 processes on this host"
                                  : "initiator here, target on " + o.connect + " (side channel)";
    std::printf("%s: NIXL backends through nixlAgent, %s, %s%s\n", kProgram, where.c_str(),
                mem_name(o), o.kv ? ", a paged KV cache (--kv), one request at a time" : "");
    std::printf("machine: %ld cores, %s, %s\n", m.cores, m.cpu.empty() ? "?" : m.cpu.c_str(),
                m.kernel.c_str());
    std::printf("UCX_TLS=%s%s", m.ucx_tls.c_str(),
                m.ucx_tls_set_here ? " (set by this program)" : " (from the environment)");
    if (!m.ucx_net_devices.empty()) std::printf(", UCX_NET_DEVICES=%s", m.ucx_net_devices.c_str());
    std::printf("\nNIXL_PLUGIN_DIR=%s\n", m.plugin_dir.empty() ? "(unset)" : m.plugin_dir.c_str());
    // (The target's words, and errors that may quote them, come from the network: printable.)
    if (!m.target.empty()) std::printf("target: %s\n", printable(m.target).c_str());
    std::printf("NIXL progress threads: %s\n",
                o.progress_thread ? "on (both agents)"
                                  : "off (data moves inside the applications' calls; the target "
                                    "polls getNotifs without pause)");
    for (const BackendInfo& b : backends) {
        if (b.params.empty() && !b.error.empty()) {
            std::printf("%s: SKIPPED: %s\n", b.name.c_str(), printable(b.error).c_str());
            continue;
        }
        std::printf("%s params: %s\n", b.name.c_str(), sorted_params(b.params).c_str());
        if (!b.error.empty()) {
            std::printf("%s: FAILED: %s\n", b.name.c_str(), printable(b.error).c_str());
        }
    }
}

}  // namespace

std::string size_label(const Options& o, uint64_t size) {
    std::string s = format_bytes(size);
    return o.batch > 1 ? strformat("%dx%s", o.batch, s.c_str()) : s;
}

void print_table(const Options& o, const Machine& m, const std::vector<BackendInfo>& backends,
                 const std::vector<Row>& rows) {
    print_header(o, m, backends);
    const std::string gpus =
        o.vram ? strformat(", GPU %d -> GPU %d", o.initiator_gpu, o.target_gpu) : "";
    std::printf(
        "throughput: GB/s (10^9 B/s), `depth` requests of %d descriptor%s in flight, reposted as "
        "they complete\nlatency: one request at a time, post to completion%s\n"
        "CPU s/GB: CPU seconds (user + system, every thread) of both processes, initiator and "
        "target, per GB moved by the throughput run\n\n",
        o.batch, o.batch == 1 ? "" : "s", gpus.c_str());
    // A row and the UCX row of its case (for the ratios), when there is one.
    using Pair = std::pair<const Row*, const Row*>;
    auto tcpx_ucx = [&o](const Pair& p, bool latency) {
        if (p.first->backend != "TCPX" || p.second == nullptr) return std::string();
        if (!latency) return ratio(p.first->tp.gbps, p.second->tp.gbps);
        return o.latency ? ratio(p.first->lat.p50_us, p.second->lat.p50_us) : std::string();
    };
    const std::vector<Column<Pair>> cols = {
        {0, -7, "backend", [](const Pair& p) { return p.first->backend; }},
        {1, -5, "op", [](const Pair& p) { return std::string(op_name(p.first->op)); }},
        {1, -4, "mem", [&o](const Pair&) { return std::string(mem_name(o)); }},
        {1, 10, "size", [&o](const Pair& p) { return size_label(o, p.first->size); }},
        {1, 5, "depth", [](const Pair& p) { return std::to_string(p.first->depth); }},
        {1, 8, "GB/s", [](const Pair& p) { return strformat("%.2f", p.first->tp.gbps); }},
        {1, 9, "CPU s/GB", [](const Pair& p) { return cpu_cell(p.first->tp); }},
        {1, 10, "lat p50",
         [&o](const Pair& p) { return o.latency ? usecs(p.first->lat.p50_us) : "-"; }},
        {1, 10, "lat p99",
         [&o](const Pair& p) { return o.latency ? usecs(p.first->lat.p99_us) : "-"; }},
        {2, 13, "TCPX/UCX GB/s", [=](const Pair& p) { return tcpx_ucx(p, false); }},
        {1, 13, "TCPX/UCX p50", [=](const Pair& p) { return tcpx_ucx(p, true); }},
    };
    // The cells that name the case, before FAILED on a row that failed.
    const std::vector<Column<Pair>> case_cols(cols.begin(), cols.begin() + 4);
    std::printf("%s\n", table_head(cols).c_str());
    // Grouped by case, the backends of one case next to each other.
    for (Op op : o.ops) {
        for (uint64_t size : o.sizes) {
            for (const std::string& backend : o.backends) {
                for (const Row& r : rows) {
                    if (r.op != op || r.size != size || r.backend != backend) continue;
                    const Pair p{&r, find_row(rows, "UCX", r)};
                    if (!r.error.empty()) {
                        std::printf("%s  FAILED: %s\n", table_row(case_cols, p).c_str(),
                                    printable(r.error).c_str());
                        continue;
                    }
                    std::printf("%s\n", table_row(cols, p).c_str());
                }
            }
        }
    }
    if (o.verify) {
        std::printf(
            "\nverified: the first round of every case (every slot once, with a notification)\n");
    }
}

// --kv: the rows' layout is bench/kv_workload's, as in `tcpx-p2p bench engine --kv`.
void print_kv_table(const Options& o, const Machine& m, const std::vector<BackendInfo>& backends,
                    const std::vector<KvRow>& rows) {
    print_header(o, m, backends);
    print_kv_shape(o.kv_shape);
    std::printf(
        "KV: one NIXL request per KV request, its pieces the descriptors; contiguous: one "
        "request of one descriptor%s\n",
        o.vram ? strformat(", GPU %d -> GPU %d", o.initiator_gpu, o.target_gpu).c_str() : "");
    print_kv_rows(rows, o.verify);
    if (o.verify) {
        std::printf(
            "\nverified: one request of every kind, every byte of its pieces (with a "
            "notification)\n");
    }
}

void print_json(const Options& o, const Machine& m, const std::vector<BackendInfo>& backends,
                const std::vector<Row>& rows, const std::vector<KvRow>& kv_rows) {
    using nlohmann::json;
    json out;
    out["benchmark"] = o.kv ? "nixl-kv" : "nixl";
    out["machine"] = {{"cores", m.cores}, {"cpu", m.cpu}, {"kernel", m.kernel}};
    out["env"] = {{"UCX_TLS", m.ucx_tls},
                  {"UCX_TLS_set_by_benchmark", m.ucx_tls_set_here},
                  {"UCX_NET_DEVICES", m.ucx_net_devices},
                  {"NIXL_PLUGIN_DIR", m.plugin_dir}};
    out["config"] = {{"mem", o.vram ? "vram" : "dram"},
                     {"batch", o.batch},
                     {"depth", o.depth},
                     {"max_memory", o.max_memory},
                     {"min_seconds", o.min_seconds},
                     {"min_iters", o.min_iters},
                     {"verify", o.verify},
                     {"progress_thread", o.progress_thread}};
    if (o.vram) out["config"]["gpus"] = {o.initiator_gpu, o.target_gpu};
    if (!o.connect.empty()) {
        out["config"]["connect"] = o.connect;
        out["config"]["target"] = m.target;
    }
    out["backends"] = json::array();
    for (const BackendInfo& b : backends) {
        json j = {{"name", b.name},
                  {"params", std::map<std::string, std::string>(b.params.begin(), b.params.end())}};
        if (!b.error.empty()) j["error"] = b.error;
        out["backends"].push_back(j);
    }
    out["results"] = json::array();
    if (o.kv) {
        out["kv"] = kv_shape_json(o.kv_shape);
        for (const KvRow& r : kv_rows) out["results"].push_back(kv_row_json(r));
    }
    for (const Row& r : rows) {
        json j = {{"backend", r.backend},
                  {"op", r.op == Op::kWrite ? "write" : "read"},
                  {"mem", o.vram ? "vram" : "dram"},
                  {"size", r.size},
                  {"batch", o.batch},
                  {"depth", r.depth}};
        if (!r.error.empty()) {
            j["error"] = r.error;
        } else {
            j.update(
                throughput_json(r.tp, "requests", r.tp.iters * static_cast<uint64_t>(r.depth)));
            if (o.latency) j["latency"] = latency_json(r.lat);
            j["verified"] = r.verified;
            if (r.backend == "TCPX") {
                const Row* ucx = find_row(rows, "UCX", r);
                if (ucx != nullptr) {
                    j["tcpx_over_ucx_gbps"] = r.tp.gbps / ucx->tp.gbps;
                    if (o.latency) j["tcpx_over_ucx_p50"] = r.lat.p50_us / ucx->lat.p50_us;
                }
            }
        }
        out["results"].push_back(j);
    }
    // json_text: the target's bytes need not be UTF-8, where dump() would throw.
    std::printf("%s\n", json_text(out, 2).c_str());
}

}  // namespace tcpx::bench::nixl_bench
