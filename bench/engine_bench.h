// The loopback benchmark of the transfer engine (tcpx::Endpoint): one-sided WRITE and READ from an
// initiator endpoint to one or more target endpoints, in one process or two, between host or GPU
// memory, against raw TCP measured in the same run (the same stream count for throughput, a
// ping-pong for latency) and, for GPU memory, against the same transfers between host memory.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "bench/bench_memory.h"

namespace tcpx::bench {

// The KV workload (--kv): a paged KV cache modelled on vLLM's. Each side has a pool of `pool`
// bytes holding, per layer, a K and a V tensor of blocks; a block is block_tokens x kv_heads x
// head_dim x dtype_bytes (16 x 8 x 128 x 2 B = 32 KiB, Llama-3-8B's). A request moves
// `request_blocks` blocks of every layer's K and V, chosen at random on each side (the two sides'
// block ids differ, as a prefill's and a decode's do): layers x 2 x request_blocks pieces, one
// vector transfer.
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

struct EngineBenchOptions {
    std::vector<uint64_t> sizes;  // bytes per piece; a transfer moves batch pieces
    bool write = true;            // measure WRITE
    bool read = true;             // measure READ
    int batch = 1;                // pieces per transfer (writev/readv when > 1)
    int concurrency = 8;          // transfers in flight per peer (at most 512 MiB of them)
    int peers = 1;                // target endpoints the initiator connects to
    int processes = 2;            // 1: targets in this process; 2: all targets in a child
    std::string interface = "=lo";
    // Memory of every registered region. With kVram, `gpus` holds the initiator's GPU and the
    // targets' GPU (empty: 0,1 on a machine with two GPUs or more, else 0,0), and unless
    // !host_baseline the same transfers are also measured between host memory.
    MemType mem = MemType::kHost;
    std::vector<int> gpus;
    bool host_baseline = true;
    // Engine settings from the command line; empty: from TCPX_P2P_* or the default.
    std::string channels;      // CHANNELS
    std::string nsocks;        // NSOCKS
    std::string chunk;         // XFER_CHUNK_SIZE
    std::string window;        // WINDOW
    double min_seconds = 0.5;  // per measurement
    int min_iters = 5;         // per measurement
    bool baseline = true;      // also measure raw TCP
    bool latency = true;       // also measure single transfers (concurrency 1)
    bool single_peer = true;   // with peers > 1: also measure one peer with the same settings
    bool verify = false;       // check the bytes of every measurement's last transfer
    bool kv = false;           // the KV workload instead of the size sweep
    KvShape kv_shape;
    bool json = false;
    bool progress = true;  // on stderr, when it is a terminal
};

// Runs the sweep and prints the table (or JSON) on stdout. Returns the process exit code.
int run_engine_bench(const EngineBenchOptions& options);

// The target side in a child process (`tcpx-p2p bench engine --serve`): commands on stdin,
// replies on stdout.
int serve_engine_bench(const EngineBenchOptions& options);

}  // namespace tcpx::bench
