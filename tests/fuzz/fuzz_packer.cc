// The chunk packer (engine/packer.h) over piece lengths a peer names (a WRITE_REQ's or READ_REQ's
// segments) and the chunk size its request asks for: every cut stays within the chunk size and
// the piece limit, the cuts cover every byte exactly once and in order, and count() agrees with
// next() from any cursor, so that a peer's list can neither desynchronize the two sides' chunks
// nor make the counting and the cutting disagree (a transfer that never completes).
//
// Input: u64 chunk size, then u64 piece lengths (their total must not overflow, as the decoder
// guarantees).
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "engine/ctrl_wire.h"
#include "engine/packer.h"
#include "fuzz_check.h"

namespace p = tcpx::engine::packer;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    if (size < 8) return 0;
    uint64_t chunk = 0;
    std::memcpy(&chunk, data, 8);
    // What a request may ask: the minimum up to the largest agreed size.
    chunk = tcpx::engine::wire::kMinChunk + chunk % (64u << 20);
    std::vector<uint64_t> lens;
    uint64_t total = 0;
    for (size_t at = 8; at + 8 <= size && lens.size() < 4096; at += 8) {
        uint64_t len = 0;
        std::memcpy(&len, data + at, 8);
        if (len > UINT64_MAX - total) return 0;  // refused by the decoder
        total += len;
        lens.push_back(len);
    }
    const auto len_at = [&](size_t i) { return lens[i]; };
    const uint64_t chunks = p::count(len_at, lens.size(), chunk);
    // Walk the cuts only where there are few enough to walk.
    if (chunks > 200000) return 0;
    p::Cursor at;
    p::Cut cut;
    uint64_t walked = 0, covered = 0;
    size_t piece = 0;
    uint64_t offset = 0;
    while (true) {
        FUZZ_CHECK(p::count(len_at, lens.size(), chunk, at) == chunks - walked);
        if (!p::next(len_at, lens.size(), chunk, &at, &cut)) break;
        ++walked;
        FUZZ_CHECK(cut.len > 0 && cut.len <= chunk);
        FUZZ_CHECK(cut.pieces >= 1 && cut.pieces <= p::kMaxChunkPieces);
        FUZZ_CHECK(cut.first < cut.end && cut.end <= lens.size());
        while (piece < lens.size() && lens[piece] == 0) ++piece;
        FUZZ_CHECK(cut.first == piece && cut.offset == offset);
        if (cut.pieces == 1) {
            FUZZ_CHECK(cut.offset + cut.len <= lens[cut.first]);
        }
        uint64_t sum = 0;
        for (size_t i = cut.first; i < cut.end; ++i) sum += i == cut.first ? 0 : lens[i];
        if (cut.pieces > 1) FUZZ_CHECK(sum + lens[cut.first] == cut.len && cut.offset == 0);
        covered += cut.len;
        piece = at.piece;
        offset = at.offset;
    }
    FUZZ_CHECK(walked == chunks);
    FUZZ_CHECK(covered == total);
    return 0;
}
