#include "tools/doctor.h"

#include <sys/resource.h>
#include <sys/utsname.h>

#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "common/machine.h"
#include "common/params.h"
#include "common/socket.h"
#include "common/strings.h"
#include "cuda/device.h"
#include "net/plugin/plugin_loader.h"
#include "net/plugin/plugin_probe.h"
#include "tcpx/version.h"

extern char** environ;

namespace tcpx::tools {
namespace {

namespace fs = std::filesystem;

// One line of the report: a value, and a problem with its fix when there is one.
struct Finding {
    std::string section;
    std::string item;
    std::string value;
    std::string problem;  // empty: fine
    std::string fix;
    bool blocking = false;  // it would stop a run
};

class Report {
 public:
    void add(std::string section, std::string item, std::string value) {
        findings_.push_back(
            Finding{std::move(section), std::move(item), std::move(value), {}, {}, false});
    }
    void problem(std::string section, std::string item, std::string value, std::string problem,
                 std::string fix, bool blocking) {
        findings_.push_back(Finding{std::move(section), std::move(item), std::move(value),
                                    std::move(problem), std::move(fix), blocking});
    }
    const std::vector<Finding>& findings() const { return findings_; }
    bool blocked() const {
        for (const Finding& f : findings_) {
            if (f.blocking) return true;
        }
        return false;
    }

