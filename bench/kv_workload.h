// The KV-cache workload (`--kv`) of the benchmarks that move KV blocks: `tcpx-p2p bench engine`
// (the engine's API) and `tcpx-nixl-bench` (NIXL's agent API). One shape, one way to pick a
// request's blocks, one way to pattern and check them, the same options and the same report, so
// that the two benches' figures describe the same workload.
//
// The cache is a paged KV cache modelled on vLLM's. Each side has a pool of `pool` bytes holding,
// per layer, a K and a V tensor of blocks; a block is block_tokens x kv_heads x head_dim x
// dtype_bytes (16 x 8 x 128 x 2 B = 32 KiB, Llama-3-8B's). A request moves `request_blocks`
// blocks of every layer's K and V, chosen at random on each side (the two sides' block ids
// differ, as a prefill's and a decode's do): layers x 2 x request_blocks pieces, posted as one
// transfer. Beside it, one contiguous transfer of the same bytes is the baseline.
//
// Both sides derive a request's pieces from its seed (kv_offsets), so that the initiator only
// names the request it moved: the command channel never carries piece lists.
#pragma once

#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

#include "bench/harness/measure.h"
#include "bench/harness/memory.h"
#include "tcpx/status.h"

// Declared, not included: CLI11's and nlohmann_json's full headers cost seconds of compile time
// in every file that includes this one (every driver, through engine_bench.h); the files that
// build options or JSON include them.
namespace CLI {
class App;
}  // namespace CLI

namespace tcpx::bench {

struct KvShape {
    int layers = 32;
    int block_tokens = 16;
    int kv_heads = 8;
    int head_dim = 128;
    int dtype_bytes = 2;
    uint64_t pool = 4ULL << 30;  // bytes per side (at least the tensors' blocks)
    int request_blocks = 256;    // 4096 tokens

    uint64_t block_bytes() const {
        return static_cast<uint64_t>(block_tokens) * static_cast<uint64_t>(kv_heads) *
               static_cast<uint64_t>(head_dim) * static_cast<uint64_t>(dtype_bytes);
    }
    // Blocks per tensor (a layer's K or V) that fit the pool.
    uint64_t tensor_blocks() const {
        return pool / (static_cast<uint64_t>(layers) * 2 * block_bytes());
    }
    uint64_t pieces() const {
        return static_cast<uint64_t>(layers) * 2 * static_cast<uint64_t>(request_blocks);
    }
    uint64_t request_bytes() const { return pieces() * block_bytes(); }
};

// OK when the shape is one a model could have and the pool holds a request; else which option
// is wrong (kInvalidArgument).
Status check_kv_shape(const KvShape& k);

// --- the command line ----------------------------------------------------------------------------

// The options as typed, before parse_kv_options.
struct KvCommandLine {
    bool kv = false;
    std::string shape;  // --kv-shape; empty: the default
    std::string pool;   // --kv-pool; empty: the default
};

// Adds --kv, --kv-shape, --kv-pool and --kv-blocks to `app`, with the same names and help in
// every bench; --kv-blocks goes straight into shape->request_blocks.
void add_kv_options(CLI::App* app, KvCommandLine* line, KvShape* shape);

// --kv-shape and --kv-pool into `shape`; kInvalidArgument saying which is not well formed (a
// usage error). Whether the shape makes sense is check_kv_shape's.
Status parse_kv_options(const KvCommandLine& line, KvShape* shape);

// The shape as the words of a command ("<layers> <tokens> <heads> <dim> <dtype> <pool> <blocks>")
// and back from w[first..first+7), for the benches' target processes.
std::string kv_shape_words(const KvShape& k);
Status parse_kv_shape_words(const std::vector<std::string>& w, size_t first, KvShape* k);

// --- the requests
// ---------------------------------------------------------------------------------

// kKvRequests different requests, cycled through by the measurements.
constexpr int kKvRequests = 4;

// Which side's blocks a seed picks: the initiator's and the target's differ.
enum class KvSide { kInitiator = 0, kTarget = 1 };

uint64_t kv_seed(int request, KvSide side);

// The pool offsets of a request's pieces on one side: every layer's K tensor's, then its V
// tensor's, chosen blocks, in that order; `request_blocks` distinct blocks picked by `seed`, the
// same for every layer (a sequence's block table).
std::vector<uint64_t> kv_offsets(const KvShape& k, uint64_t seed);

// --- --verify
// -------------------------------------------------------------------------------------
//
// The source's pieces get patterns (piece i of measurement `run` a pattern of its own, so that a
// piece landing at another piece's place is caught), the destination pool is poisoned, and
// after the transfer every byte of every destination piece must hold its pattern.

Status kv_fill(const Buffer& b, const KvShape& k, const std::vector<uint64_t>& offsets,
               uint64_t run);
// OK, or where the first wrong byte is (kInternal).
Status kv_check(const Buffer& b, const KvShape& k, const std::vector<uint64_t>& offsets,
                uint64_t run, const std::string& what);

// --- the report
// -----------------------------------------------------------------------------------

struct KvRow {
    std::string backend;    // the NIXL bench's backend; empty in the engine bench
    std::string op;         // "WRITE" or "READ"
    std::string mem;        // as the bench names memory
    Throughput kv;          // the KV requests, one at a time
    Throughput contiguous;  // the same bytes as one piece, one at a time
    bool verified = false;
    std::string error;  // the row failed (NIXL bench)
};

// The lines describing the cache and a request ("cache: ...", "request: ...").
void print_kv_shape(const KvShape& k);
// The table of rows (a backend column when any row has a backend).
void print_kv_rows(const std::vector<KvRow>& rows, bool verify);

nlohmann::json kv_shape_json(const KvShape& k);
nlohmann::json kv_row_json(const KvRow& r);

}  // namespace tcpx::bench
