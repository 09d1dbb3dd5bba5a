#include "bench/kv_workload.h"

#include <CLI/CLI.hpp>
#include <algorithm>
#include <climits>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>
#include <numeric>
#include <random>
#include <utility>

#include "bench/harness/report.h"
#include "bench/harness/roles.h"
#include "common/params.h"
#include "common/status_util.h"
#include "common/strings.h"

namespace tcpx::bench {

Status check_kv_shape(const KvShape& k) {
    if (k.layers < 1 || k.block_tokens < 1 || k.kv_heads < 1 || k.head_dim < 1 ||
        k.dtype_bytes < 1 || k.request_blocks < 1) {
        return invalid_argument("--kv-shape and --kv-blocks take positive numbers");
    }
    if (k.layers > 4096 || k.block_tokens > 4096 || k.kv_heads > 1024 || k.head_dim > 4096 ||
        k.dtype_bytes > 8) {
        return invalid_argument("--kv-shape: a dimension larger than any model's");
    }
    if (k.pool > (64ULL << 30)) return invalid_argument("--kv-pool: at most 64 GiB");
    // A request's offsets are drawn from a list of every block of a tensor, and listed one per
    // piece: both bounded (128 MiB and 32 MiB of offsets), whatever a peer's kvshape says.
    if (k.tensor_blocks() > (1ULL << 24)) {
        return invalid_argument(
            "--kv-pool: more than 16 Mi blocks per layer's K or V; use larger "
            "blocks or a smaller pool");
    }
    if (k.pieces() > (1ULL << 22)) {
        return invalid_argument("--kv-blocks: more than 4 Mi pieces per request");
    }
    if (k.tensor_blocks() < static_cast<uint64_t>(k.request_blocks)) {
        return invalid_argument(strformat(
            "--kv-pool %s holds %llu blocks of %s per layer's K and V; a request takes %d",
            format_bytes(k.pool).c_str(), static_cast<unsigned long long>(k.tensor_blocks()),
            format_bytes(k.block_bytes()).c_str(), k.request_blocks));
    }
    return Status();
}

// --- the command line ----------------------------------------------------------------------------

void add_kv_options(CLI::App* app, KvCommandLine* line, KvShape* shape) {
    app->add_flag(
        "--kv", line->kv,
        "The KV workload instead of the size sweep: a paged KV cache (layers x {K,V} x blocks), "
        "requests of random blocks pulled one at a time, beside one contiguous transfer of the "
        "same bytes");
    app->add_option("--kv-shape", line->shape,
                    "With --kv: layers,tokens-per-block,kv-heads,head-dim,dtype-bytes "
                    "(default 32,16,8,128,2: Llama-3-8B, 32 KiB blocks)");
    app->add_option("--kv-pool", line->pool, "With --kv: the cache's bytes per side (default 4G)");
    app->add_option("--kv-blocks", shape->request_blocks,
                    "With --kv: blocks of every layer's K and V per request (default 256: 4096 "
                    "tokens)")
        ->check(CLI::Range(1, 1 << 20));
}

Status parse_kv_options(const KvCommandLine& line, KvShape* shape) {
    if (!line.shape.empty()) {
        KvShape k = *shape;
        char tail = 0;
        if (std::sscanf(line.shape.c_str(), "%d,%d,%d,%d,%d%c", &k.layers, &k.block_tokens,
                        &k.kv_heads, &k.head_dim, &k.dtype_bytes, &tail) != 5) {
            return invalid_argument(strformat(
                "--kv-shape '%s' is not layers,tokens,heads,dim,dtype (e.g. 32,16,8,128,2)",
                line.shape.c_str()));
        }
        *shape = k;
    }
    if (!line.pool.empty() && (!parse_size(line.pool, &shape->pool) || shape->pool == 0)) {
        return invalid_argument(strformat("--kv-pool '%s' is not a size", line.pool.c_str()));
    }
    return Status();
}

std::string kv_shape_words(const KvShape& k) {
    return strformat("%d %d %d %d %d %llu %d", k.layers, k.block_tokens, k.kv_heads, k.head_dim,
                     k.dtype_bytes, static_cast<unsigned long long>(k.pool), k.request_blocks);
}

Status parse_kv_shape_words(const std::vector<std::string>& w, size_t first, KvShape* out) {
    if (w.size() < first + 7) return invalid_argument("kvshape: 7 numbers");
    KvShape k;
    // Whole words of digits (std::stoi would take "-1" and "8x"); check_kv_shape bounds them.
    int* const ints[] = {&k.layers,   &k.block_tokens, &k.kv_heads,
                         &k.head_dim, &k.dtype_bytes,  &k.request_blocks};
    const size_t at[] = {0, 1, 2, 3, 4, 6};
    for (size_t i = 0; i < std::size(ints); ++i) {
        if (!parse_int(w[first + at[i]], 0, INT_MAX, ints[i])) {
            return invalid_argument("kvshape: not numbers");
        }
    }
    if (!parse_uint(w[first + 5], UINT64_MAX, &k.pool)) {
        return invalid_argument("kvshape: not numbers");
    }
    TCPX_RETURN_IF_ERROR(check_kv_shape(k));
    *out = k;
    return Status();
}

// --- the requests
// ---------------------------------------------------------------------------------

uint64_t kv_seed(int request, KvSide side) {
    return 0x6b76000ULL + static_cast<uint64_t>(request) * 2 + static_cast<uint64_t>(side);
}

std::vector<uint64_t> kv_offsets(const KvShape& k, uint64_t seed) {
    const uint64_t tensor_blocks = k.tensor_blocks();
    std::vector<uint64_t> ids(tensor_blocks);
    std::iota(ids.begin(), ids.end(), 0);
    std::mt19937_64 rng(seed);
    for (uint64_t i = 0; i < static_cast<uint64_t>(k.request_blocks); ++i) {
        std::uniform_int_distribution<uint64_t> pick(i, tensor_blocks - 1);
        std::swap(ids[i], ids[pick(rng)]);
    }
    std::vector<uint64_t> out;
    out.reserve(k.pieces());
    for (uint64_t t = 0; t < static_cast<uint64_t>(k.layers) * 2; ++t) {
        for (int b = 0; b < k.request_blocks; ++b) {
            out.push_back((t * tensor_blocks + ids[static_cast<size_t>(b)]) * k.block_bytes());
        }
    }
    return out;
}

// --- --verify
// -------------------------------------------------------------------------------------

namespace {

uint64_t kv_piece_seed(uint64_t run, uint64_t i) {
    return pattern_seed(run, 0) ^ ((i + 1) * 0x9e3779b97f4a7c15ULL);
}

}  // namespace

Status kv_fill(const Buffer& b, const KvShape& k, const std::vector<uint64_t>& offsets,
               uint64_t run) {
    for (size_t i = 0; i < offsets.size(); ++i) {
        TCPX_RETURN_IF_ERROR(
            prepare_bytes(b, offsets[i], k.block_bytes(), /*source=*/true, kv_piece_seed(run, i)));
    }
    return Status();
}

Status kv_check(const Buffer& b, const KvShape& k, const std::vector<uint64_t>& offsets,
                uint64_t run, const std::string& what) {
    for (size_t i = 0; i < offsets.size(); ++i) {
        TCPX_RETURN_IF_ERROR(
            check_bytes(b, offsets[i], k.block_bytes(), kv_piece_seed(run, i),
                        strformat("%s, piece %zu of %zu (at %llu)", what.c_str(), i, offsets.size(),
                                  static_cast<unsigned long long>(offsets[i]))));
    }
    return Status();
}

// --- the report
// -----------------------------------------------------------------------------------

namespace {

double ms_per(const Throughput& t) {
    return t.iters == 0 ? 0 : t.seconds / static_cast<double>(t.iters) * 1e3;
}

double kv_ratio(const KvRow& r) {
    return r.contiguous.gbps > 0 ? r.kv.gbps / r.contiguous.gbps : 0;
}

}  // namespace

void print_kv_shape(const KvShape& k) {
    std::printf(
        "cache: %d layers x {K,V} x %llu blocks of %s (%d tokens x %d KV heads x %d x %d B), "
        "pool %s per side\n",
        k.layers, static_cast<unsigned long long>(k.tensor_blocks()),
        format_bytes(k.block_bytes()).c_str(), k.block_tokens, k.kv_heads, k.head_dim,
        k.dtype_bytes, format_bytes(k.pool).c_str());
    std::printf(
        "request: %d random blocks of every layer's K and V (other blocks on each side) = %llu "
        "pieces, %s; contiguous: the same bytes as one piece\n",
        k.request_blocks, static_cast<unsigned long long>(k.pieces()),
        format_bytes(k.request_bytes()).c_str());
    std::printf(
        "CPU s/GB: CPU seconds (user + system) of both sides, initiator and target, per GB "
        "moved\n");
}

void print_kv_rows(const std::vector<KvRow>& rows, bool verify) {
    const bool backends =
        std::any_of(rows.begin(), rows.end(), [](const KvRow& r) { return !r.backend.empty(); });
    std::printf("\n");
    if (backends) std::printf("%-7s ", "backend");
    std::printf("%-6s %-5s %10s %12s %16s %16s %14s %12s %13s%s\n", "op", "mem", "KV GB/s",
                "KV ms/req", "contiguous GB/s", "contiguous ms", "KV/contiguous", "KV CPU s/GB",
                "cont CPU s/GB", verify ? "  verified" : "");
    for (const KvRow& r : rows) {
        if (backends) std::printf("%-7s ", r.backend.c_str());
        if (!r.error.empty()) {
            std::printf("%-6s %-5s FAILED: %s\n", r.op.c_str(), r.mem.c_str(), r.error.c_str());
            continue;
        }
        std::printf("%-6s %-5s %10.2f %12.2f %16.2f %16.2f %13.2fx %12s %13s%s\n", r.op.c_str(),
                    r.mem.c_str(), r.kv.gbps, ms_per(r.kv), r.contiguous.gbps, ms_per(r.contiguous),
                    kv_ratio(r), cpu_cell(r.kv).c_str(), cpu_cell(r.contiguous).c_str(),
                    r.verified ? "  yes" : "");
    }
}

nlohmann::json kv_shape_json(const KvShape& k) {
    return {{"layers", k.layers},
            {"block_tokens", k.block_tokens},
            {"kv_heads", k.kv_heads},
            {"head_dim", k.head_dim},
            {"dtype_bytes", k.dtype_bytes},
            {"block_bytes", k.block_bytes()},
            {"pool_bytes", k.pool},
            {"tensor_blocks", k.tensor_blocks()},
            {"request_blocks", k.request_blocks},
            {"pieces", k.pieces()},
            {"request_bytes", k.request_bytes()}};
}

nlohmann::json kv_row_json(const KvRow& r) {
    using nlohmann::json;
    auto tp = [](const Throughput& t) {
        json j = throughput_json(t, "requests", t.iters);
        j["ms_per_request"] = ms_per(t);
        return j;
    };
    json j = {{"op", r.op}, {"mem", r.mem}};
    if (!r.backend.empty()) j["backend"] = r.backend;
    if (!r.error.empty()) {
        j["error"] = r.error;
        return j;
    }
    j["kv"] = tp(r.kv);
    j["contiguous"] = tp(r.contiguous);
    j["kv_contiguous_ratio"] = kv_ratio(r);
    j["verified"] = r.verified;
    return j;
}

}  // namespace tcpx::bench