 private:
    std::vector<Finding> findings_;
};

std::string read_line(const fs::path& path) {
    std::ifstream in(path);
    std::string line;
    if (!in || !std::getline(in, line)) return "";
    return line;
}

void check_system(Report& r) {
    utsname u{};
    r.add("system", "tcpx-p2p", version_string());
    if (::uname(&u) == 0) r.add("system", "kernel", std::string(u.sysname) + " " + u.release);
    r.add("system", "cpus", std::to_string(std::thread::hardware_concurrency()));
}

// "0000:06:00.0": domain, bus, device, function.
bool is_pci_address(const std::string& s) {
    if (s.size() != 12 || s[4] != ':' || s[7] != ':' || s[10] != '.') return false;
    for (size_t i : {0, 1, 2, 3, 5, 6, 8, 9, 11}) {
        if (std::isxdigit(static_cast<unsigned char>(s[i])) == 0) return false;
    }
    return true;
}

std::string limit_text(rlim_t v) {
    return v == RLIM_INFINITY ? "unlimited" : std::to_string(static_cast<unsigned long long>(v));
}

void check_limits(Report& r, const Config& c) {
    rlimit lim{};
    if (::getrlimit(RLIMIT_NOFILE, &lim) == 0) {
        const std::string value =
            limit_text(lim.rlim_cur) + " (hard " + limit_text(lim.rlim_max) + ")";
        // A peer costs a control socket and, per channel and direction, a comm of NSOCKS + 1
        // sockets: 64 peers at the defaults need about 64 x (1 + 2 x 9) = 1216.
        const uint64_t per_peer =
            1 + 2 * static_cast<uint64_t>(c.channels) * (static_cast<uint64_t>(c.nsocks) + 1);
        const uint64_t want = 64 * per_peer;
        if (lim.rlim_cur != RLIM_INFINITY && lim.rlim_cur < want) {
            r.problem("limits", "open files (nofile)", value,
                      strformat("fewer than the %llu descriptors 64 peers take at these settings",
                                static_cast<unsigned long long>(want)),
                      "raise it: ulimit -n 65536 (LimitNOFILE= for a systemd unit)", false);
        } else {
            r.add("limits", "open files (nofile)", value);
        }
    }
    if (::getrlimit(RLIMIT_MEMLOCK, &lim) == 0) {
        r.add("limits", "locked memory (memlock)",
              limit_text(lim.rlim_cur) + " (hard " + limit_text(lim.rlim_max) + ")");
    }
}

void check_interfaces(Report& r, const Config& c) {
    std::error_code ec;
    for (const auto& entry : fs::directory_iterator("/sys/class/net", ec)) {
        const fs::path dir = entry.path();
        const std::string name = dir.filename().string();
        std::string value = read_line(dir / "operstate");
        const std::string speed = read_line(dir / "speed");
        if (!speed.empty() && speed[0] != '-') value += ", " + speed + " Mb/s";
        value += ", mtu " + read_line(dir / "mtu");
        // The PCI function the interface hangs off (a virtio NIC's device is a child of it): its
        // address and NUMA node, as the GPU-to-NIC choice reads them.
        std::error_code ec2;
        for (fs::path d = fs::canonical(dir / "device", ec2); !ec2 && d.has_filename();
             d = d.parent_path()) {
            if (is_pci_address(d.filename().string())) {
                const std::string numa = read_line(d / "numa_node");
                value += ", pci " + d.filename().string() + ", numa " +
                         (numa.empty() || numa == "-1" ? "none" : numa);
                break;
            }
        }
        r.add("interfaces", name, value);
    }
    AddressFamily family = AddressFamily::kAny;
    parse_address_family(c.socket_family, &family);
    const std::string spec = c.socket_ifname.empty() ? "(any)" : c.socket_ifname;
    auto chosen = find_interfaces(c.socket_ifname, family);
    if (!chosen.ok() || chosen->empty()) {
        r.problem("interfaces", "TCPX_P2P_SOCKET_IFNAME " + spec, "none usable",
                  chosen.ok() ? "no interface that is up matches" : chosen.status().to_string(),
                  "set TCPX_P2P_SOCKET_IFNAME to an interface that is up (e.g. eth1, or =lo for "
                  "one host)",
                  true);
        return;
    }
    std::string names;
    for (const NetInterface& i : *chosen) {
        names += (names.empty() ? "" : ", ") + i.name + " " + i.address.to_string();
    }
    r.add("interfaces", "TCPX_P2P_SOCKET_IFNAME " + spec + " selects", names);
}

void check_gpus(Report& r) {
    const int n = cuda::device_count();
    r.add("gpus", "usable GPUs",
          n > 0 ? std::to_string(n)
                : "0 (no driver or GPU, or a build without the CUDA parts): host memory only");
}

// The plugin, probed in a child process exactly as an endpoint would before loading it.
void check_plugin(Report& r, const Config& c) {
    const char* ld = std::getenv("LD_LIBRARY_PATH");
    r.add("plugin", "LD_LIBRARY_PATH", ld != nullptr ? ld : "(unset)");
    if (c.net_plugin.empty()) {
        r.add("plugin", "TCPX_P2P_NET_PLUGIN", "(unset): the built-in socket transport");
        return;
    }
    r.add("plugin", "TCPX_P2P_NET_PLUGIN", c.net_plugin);
    auto probe = net::find_plugin_probe(c);
    if (!probe.ok()) {
        r.problem("plugin", "probe", "not found", probe.status().to_string(),
                  "set TCPX_P2P_PLUGIN_PROBE_PATH to tcpx-p2p-probe (installed in libexec/)", true);
        return;
    }
    auto out = net::run_plugin_probe(*probe, c.net_plugin, c.plugin_probe_timeout_ms);
    if (!out.ok()) {
        r.problem("plugin", "probe", "failed", out.status().to_string(),
                  "run the plugin's init by hand (NCCL_DEBUG=INFO) and fix what it reports", true);
        return;
    }
    // Loaded: "plugin P: table T, ncclNet vN, D devices" and a line per device ("dev N: ...");
    // refused cleanly: "tcpx-p2p-probe: why". (Lines come trimmed.)
    std::vector<std::string> lines = split_trimmed(*out, '\n');
    std::string table;
    bool loaded = false;
    bool refused = false;
    for (const std::string& line : lines) {
        if (line.rfind("plugin ", 0) == 0) {
            loaded = true;
            const size_t at = line.find(": table ");
            if (at != std::string::npos) {
                table = line.substr(at + 8, line.find(',', at) - (at + 8));
            }
            r.add("plugin", "loads", line.substr(line.find(": ") + 2));
        } else if (line.rfind("dev ", 0) == 0 && line.find(": ") != std::string::npos) {
            r.add("plugin", line.substr(0, line.find(':')), line.substr(line.find(": ") + 2));
        } else if (!loaded && line.rfind("tcpx-p2p-probe: ", 0) == 0) {
            refused = true;
            r.problem("plugin", "loads", "no", line.substr(16),
                      "check the path, the plugin's dependencies (ldd) and its environment", true);
        }
    }
    if (!loaded) {
        if (!refused) {
            r.problem("plugin", "loads", "no", "the probe said: " + *out,
                      "check the path and the plugin's dependencies (ldd)", true);
        }
        return;
    }
    Status rxdm = net::check_rxdm_running(table.c_str(),
                                          std::getenv("NCCL_GPUDIRECTTCPX_UNIX_CLIENT_PREFIX"));
    if (!rxdm.ok()) {
        r.problem("plugin", "receive-datapath manager (RxDM)", "missing", rxdm.to_string(),
                  "start Google's RxDM container (tcpgpudmarxd) on this host (docs/plugins.md)",
                  true);
    } else if (table == "GPUDirectTCPX_v7") {  // the table check_rxdm_running checks
        r.add("plugin", "receive-datapath manager (RxDM)", "its socket is there");
    }
}

// The variables that steer tcpx-p2p and the plugins; secrets are never printed.
void check_environment(Report& r) {
    for (char** e = environ; *e != nullptr; ++e) {
        const std::string_view var(*e);
        if (var.rfind("TCPX_P2P_", 0) != 0 && var.rfind("NCCL_", 0) != 0) continue;
        const size_t eq = var.find('=');
        const std::string name(var.substr(0, eq));
        const std::string value(eq == std::string_view::npos ? "" : var.substr(eq + 1));
        if (name.find("SECRET") != std::string::npos) {
            r.add("environment", name, strformat("(set, %zu characters)", value.size()));
        } else {
            r.add("environment", name, value);
        }
    }
}

void print_table(const Report& r) {
    std::string section;
    int problems = 0;
    for (const Finding& f : r.findings()) {
        if (f.section != section) {
            std::printf("%s%s\n", section.empty() ? "" : "\n", f.section.c_str());
            section = f.section;
        }
        std::printf("  %-34s %s\n", f.item.c_str(), f.value.c_str());
        if (!f.problem.empty()) {
            ++problems;
            std::printf("  %-34s %s: %s\n  %-34s fix: %s\n", "", f.blocking ? "PROBLEM" : "warning",
                        f.problem.c_str(), "", f.fix.c_str());
        }
    }
    std::printf("\n%s\n", r.blocked()    ? "doctor: something above would stop a run"
                          : problems > 0 ? "doctor: nothing would stop a run (see the warnings)"
                                         : "doctor: nothing would stop a run");
}

void print_json(const Report& r) {
    using nlohmann::json;
    json checks = json::array();
    int problems = 0;
    for (const Finding& f : r.findings()) {
        json j = {{"section", f.section}, {"item", f.item}, {"value", f.value}};
        if (!f.problem.empty()) {
            ++problems;
            j["problem"] = f.problem;
            j["fix"] = f.fix;
            j["blocking"] = f.blocking;
        }
        checks.push_back(std::move(j));
    }
    const json out = {{"checks", checks}, {"problems", problems}, {"blocked", r.blocked()}};
    std::printf("%s\n", out.dump(2).c_str());
}

}  // namespace

int run_doctor(const DoctorOptions& options) {
    Report r;
    check_system(r);
    auto config = Config::from_env();
    Status valid = config.ok() ? config->validate() : config.status();
    if (!valid.ok()) {
        r.problem("settings", "TCPX_P2P_*", "invalid", valid.to_string(),
                  "correct or unset the variable named (tcpx-p2p params lists every setting)",
                  true);
    } else {
        r.add("settings", "TCPX_P2P_*", "valid");
    }
    // As the endpoints will run: automatic values chosen for this machine's cores.
    const Config c = (config.ok() ? *config : Config()).effective();
    r.add("settings", "as run here",
          strformat("%d usable cores: NSOCKS %lld, IO_THREADS %lld, CHANNELS %lld", usable_cores(),
                    static_cast<long long>(c.nsocks), static_cast<long long>(c.io_threads),
                    static_cast<long long>(c.channels)));
    check_limits(r, c);
    check_interfaces(r, c);
    check_gpus(r);
    check_plugin(r, c);
    check_environment(r);
    if (options.json) {
        print_json(r);
    } else {
        print_table(r);
    }
    return r.blocked() ? 1 : 0;
}

}  // namespace tcpx::tools
