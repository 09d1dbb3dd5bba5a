#include "common/params.h"

#include <strings.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstdlib>
#include <limits>
#include <mutex>
#include <set>
#include <vector>

#include "common/env.h"
#include "common/log.h"
#include "common/machine.h"
#include "common/status_util.h"
#include "common/strings.h"
#include "common/topology.h"

namespace tcpx {
namespace {

std::string size_default_text(uint64_t v) { return v == 0 ? "0" : format_bytes(v); }

// A variable of ours that names no parameter (most likely a typo): said once per name, for the
// first kMaxWarnedNames names (a process reads the environment at every endpoint's creation).
void warn_unknown_once(const std::string& name) {
    constexpr size_t kMaxWarnedNames = 64;
    // (immortal: endpoints may be created while another thread's exit destroys statics)
    static auto* mu = new std::mutex();
    static auto* warned = new std::set<std::string>();
    {
        std::lock_guard<std::mutex> lock(*mu);
        if (warned->size() >= kMaxWarnedNames || !warned->insert(name).second) return;
    }
    TCPX_WARN("ignoring %s: no such parameter (see `tcpx-p2p params`)", name.c_str());
}

// The table with defaults rendered as text; built once from params.inc.
struct TableStorage {
    std::vector<std::string> default_texts;
    std::vector<ParamInfo> rows;
    TableStorage() {
#define TCPX_PARAM_INT(field, NAME, def, lo, hi, doc) \
    add(#NAME, ParamType::kInt, std::to_string(def), lo, hi, "", doc);
#define TCPX_PARAM_SIZE(field, NAME, def, lo, hi, doc) \
    add(#NAME, ParamType::kSize, size_default_text(def), lo, hi, "", doc);
#define TCPX_PARAM_CHOICE(field, NAME, def, choices, doc) \
    add(#NAME, ParamType::kChoice, def, 0, 0, choices, doc);
#define TCPX_PARAM_STRING(field, NAME, def, doc) add(#NAME, ParamType::kString, def, 0, 0, "", doc);
#include "tcpx/config_params.inc"
#undef TCPX_PARAM_INT
#undef TCPX_PARAM_SIZE
#undef TCPX_PARAM_CHOICE
#undef TCPX_PARAM_STRING
        // default_texts is fully built now; point the rows at its strings.
        for (size_t i = 0; i < rows.size(); ++i) rows[i].default_text = default_texts[i];
    }
    void add(const char* name, ParamType type, std::string def, int64_t lo, int64_t hi,
             const char* choices, const char* doc) {
        default_texts.push_back(std::move(def));
        rows.push_back(ParamInfo{name, type, {}, lo, hi, choices, doc});
    }
};

const TableStorage& table() {
    static const TableStorage storage;
    return storage;
}

bool iequals(std::string_view a, std::string_view b) {
    return a.size() == b.size() && ::strncasecmp(a.data(), b.data(), a.size()) == 0;
}

std::string_view strip_prefix(std::string_view name) {
    if (name.size() > kEnvPrefix.size() && iequals(name.substr(0, kEnvPrefix.size()), kEnvPrefix)) {
        name.remove_prefix(kEnvPrefix.size());
    }
    return name;
}

Status parse_int(std::string_view text, int64_t lo, int64_t hi, int64_t* out) {
    text = trim(text);
    int64_t v = 0;
    auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
    if (text.empty() || ec != std::errc() || end != text.data() + text.size()) {
        return invalid_argument(
            strformat("'%.*s' is not an integer", static_cast<int>(text.size()), text.data()));
    }
    if (v < lo || v > hi) {
        return out_of_range(strformat("%lld is outside [%lld, %lld]", static_cast<long long>(v),
                                      static_cast<long long>(lo), static_cast<long long>(hi)));
    }
    *out = v;
    return Status();
}

Status parse_size_checked(std::string_view text, int64_t lo, int64_t hi, uint64_t* out) {
    uint64_t v = 0;
    if (!parse_size(text, &v)) {
        return invalid_argument(strformat("'%.*s' is not a size (e.g. 4096, 512K, 64MiB)",
                                          static_cast<int>(text.size()), text.data()));
    }
    if (v < static_cast<uint64_t>(lo) || v > static_cast<uint64_t>(hi)) {
        return out_of_range(strformat("%s is outside [%s, %s]", format_bytes(v).c_str(),
                                      format_bytes(static_cast<uint64_t>(lo)).c_str(),
                                      format_bytes(static_cast<uint64_t>(hi)).c_str()));
    }
    *out = v;
    return Status();
}

Status parse_choice(std::string_view text, std::string_view choices, std::string* out) {
    text = trim(text);
    for (const std::string& choice : split_trimmed(choices, '|')) {
        if (iequals(text, choice)) {
            *out = choice;
            return Status();
        }
    }
    return invalid_argument(strformat("'%.*s' is not one of %.*s", static_cast<int>(text.size()),
                                      text.data(), static_cast<int>(choices.size()),
                                      choices.data()));
}

Status range_check_int(const char* name, int64_t v, int64_t lo, int64_t hi) {
    if (v < lo || v > hi) {
        return out_of_range(strformat("%.*s%s = %lld is outside [%lld, %lld]",
                                      static_cast<int>(kEnvPrefix.size()), kEnvPrefix.data(), name,
                                      static_cast<long long>(v), static_cast<long long>(lo),
                                      static_cast<long long>(hi)));
    }
    return Status();
}

Status choice_check(const char* name, const std::string& v, std::string_view choices) {
    std::string canonical;
    Status st = parse_choice(v, choices, &canonical);
    if (!st.ok()) {
        return st.with_context(
            strformat("%.*s%s", static_cast<int>(kEnvPrefix.size()), kEnvPrefix.data(), name));
    }
    return Status();
}

}  // namespace

bool parse_size(std::string_view text, uint64_t* out) {
    text = trim(text);
    size_t digits = 0;
    while (digits < text.size() && text[digits] >= '0' && text[digits] <= '9') ++digits;
    if (digits == 0) return false;
    uint64_t v = 0;
    auto [end, ec] = std::from_chars(text.data(), text.data() + digits, v);
    if (ec != std::errc() || end != text.data() + digits) return false;
    std::string_view unit = trim(text.substr(digits));
    uint64_t mult = 1;
    if (unit.empty() || iequals(unit, "B")) {
        mult = 1;
    } else if (iequals(unit, "K") || iequals(unit, "KiB") || iequals(unit, "KB")) {
        mult = 1ULL << 10;
    } else if (iequals(unit, "M") || iequals(unit, "MiB") || iequals(unit, "MB")) {
        mult = 1ULL << 20;
    } else if (iequals(unit, "G") || iequals(unit, "GiB") || iequals(unit, "GB")) {
        mult = 1ULL << 30;
    } else {
        return false;
    }
    if (v > std::numeric_limits<uint64_t>::max() / mult) return false;
    *out = v * mult;
    return true;
}

std::span<const ParamInfo> param_table() { return table().rows; }

Status Settings::set(std::string_view name, std::string_view value) {
    const std::string_view key = strip_prefix(trim(name));
    // A secret set to nothing (or to blanks, which trim to nothing) is most likely one that
    // failed to load (the variable set to "$(cat a-missing-file)", a NIXL parameter read from an
    // empty file): refused, where taking it as "no secret" would turn authentication off without
    // a word, and through set() replace the secret the environment gave. Leave it unset to run
    // without one.
    if ((iequals(key, "AUTH_SECRET") || iequals(key, "AUTH_SECRET_PREVIOUS")) &&
        trim(value).empty()) {
        return invalid_argument(
            strformat("%.*s%.*s is set but empty; leave it unset to run without a shared secret",
                      static_cast<int>(kEnvPrefix.size()), kEnvPrefix.data(),
                      static_cast<int>(key.size()), key.data()));
    }
    Status st = invalid_argument("no such parameter");
#define TCPX_PARAM_INT(field, NAME, def, lo, hi, doc) \
    if (iequals(key, #NAME)) st = parse_int(value, lo, hi, &field);
#define TCPX_PARAM_SIZE(field, NAME, def, lo, hi, doc) \
    if (iequals(key, #NAME)) st = parse_size_checked(value, lo, hi, &field);
#define TCPX_PARAM_CHOICE(field, NAME, def, choices, doc) \
    if (iequals(key, #NAME)) st = parse_choice(value, choices, &field);
#define TCPX_PARAM_STRING(field, NAME, def, doc) \
    if (iequals(key, #NAME)) {                   \
        field = std::string(trim(value));        \
        st = Status();                           \
    }
#include "tcpx/config_params.inc"
#undef TCPX_PARAM_INT
#undef TCPX_PARAM_SIZE
#undef TCPX_PARAM_CHOICE
#undef TCPX_PARAM_STRING
    if (!st.ok()) {
        return st.with_context(strformat("%.*s%.*s", static_cast<int>(kEnvPrefix.size()),
                                         kEnvPrefix.data(), static_cast<int>(key.size()),
                                         key.data()));
    }
    return Status();
}

Status Settings::validate() const {
#define TCPX_PARAM_INT(field, NAME, def, lo, hi, doc) \
    TCPX_RETURN_IF_ERROR(range_check_int(#NAME, field, lo, hi));
#define TCPX_PARAM_SIZE(field, NAME, def, lo, hi, doc) \
    if (field > static_cast<uint64_t>(INT64_MAX)) {    \
        return out_of_range(#NAME " is too large");    \
    }                                                  \
    TCPX_RETURN_IF_ERROR(range_check_int(#NAME, static_cast<int64_t>(field), lo, hi));
#define TCPX_PARAM_CHOICE(field, NAME, def, choices, doc) \
    TCPX_RETURN_IF_ERROR(choice_check(#NAME, field, choices));
#define TCPX_PARAM_STRING(field, NAME, def, doc)
#include "tcpx/config_params.inc"
#undef TCPX_PARAM_INT
#undef TCPX_PARAM_SIZE
#undef TCPX_PARAM_CHOICE
#undef TCPX_PARAM_STRING
    for (const auto& [name, secret] : {std::pair{"AUTH_SECRET", &auth_secret},
                                       {"AUTH_SECRET_PREVIOUS", &auth_secret_previous}}) {
        // A short secret is guessable offline from one captured handshake.
        if (!secret->empty() && secret->size() < 16) {
            return invalid_argument(
                strformat("TCPX_P2P_%s has %zu characters; a secret needs at least 16", name,
                          secret->size()));
        }
    }
    if (!auth_secret_previous.empty() && auth_secret.empty()) {
        return invalid_argument(
            "TCPX_P2P_AUTH_SECRET_PREVIOUS is set without TCPX_P2P_AUTH_SECRET");
    }
    // The map's form (which NICs it names exist is for the transport to say).
    TCPX_RETURN_IF_ERROR(topo::parse_gpu_nic_map(gpu_nic_map).status());
    if (sysfs_root.empty()) return invalid_argument("TCPX_P2P_SYSFS_ROOT is empty");
    // A notification travels in one control message (its NOTIF's body: a 4-byte length and the
    // bytes) and is held whole until taken: one that could not fit either would fail its
    // sender's connection every time, though this setting promises to accept it.
    constexpr uint64_t kNotifOverhead = 4;
    if (max_notification_size + kNotifOverhead > max_ctrl_message) {
        return invalid_argument(strformat(
            "TCPX_P2P_MAX_NOTIFICATION_SIZE (%s) does not fit in TCPX_P2P_MAX_CTRL_MESSAGE (%s, "
            "of which a notification's message takes %llu bytes more): lower the first or raise "
            "the second",
            format_bytes(max_notification_size).c_str(), format_bytes(max_ctrl_message).c_str(),
            static_cast<unsigned long long>(kNotifOverhead)));
    }
    if (max_served_pieces_total < max_served_pieces) {
        return invalid_argument(strformat(
            "TCPX_P2P_MAX_SERVED_PIECES_TOTAL (%lld) is below TCPX_P2P_MAX_SERVED_PIECES (%lld): "
            "one peer may hold that many on its own",
            static_cast<long long>(max_served_pieces_total),
            static_cast<long long>(max_served_pieces)));
    }
    // A message of MAX_CTRL_MESSAGE (and a transfer's inline bytes, at most 1 MiB) must find
    // room beyond a connection's own 1 MiB buffer, or its sender would wait and then fail.
    if (max_ctrl_buffer_total < max_ctrl_message + (uint64_t{1} << 20)) {
        return invalid_argument(strformat(
            "TCPX_P2P_MAX_CTRL_BUFFER_TOTAL (%s) cannot hold one message of "
            "TCPX_P2P_MAX_CTRL_MESSAGE (%s) and 1 MiB more: raise the first or lower the second",
            format_bytes(max_ctrl_buffer_total).c_str(), format_bytes(max_ctrl_message).c_str()));
    }
    // One drain's buffer (a chunk) must fit, or a refused write could never be drained.
    if (max_scratch_bytes_total < xfer_chunk_size) {
        return invalid_argument(strformat(
            "TCPX_P2P_MAX_SCRATCH_BYTES_TOTAL (%s) is below TCPX_P2P_XFER_CHUNK_SIZE (%s): a "
            "refused write's chunk could never be drained; raise the first or lower the second",
            format_bytes(max_scratch_bytes_total).c_str(), format_bytes(xfer_chunk_size).c_str()));
    }
    // The most one channel takes at once (a gather ring and its GPU twin, each page-rounded)
    // must fit twice: once for a send, and once more for a receive (sends leave that much).
    const uint64_t one_channel =
        (2 * static_cast<uint64_t>(staging_slots) + 1) * xfer_chunk_size + 16384;
    if (max_staging_bytes_total < 2 * one_channel) {
        return invalid_argument(strformat(
            "TCPX_P2P_MAX_STAGING_BYTES_TOTAL (%s) is below what a send's and a receive's staging "
            "may take at once, 2 x ((2 x TCPX_P2P_STAGING_SLOTS + 1) x TCPX_P2P_XFER_CHUNK_SIZE "
            "+ 16 KiB) (%s): raise it or lower the others",
            format_bytes(max_staging_bytes_total).c_str(), format_bytes(2 * one_channel).c_str()));
    }
    for (const auto& [name, bound] :
         {std::pair{"MAX_QUEUED_NOTIFICATION_BYTES", max_queued_notification_bytes},
          {"MAX_QUEUED_NOTIFICATION_BYTES_TOTAL", max_queued_notification_bytes_total}}) {
        if (max_notification_size > bound) {
            return invalid_argument(strformat(
                "TCPX_P2P_MAX_NOTIFICATION_SIZE (%s) exceeds TCPX_P2P_%s (%s): a notification "
                "that size could never be held; lower the first or raise the second",
                format_bytes(max_notification_size).c_str(), name, format_bytes(bound).c_str()));
        }
    }
    if (min_chunk_size != 0 && min_chunk_size < 4096) {
        return invalid_argument(
            strformat("TCPX_P2P_MIN_CHUNK_SIZE (%s) is below 4 KiB (0 picks it)",
                      format_bytes(min_chunk_size).c_str()));
    }
    if (min_chunk_size > chunk_size) {
        return invalid_argument(
            strformat("TCPX_P2P_MIN_CHUNK_SIZE (%s) is larger than TCPX_P2P_CHUNK_SIZE (%s)",
                      format_bytes(min_chunk_size).c_str(), format_bytes(chunk_size).c_str()));
    }
    return Status();
}

Settings with_machine_defaults(Settings s, int64_t cores) {
    cores = std::max<int64_t>(cores, 1);
    // One I/O thread per core, up to 16: past that, more threads only add wakeups.
    if (s.io_threads == 0) s.io_threads = std::min<int64_t>(cores, 16);
    // Half the cores, 2 to 8 sockets: 8 streams are what a 200 Gb/s NIC needs over one
    // connection, and on a small machine each socket is one more flow the cores must serve
    // (measured in docs/benchmarking.md, "Defaults that fit the machine").
    if (s.nsocks == 0) s.nsocks = std::clamp<int64_t>(cores / 2, 2, 8);
    // A second channel gives GPU staging copies and the wire two independent pipelines, which
    // pays where there are cores to drive them.
    if (s.channels == 0) s.channels = cores >= 16 ? 2 : 1;
    // A message is cut into a chunk per socket, but none smaller than this: every chunk costs
    // a header and a wakeup of a sending and a receiving thread, which at 64 KiB weigh as much
    // as its bytes. 256 KiB messages moved 1.2-1.7x with 128 KiB chunks instead of 64 KiB on 32
    // cores (8 sockets), and 128 KiB ones 1.05-1.1x on two (docs/socket-transport.md, Messages).
    if (s.min_chunk_size == 0) s.min_chunk_size = std::min<uint64_t>(128 * 1024, s.chunk_size);
    // On a few cores, I/O threads only add handoffs between threads that share them; with more,
    // one thread moves what one core copies, a third to a sixth of what the I/O threads move at
    // 256 KiB and up, with a progress thread or without (docs/engine.md, Progress; measured in
    // docs/benchmarking.md, "I/O in the thread that makes progress" and "Without a progress
    // thread, on 16 cores").
    if (s.socket_io == "auto") s.socket_io = cores <= 4 ? "caller" : "threads";
    // A lone WRITE inside its request: one message through one socket, where a chunk would
    // add a second message and an acknowledgement. Where one thread does all the I/O that wins up
    // to 256 KiB; where I/O threads move a chunk's sockets in parallel, only up to 64 KiB
    // (measured: docs/engine.md, "Small transfers"). A lone READ answered inline measured slower
    // past 64 KiB even where one thread does the I/O.
    if (s.xfer_inline_alone == 0) {
        s.xfer_inline_alone = s.socket_io == "caller" ? 256 * 1024 : 64 * 1024;
    }
    if (s.xfer_inline_alone_read == 0) s.xfer_inline_alone_read = 64 * 1024;
    // Small transfers under load inside their requests too: one message on the control socket
    // instead of a request, a chunk on a data socket and an acknowledgement, each a system call
    // and a wakeup. Where one thread does all the I/O, 16-64 KiB moved 1.3-1.6x so on two cores
    // and 128 KiB did not gain; with I/O threads on 16 cores 16-32 KiB moved 1.1-1.8x with half
    // the CPU per GB, while a 64 KiB READ lost up to a quarter (docs/engine.md, "Small
    // transfers").
    if (s.xfer_inline_busy == 0) {
        s.xfer_inline_busy = s.socket_io == "caller" ? 64 * 1024 : 32 * 1024;
    }
    // The progress thread's spin through quiet spells: where a core to spare is likely. On a few
    // cores it would take one from the threads doing the work, as the thread's own stand-back
    // says (src/engine/engine.cc, kBusySpinFor and after).
    if (s.progress_quiet_spin == "auto") s.progress_quiet_spin = cores > 4 ? "on" : "off";
    return s;
}

Settings Settings::effective() const { return with_machine_defaults(*this, usable_cores()); }

StatusOr<Settings> Settings::from_env() {
    Settings settings;
    for (const auto& [name, value] : env_with_prefix(kEnvPrefix)) {
        bool known = false;
        for (const ParamInfo& info : param_table()) {
            if (std::string_view(name).substr(kEnvPrefix.size()) == info.name) known = true;
        }
        if (!known) {
            warn_unknown_once(name);
            continue;
        }
        Status st = settings.set(name, value);
        if (!st.ok()) return st.with_context("invalid environment");
    }
    TCPX_RETURN_IF_ERROR(settings.validate());
    return settings;
}

std::string param_table_markdown() {
    std::string out =
        "| Variable | Type | Default | Range | Meaning |\n"
        "| --- | --- | --- | --- | --- |\n";
    for (const ParamInfo& p : param_table()) {
        std::string type;
        std::string range;
        switch (p.type) {
            case ParamType::kInt:
                type = "integer";
                range = strformat("%lld – %lld", static_cast<long long>(p.min),
                                  static_cast<long long>(p.max));
                break;
            case ParamType::kSize:
                type = "size";
                range = size_default_text(static_cast<uint64_t>(p.min)) + " – " +
                        size_default_text(static_cast<uint64_t>(p.max));
                break;
            case ParamType::kChoice: {
                type = "choice";
                for (const std::string& c : split_trimmed(p.choices, '|')) {
                    if (!range.empty()) range += ", ";
                    range += "`" + c + "`";
                }
                break;
            }
            case ParamType::kString:
                type = "string";
                break;
        }
        // Appended piece by piece: `"`" + std::string(...) + "`"` trips GCC 12's -Wrestrict
        // false positive at -O3.
        std::string def = "(empty)";
        if (!p.default_text.empty()) {
            def.assign(1, '`');
            def.append(p.default_text);
            def.push_back('`');
        }
        out += strformat("| `%.*s%.*s` | %s | %s | %s | %.*s |\n",
                         static_cast<int>(kEnvPrefix.size()), kEnvPrefix.data(),
                         static_cast<int>(p.name.size()), p.name.data(), type.c_str(), def.c_str(),
                         range.c_str(), static_cast<int>(p.doc.size()), p.doc.data());
    }
    return out;
}

}  // namespace tcpx
