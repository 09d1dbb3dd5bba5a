#include "bench/harness/report.h"

#include <unistd.h>

#include <cstdio>
#include <nlohmann/json.hpp>

#include "common/strings.h"

namespace tcpx::bench {

Progress::Progress(bool enabled, size_t steps)
    : enabled_(enabled && ::isatty(STDERR_FILENO)), steps_(steps) {}

void Progress::next(const std::string& what) {
    ++step_;
    if (!enabled_) return;
    std::fprintf(stderr, "\r\033[K[%zu/%zu] %s", step_, steps_, what.c_str());
    std::fflush(stderr);
}

void Progress::clear() {
    if (enabled_) std::fprintf(stderr, "\r\033[K");
}

std::string ratio(double a, double b) {
    if (b <= 0 || a <= 0) return "-";
    return strformat("%.2fx", a / b);
}

std::string cpu_cell(const Throughput& t) {
    const double v = cpu_per_gb(t);
    return v > 0 ? strformat("%.3f", v) : std::string("-");
}

std::string gbps_text(double gbps) {
    // Two decimals, or two significant digits below 0.1: a slow run (a loaded machine, 4 KiB
    // transfers) still shows what it moved instead of 0.00.
    return strformat(gbps >= 0.095 || gbps <= 0 ? "%.2f" : "%.2g", gbps);
}

std::string gbps_cell(const Throughput& t) { return t.iters ? gbps_text(t.gbps) : "-"; }

std::string usecs_cell(double us, uint64_t iters) {
    return iters ? strformat("%.1f us", us) : std::string("-");
}

std::string table_line(const std::vector<int>& gaps, const std::vector<int>& widths,
                       const std::vector<std::string>& cells) {
    std::string line;
    for (size_t i = 0; i < cells.size(); ++i) {
        line += strformat("%*s%*s", gaps[i], "", widths[i], cells[i].c_str());
    }
    line.erase(line.find_last_not_of(' ') + 1);
    return line;
}

std::string printable(std::string_view text) {
    std::string out;
    out.reserve(text.size());
    for (size_t i = 0; i < text.size(); ++i) {
        const auto u = static_cast<unsigned char>(text[i]);
        // C0 controls and DEL; and C1 controls as UTF-8 writes them (C2 80 to C2 9F: a
        // terminal takes C2 9B for CSI, as ESC [), both bytes.
        const bool c1 = u == 0xc2 && i + 1 < text.size() &&
                        (static_cast<unsigned char>(text[i + 1]) & 0xe0) == 0x80;
        if (u < 0x20 || u == 0x7f) {
            out += strformat("\\x%02x", u);
        } else if (c1) {
            out += strformat("\\xc2\\x%02x", static_cast<unsigned char>(text[i + 1]));
            ++i;
        } else {
            out += text[i];
        }
    }
    return out;
}

std::string json_text(const nlohmann::json& j, int indent) {
    return j.dump(indent, ' ', false, nlohmann::json::error_handler_t::replace);
}

nlohmann::json throughput_json(const Throughput& t, const char* count_name, uint64_t count,
                               bool cpu) {
    nlohmann::json j = {{"gbps", t.gbps}, {count_name, count}, {"seconds", t.seconds}};
    if (cpu) {
        j["cpu_seconds"] = t.cpu_seconds;
        j["cpu_seconds_target_process"] = t.peer_cpu_seconds;
        j["cpu_s_per_gb"] = cpu_per_gb(t);
    }
    return j;
}

nlohmann::json latency_json(const Latency& l) {
    return {{"p50_us", l.p50_us}, {"p99_us", l.p99_us}, {"mean_us", l.mean_us}, {"iters", l.iters}};
}

}  // namespace tcpx::bench
