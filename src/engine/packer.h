// How a transfer's pieces are cut into data-channel chunks (engine protocol version 2).
//
// Chunks carry no header: both sides must cut a transfer the same way from what both know, the
// list of piece lengths (the initiator's local pieces and the target's segments have the same
// lengths, in the same order) and the chunk size agreed in HELLO. The rule:
//   - pieces of no bytes are skipped;
//   - a piece of at least `chunk` bytes is large: it is cut into chunks of its own, each `chunk`
//     bytes but its last; they go straight between the piece and the transport;
//   - smaller pieces are packed, whole and in order, into one chunk while their total stays
//     within `chunk` and their count within kMaxChunkPieces; a chunk of several pieces is
//     gathered into a staging buffer by its sender and scattered from one by its receiver.
// So a KV cache of thousands of 16-256 KiB blocks travels in chunk-sized requests, and a large
// buffer travels as before, without a copy. What one chunk costs to describe is bounded by
// kMaxChunkPieces whatever the transfer holds.
#pragma once

#include <cstddef>
#include <cstdint>

namespace tcpx::engine::packer {

inline constexpr uint32_t kMaxChunkPieces = 1024;

// The chunk size an initiator asks a transfer of `total` bytes to be cut by, given the size
// agreed with the peer: the agreed one, except that a transfer to pipeline (`gpu`: it touches GPU
// memory on either side, and is alone with its peer) shorter than four agreed chunks is cut in
// about four (at least 128 KiB each), so that its staging copies overlap the wire instead of
// preceding and following it. The request carries it: the target cuts by the same.
inline uint64_t transfer_chunk(uint64_t agreed, uint64_t total, bool gpu) {
    constexpr uint64_t kMinPipelined = 128 * 1024;
    if (!gpu || total / 4 >= agreed) return agreed;
    uint64_t sub = (total + 3) / 4;
    sub = (sub + 4095) & ~uint64_t{4095};
    if (sub < kMinPipelined) sub = kMinPipelined;
    return sub < agreed ? sub : agreed;
}

// Where the next chunk starts: a piece, and a byte offset into it (non-zero only inside a large
// piece).
struct Cursor {
    size_t piece = 0;
    uint64_t offset = 0;
};

// One chunk: `len` bytes from pieces [first, end), starting `offset` bytes into piece `first`.
// `pieces` counts the pieces with bytes in it; with one, the chunk is that piece's
// [offset, offset + len).
struct Cut {
    size_t first = 0;
    size_t end = 0;
    uint64_t offset = 0;
    uint64_t len = 0;
    uint32_t pieces = 0;
};

// Cuts the next chunk of the `n` pieces whose lengths `len_at(i)` gives, from `*at`, and moves
// `*at` past it, and past any empty pieces after it: once the last chunk is cut, `at->piece` is
// `n`. False when no bytes are left. `chunk` must be non-zero.
template <typename LenAt>
bool next(const LenAt& len_at, size_t n, uint64_t chunk, Cursor* at, Cut* out) {
    while (at->piece < n && len_at(at->piece) == 0) ++at->piece;
    if (at->piece >= n) return false;
    const uint64_t first_len = len_at(at->piece);
    Cut c;
    c.first = at->piece;
    c.offset = at->offset;
    if (first_len >= chunk) {
        const uint64_t left = first_len - at->offset;
        c.len = left < chunk ? left : chunk;
        c.pieces = 1;
        at->offset += c.len;
        if (at->offset == first_len) {
            ++at->piece;
            at->offset = 0;
        }
        c.end = at->piece == c.first ? c.first + 1 : at->piece;
        // Past empty pieces too: a cursor at the end says no chunk is left (refill() drops a
        // transfer's entry then; left on an empty last piece, the entry outlived its transfer).
        while (at->piece < n && len_at(at->piece) == 0) ++at->piece;
        *out = c;
        return true;
    }
    // Small pieces, whole: at least the first, then as many as fit.
    size_t i = at->piece;
    while (i < n) {
        const uint64_t len = len_at(i);
        if (len != 0) {
            if (len >= chunk || c.len + len > chunk || c.pieces == kMaxChunkPieces) break;
            c.len += len;
            ++c.pieces;
        }
        ++i;
    }
    c.end = i;
    at->piece = i;
    at->offset = 0;
    *out = c;
    return true;
}

// How many chunks `next` cuts from the list, from `from` on.
template <typename LenAt>
uint64_t count(const LenAt& len_at, size_t n, uint64_t chunk, Cursor from = {}) {
    Cursor at = from;
    Cut c;
    uint64_t chunks = 0;
    for (;;) {
        while (at.piece < n && len_at(at.piece) == 0) ++at.piece;
        if (at.piece >= n) break;
        const uint64_t len = len_at(at.piece);
        if (len >= chunk) {  // a large piece's (remaining) chunks, without walking them
            const uint64_t left = len - at.offset;
            chunks += left / chunk + (left % chunk != 0 ? 1 : 0);
            ++at.piece;
            at.offset = 0;
            continue;
        }
        next(len_at, n, chunk, &at, &c);
        ++chunks;
    }
    return chunks;
}

}  // namespace tcpx::engine::packer
