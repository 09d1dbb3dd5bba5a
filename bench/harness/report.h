// How the benchmarks report: the progress line while they run, the cells and columns of their
// tables, the JSON of a throughput or latency figure. The drivers own their header lines (what
// ran: they alone know it); the figures beneath are laid out here, the same way in every bench.
#pragma once

#include <cstddef>
#include <functional>
#include <nlohmann/json_fwd.hpp>  // the .cc files that build JSON include json.hpp
#include <string>
#include <string_view>
#include <vector>

#include "bench/harness/measure.h"

namespace tcpx::bench {

// "[step/steps] what" on stderr, when enabled and stderr is a terminal.
class Progress {
 public:
    explicit Progress(bool enabled, size_t steps = 0);
    // The next step: "[step/steps] what".
    void next(const std::string& what);
    // Steps that will not run (a backend that was skipped).
    void skip(size_t steps) { step_ += steps; }
    void clear();

 private:
    bool enabled_;
    size_t steps_;
    size_t step_ = 0;
};

// --- cells -------------------------------------------------------------------------------------

// "1.23x", or "-" when either side is missing.
std::string ratio(double a, double b);
// "0.123" CPU s/GB, or "-" where not measured.
std::string cpu_cell(const Throughput& t);
// "1.23" GB/s, or "-" where not measured.
std::string gbps_cell(const Throughput& t);
// A figure in GB/s as gbps_cell() writes it (one direction's, one peer's).
std::string gbps_text(double gbps);
// "12.3 us", or "-" where not measured (no iterations).
std::string usecs_cell(double us, uint64_t iters);
// "" or "s": "1 channel", "2 channels".
inline const char* plural(long long n) { return n == 1 ? "" : "s"; }

// --- tables ------------------------------------------------------------------------------------

// A column of a table: `gap` spaces, then the cell in `width` characters, right-aligned (a
// negative width: left-aligned, as printf's).
template <typename Row>
struct Column {
    int gap;
    int width;
    std::string head;
    std::function<std::string(const Row&)> cell;
};

// One line of cells laid out as `columns` say, without trailing blanks.
std::string table_line(const std::vector<int>& gaps, const std::vector<int>& widths,
                       const std::vector<std::string>& cells);

template <typename Row>
std::string table_head(const std::vector<Column<Row>>& cols) {
    std::vector<int> gaps, widths;
    std::vector<std::string> cells;
    for (const auto& c : cols) {
        gaps.push_back(c.gap);
        widths.push_back(c.width);
        cells.push_back(c.head);
    }
    return table_line(gaps, widths, cells);
}

template <typename Row>
std::string table_row(const std::vector<Column<Row>>& cols, const Row& row) {
    std::vector<int> gaps, widths;
    std::vector<std::string> cells;
    for (const auto& c : cols) {
        gaps.push_back(c.gap);
        widths.push_back(c.width);
        cells.push_back(c.cell(row));
    }
    return table_line(gaps, widths, cells);
}

// `text` with its control characters (and DEL) written \xNN: text from a peer (a target's
// greeting) or the environment, on a terminal.
std::string printable(std::string_view text);

// --- JSON --------------------------------------------------------------------------------------

// `j` as text (`indent` as nlohmann::json::dump's), never throwing: bytes of a string that are not
// UTF-8 (a peer's text, the environment's) come out as U+FFFD.
std::string json_text(const nlohmann::json& j, int indent = -1);

// {"gbps", `count_name`: count, "seconds"} and, with `cpu`, "cpu_seconds",
// "cpu_seconds_target_process" and "cpu_s_per_gb".
nlohmann::json throughput_json(const Throughput& t, const char* count_name, uint64_t count,
                               bool cpu = true);
// {"p50_us", "p99_us", "mean_us", "iters"}
nlohmann::json latency_json(const Latency& l);

}  // namespace tcpx::bench
