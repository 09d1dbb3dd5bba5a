// The typed parameter table and the settings it produces.
//
// Every setting is declared once in tcpx/config_params.inc with its type, default, range and doc
// line. From that one table come: the fields of tcpx::Config (for programmatic use), the
// environment variables TCPX_P2P_<NAME> read by Config::from_env(), name-based setting
// (Config::set, used by plugins that receive string key/value parameters) and the documentation
// table. An invalid value is an error that names the variable, never a silent fallback.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "tcpx/config.h"
#include "tcpx/status.h"

namespace tcpx {

inline constexpr std::string_view kEnvPrefix = "TCPX_P2P_";

// Internally the configuration is called Settings; it is the public tcpx::Config.
using Settings = Config;

enum class ParamType { kInt, kSize, kChoice, kString };

struct ParamInfo {
    std::string_view name;  // without the prefix, e.g. "NSOCKS"
    ParamType type;
    std::string_view default_text;  // as documented ("512 KiB", "8", "warn", "")
    int64_t min;                    // kInt / kSize
    int64_t max;
    std::string_view choices;  // kChoice: "a|b|c"
    std::string_view doc;
};

// `s` with its automatic values (0 for NSOCKS, IO_THREADS, CHANNELS) chosen for a machine of
// `cores` usable CPUs; explicit values are kept. Config::effective() applies it with this
// machine's count (usable_cores()).
Settings with_machine_defaults(Settings s, int64_t cores);

// The table, in declaration order.
std::span<const ParamInfo> param_table();

// The Markdown table of every parameter (name, type, default, range, meaning), as in
// docs/configuration.md.
std::string param_table_markdown();

// Parses a byte size: a non-negative integer with an optional K/KiB/M/MiB/G/GiB suffix (powers
// of 1024, case-insensitive). False on anything else or on overflow.
bool parse_size(std::string_view text, uint64_t* out);

}  // namespace tcpx
