// tcpx/config.h — every setting of tcpx-p2p, for programmatic use.
//
// The fields come from one table (config_params.inc) that also defines the TCPX_P2P_<NAME>
// environment variables and the documentation (docs/configuration.md). Start from the defaults
// (`Config{}`) or from the environment (`Config::from_env()`), change fields directly or by name
// (`set("NSOCKS", "4")`), and pass the result to Endpoint::create.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "tcpx/api.h"
#include "tcpx/status.h"

namespace tcpx {

struct TCPX_API Config {
#define TCPX_PARAM_INT(field, NAME, def, lo, hi, doc) int64_t field = def;
#define TCPX_PARAM_SIZE(field, NAME, def, lo, hi, doc) uint64_t field = def;
#define TCPX_PARAM_CHOICE(field, NAME, def, choices, doc) std::string field = def;
#define TCPX_PARAM_STRING(field, NAME, def, doc) std::string field = def;
#include "tcpx/config_params.inc"
#undef TCPX_PARAM_INT
#undef TCPX_PARAM_SIZE
#undef TCPX_PARAM_CHOICE
#undef TCPX_PARAM_STRING

    // Defaults overridden by every TCPX_P2P_* variable that is set; the first invalid value is an
    // error naming the variable. A TCPX_P2P_ variable that names no parameter is logged once (a
    // typo would otherwise go unnoticed) but is not an error.
    static StatusOr<Config> from_env();

    // Sets one parameter by name ("NSOCKS", or "TCPX_P2P_NSOCKS"; case-insensitive) from text,
    // with the same parsing and range checks as the environment. Checks that involve several
    // fields are left to validate(), so that parameters can be set in any order.
    Status set(std::string_view name, std::string_view value);

    // Range and consistency checks for settings whose fields were assigned directly.
    Status validate() const;
    // These settings as this machine runs them: every automatic value (0 for NSOCKS, IO_THREADS,
    // CHANNELS, MIN_CHUNK_SIZE and the XFER_INLINE_ALONE / _ALONE_READ / _BUSY limits, `auto` for
    // SOCKET_IO) replaced by what the CPUs this process may use choose (the rules are in
    // docs/configuration.md, "Defaults that fit the machine"). What Endpoint::create and the
    // transports apply; printed by benchmarks and `tcpx-p2p doctor`.
    Config effective() const;
};

}  // namespace tcpx
