#include "common/strings.h"

#include <cstdarg>
#include <cstdio>

namespace tcpx {

std::string strformat(const char* fmt, ...) {
    va_list args;
    va_start(args, fmt);
    va_list copy;
    va_copy(copy, args);
    const int len = std::vsnprintf(nullptr, 0, fmt, copy);
    va_end(copy);
    std::string out;
    if (len > 0) {
        out.resize(static_cast<size_t>(len) + 1);
        std::vsnprintf(out.data(), out.size(), fmt, args);
        out.resize(static_cast<size_t>(len));
    }
    va_end(args);
    return out;
}

std::string format_bytes(uint64_t bytes) {
    static constexpr const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    int unit = 0;
    double value = static_cast<double>(bytes);
    while (value >= 1024.0 && unit < 4) {
        value /= 1024.0;
        ++unit;
    }
    if (unit == 0) return strformat("%llu B", static_cast<unsigned long long>(bytes));
    if (value == static_cast<double>(static_cast<uint64_t>(value))) {
        return strformat("%.0f %s", value, kUnits[unit]);
    }
    return strformat("%.1f %s", value, kUnits[unit]);
}

std::string_view trim(std::string_view text) {
    const char* ws = " \t\r\n\v\f";
    const size_t begin = text.find_first_not_of(ws);
    if (begin == std::string_view::npos) return {};
    const size_t end = text.find_last_not_of(ws);
    return text.substr(begin, end - begin + 1);
}

std::vector<std::string> split_trimmed(std::string_view text, char sep) {
    std::vector<std::string> out;
    size_t start = 0;
    while (start <= text.size()) {
        size_t end = text.find(sep, start);
        if (end == std::string_view::npos) end = text.size();
        std::string_view piece = trim(text.substr(start, end - start));
        if (!piece.empty()) out.emplace_back(piece);
        start = end + 1;
    }
    return out;
}

std::string to_hex(const void* data, size_t len) {
    static constexpr char kDigits[] = "0123456789abcdef";
    const auto* bytes = static_cast<const uint8_t*>(data);
    std::string out(len * 2, '\0');
    for (size_t i = 0; i < len; ++i) {
        out[2 * i] = kDigits[bytes[i] >> 4];
        out[2 * i + 1] = kDigits[bytes[i] & 0xf];
    }
    return out;
}

bool from_hex(std::string_view hex, std::vector<uint8_t>* out) {
    if (hex.size() % 2 != 0) return false;
    auto nibble = [](char c) -> int {
        if (c >= '0' && c <= '9') return c - '0';
        if (c >= 'a' && c <= 'f') return c - 'a' + 10;
        if (c >= 'A' && c <= 'F') return c - 'A' + 10;
        return -1;
    };
    out->clear();
    out->reserve(hex.size() / 2);
    for (size_t i = 0; i < hex.size(); i += 2) {
        const int hi = nibble(hex[i]);
        const int lo = nibble(hex[i + 1]);
        if (hi < 0 || lo < 0) return false;
        out->push_back(static_cast<uint8_t>(hi << 4 | lo));
    }
    return true;
}

std::string printable(std::string_view text) {
    std::string out;
    out.reserve(text.size());
    for (char c : text) out.push_back(c >= 0x20 && c < 0x7f ? c : '?');
    return out;
}

}  // namespace tcpx
