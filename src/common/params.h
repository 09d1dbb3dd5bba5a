// The typed parameter table and the settings it produces.
//
// Every setting is declared once in params.inc with its type, default, range and doc line. From
// that one table come: the fields of Settings (for programmatic use), the environment variables
// TCPX_P2P_<NAME> read by Settings::from_env(), name-based setting (Settings::set, used by
// plugins that receive string key/value parameters) and the documentation table. An invalid value
// is an error that names the variable, never a silent fallback to the default.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "tcpx/status.h"

namespace tcpx {

inline constexpr std::string_view kEnvPrefix = "TCPX_P2P_";

struct Settings {
#define TCPX_PARAM_INT(field, NAME, def, lo, hi, doc) int64_t field = def;
#define TCPX_PARAM_SIZE(field, NAME, def, lo, hi, doc) uint64_t field = def;
#define TCPX_PARAM_CHOICE(field, NAME, def, choices, doc) std::string field = def;
#define TCPX_PARAM_STRING(field, NAME, def, doc) std::string field = def;
#include "common/params.inc"
#undef TCPX_PARAM_INT
#undef TCPX_PARAM_SIZE
#undef TCPX_PARAM_CHOICE
#undef TCPX_PARAM_STRING

    // Defaults overridden by every TCPX_P2P_* variable that is set; the first invalid value is an
    // error naming the variable. A TCPX_P2P_ variable that names no parameter is logged once (a
    // typo would otherwise go unnoticed) but is not an error.
    static StatusOr<Settings> from_env();

    // Sets one parameter by name ("NSOCKS", or "TCPX_P2P_NSOCKS"; case-insensitive) from text,
    // with the same parsing and range checks as the environment. Checks that involve several
    // fields are left to validate(), so that parameters can be set in any order.
    Status set(std::string_view name, std::string_view value);

    // Range and consistency checks for settings whose fields were assigned directly.
    Status validate() const;
};

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

// The table, in declaration order.
std::span<const ParamInfo> param_table();

// The Markdown table of every parameter (name, type, default, range, meaning), as in
// docs/configuration.md.
std::string param_table_markdown();

// Parses a byte size: a non-negative integer with an optional K/KiB/M/MiB/G/GiB suffix (powers
// of 1024, case-insensitive). False on anything else or on overflow.
bool parse_size(std::string_view text, uint64_t* out);

}  // namespace tcpx
