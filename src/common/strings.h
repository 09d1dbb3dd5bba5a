// Small string utilities shared by every layer.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace tcpx {

// printf-style formatting into a std::string (checked by the compiler like printf).
std::string strformat(const char* fmt, ...) __attribute__((format(printf, 1, 2)));

// "1.5 KiB", "64 MiB", "3 B": binary units, at most one decimal.
std::string format_bytes(uint64_t bytes);

// Splits on `sep`, trimming ASCII whitespace around each piece; empty pieces are dropped.
std::vector<std::string> split_trimmed(std::string_view text, char sep);

std::string_view trim(std::string_view text);

// Lower-case hex of `len` bytes, and back. from_hex fails (returns false) on odd length or a
// non-hex character.
std::string to_hex(const void* data, size_t len);
bool from_hex(std::string_view hex, std::vector<uint8_t>* out);
// `text` with every byte outside printable ASCII replaced by '?': for words a peer sent, before
// they reach a log line or an error message.
std::string printable(std::string_view text);

}  // namespace tcpx
