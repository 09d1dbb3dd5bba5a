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

#include "bench/harness/report.h"
#include "common/machine.h"
#include "common/params.h"
#include "common/socket.h"
#include "common/strings.h"
#include "common/topology.h"
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
    // Structured data beside the findings, for --json ("kernel", "topology").
    nlohmann::json& data() { return data_; }
    const nlohmann::json& data() const { return data_; }
    bool blocked() const {
        for (const Finding& f : findings_) {
            if (f.blocking) return true;
        }
        return false;
    }

 private:
    std::vector<Finding> findings_;
    nlohmann::json data_ = nlohmann::json::object();
};

// What userspace can tell of devmem TCP, which GPUDirect-TCPX receives into GPU memory with.
// Upstream Linux has it from 6.12 (net/core/devmem.c, CONFIG_NET_DEVMEM); the kernel's build
// configuration says whether it was built in, when /boot/config-<release> is readable. Google's
// A3-high images run kernels older than that with Google's own devmem-TCP patches, which no file
// shows (symbols in /proc/kallsyms differ between patch sets and are hidden from unprivileged
// users), so on those only the plugin itself can tell.
std::string devmem_tcp(const std::string& release, nlohmann::json* out) {
    int major = 0;
    int minor = 0;
    const bool parsed = std::sscanf(release.c_str(), "%d.%d", &major, &minor) == 2;
    const bool upstream = parsed && (major > 6 || (major == 6 && minor >= 12));
    std::string config = "unknown";
    const fs::path config_file = "/boot/config-" + release;
    std::ifstream in(config_file);
    for (std::string line; in && std::getline(in, line);) {
        if (line == "CONFIG_NET_DEVMEM=y") config = "y";
        if (line == "# CONFIG_NET_DEVMEM is not set") config = "not set";
    }
    if (in.is_open() && config == "unknown") config = "absent";  // predates devmem TCP
    (*out)["upstream_devmem_version"] = upstream;
    (*out)["config_net_devmem"] = config;
    std::string value;
    if (config == "y") {
        value = "yes: CONFIG_NET_DEVMEM=y in " + config_file.string();
    } else if (config == "not set") {
        value = "no: CONFIG_NET_DEVMEM is not set in " + config_file.string();
    } else if (upstream) {
        value = "likely: kernel 6.12 or later (upstream devmem TCP); " + config_file.string() +
                " not readable to confirm CONFIG_NET_DEVMEM";
    } else {
        value =
            "not upstream: kernel older than 6.12; Google's GPUDirect-TCPX images carry "
            "their own devmem-TCP patches, which only the plugin can detect";
    }
    (*out)["devmem_tcp"] = value;
    return value;
}

void check_system(Report& r) {
    utsname u{};
    r.add("system", "tcpx-p2p", version_string());
    if (::uname(&u) == 0) {
        nlohmann::json& k = r.data()["kernel"];
        k["release"] = u.release;
        r.add("system", "kernel", std::string(u.sysname) + " " + u.release);
        r.add("system", "devmem TCP", devmem_tcp(u.release, &k));
    }
    r.add("system", "cpus", std::to_string(std::thread::hardware_concurrency()));
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
        // sockets: 64 peers at the defaults need about 64 x (1 + 2 x 9) = 1216. Over an
        // external plugin (Google's), per channel and direction at least two GPU
        // registrations more, each a dma-buf descriptor: a window of the memory moved and a
        // gather buffer's GPU twin (more with more regions or windows: security.md).
        // The plugin's sockets are not the library's (MAX_SOCKETS counts the registrations).
        const bool plugin = !c.net_plugin.empty();
        const uint64_t sockets = static_cast<uint64_t>(c.nsocks) + 1;
        const uint64_t comms = 2 * static_cast<uint64_t>(c.channels);
        const uint64_t per_peer = 1 + comms * (sockets + (plugin ? 2 : 0));
        const uint64_t budget_want = 64 * (1 + comms * (plugin ? 2 : sockets));
        const uint64_t want = 64 * per_peer;
        if (lim.rlim_cur != RLIM_INFINITY && lim.rlim_cur < want) {
            r.problem("limits", "open files (nofile)", value,
                      strformat("fewer than the %llu descriptors 64 peers take at these settings",
                                static_cast<unsigned long long>(want)),
                      "raise it: ulimit -n 65536 (LimitNOFILE= for a systemd unit)", false);
        } else {
            r.add("limits", "open files (nofile)", value);
        }
        // What the library may hold of them (security.md: the socket budget).
        const uint64_t budget = socket_budget();
        const char* set = std::getenv("TCPX_P2P_MAX_SOCKETS");
        const bool explicit_budget = set != nullptr && std::strtoll(set, nullptr, 10) > 0;
        const std::string budget_text =
            std::to_string(budget) + (explicit_budget
                                          ? " (TCPX_P2P_MAX_SOCKETS)"
                                          : " (automatic: 3/4 of the open-files limit)");
        if (budget < budget_want) {
            r.problem("limits", "sockets for tcpx-p2p (MAX_SOCKETS)", budget_text,
                      strformat("fewer than the %llu descriptors 64 peers take at these settings",
                                static_cast<unsigned long long>(budget_want)),
                      "raise the open-files limit, or TCPX_P2P_MAX_SOCKETS", false);
        } else {
            r.add("limits", "sockets for tcpx-p2p (MAX_SOCKETS)", budget_text);
        }
    }
    if (::getrlimit(RLIMIT_MEMLOCK, &lim) == 0) {
        r.add("limits", "locked memory (memlock)",
              limit_text(lim.rlim_cur) + " (hard " + limit_text(lim.rlim_max) + ")");
    }
}

void check_interfaces(Report& r, const Config& c, const topo::Topology& t) {
    nlohmann::json nics = nlohmann::json::array();
    for (const topo::Nic& n : t.nics) {
        std::string value = n.operstate.empty() ? "state unknown" : n.operstate;
        if (n.speed_mbps > 0) value += ", " + std::to_string(n.speed_mbps) + " Mb/s";
        if (n.mtu > 0) value += ", mtu " + std::to_string(n.mtu);
        if (!n.pci_address.empty()) {
            value +=
                ", numa " + (n.numa_node < 0 ? std::string("none") : std::to_string(n.numa_node));
            value += ", pci " + n.pci_address + " (" + n.pci_path + ")";
        } else {
            value += ", no PCI device";
        }
        r.add("interfaces", n.name, value);
        nics.push_back({{"name", n.name},
                        {"operstate", n.operstate},
                        {"speed_mbps", n.speed_mbps},
                        {"mtu", n.mtu},
                        {"numa_node", n.numa_node},
                        {"pci_address", n.pci_address},
                        {"pci_path", n.pci_path}});
    }
    r.data()["topology"]["nics"] = std::move(nics);
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
    if (c.socket_ifname.empty()) names += " (endpoints serving a GPU: see the gpu-nic map)";
    r.add("interfaces", "TCPX_P2P_SOCKET_IFNAME " + spec + " selects", names);
}

// A GPU as the map sees it: its index (CUDA's ordinal when CUDA sees GPUs, else its place in PCI
// order, as nvidia-smi numbers them) and bus id.
struct DoctorGpu {
    int index = -1;
    std::string pci_address;
};

std::vector<DoctorGpu> check_gpus(Report& r, const topo::Topology& t) {
    const int n = cuda::device_count();
    r.add("gpus", "usable GPUs",
          n > 0 ? std::to_string(n)
                : "0 (no driver or GPU, or a build without the CUDA parts): host memory only");
    std::vector<DoctorGpu> gpus;
    if (n > 0) {
        for (int i = 0; i < n; ++i) {
            gpus.push_back({i, topo::normalize_pci_address(cuda::device().pci_bus_id(i))});
        }
    } else {
        for (size_t i = 0; i < t.gpus.size(); ++i) {
            gpus.push_back({static_cast<int>(i), t.gpus[i].pci_address});
        }
    }
    nlohmann::json list = nlohmann::json::array();
    for (const DoctorGpu& g : gpus) {
        const topo::Gpu* known = nullptr;
        for (const topo::Gpu& s : t.gpus) {
            if (s.pci_address == g.pci_address) known = &s;
        }
        std::string value = g.pci_address.empty() ? "pci unknown" : "pci " + g.pci_address;
        if (known != nullptr) {
            value += ", numa " + (known->numa_node < 0 ? std::string("none")
                                                       : std::to_string(known->numa_node));
            if (!known->pci_path.empty()) value += " (" + known->pci_path + ")";
        } else if (!g.pci_address.empty()) {
            value += ", not found in sysfs";
        }
        r.add("gpus", strformat("GPU %d%s", g.index, n > 0 ? "" : " (sysfs)"), value);
        list.push_back({{"index", g.index},
                        {"pci_address", g.pci_address},
                        {"numa_node", known != nullptr ? known->numa_node : -1},
                        {"pci_path", known != nullptr ? known->pci_path : std::string()},
                        {"source", n > 0 ? "cuda" : "sysfs"}});
    }
    r.data()["topology"]["gpus"] = std::move(list);
    return gpus;
}

// The NIC(s) each GPU's endpoints use (net/nic_select.h): through the socket transport unless
// SOCKET_IFNAME is set, or the plugin's device (its pciPath as the probe listed it).
void check_gpu_nic_map(Report& r, const Config& c, const topo::Topology& t,
                       const std::vector<DoctorGpu>& gpus,
                       const std::vector<topo::NetDevice>& plugin_devices) {
    const char* section = "gpu-nic map";
    r.add(section, "TCPX_P2P_GPU_NIC_MAP",
          c.gpu_nic_map.empty() ? "(unset): by PCI distance" : c.gpu_nic_map);
    r.add(section, "TCPX_P2P_SYSFS_ROOT", c.sysfs_root);
    nlohmann::json list = nlohmann::json::array();
    if (gpus.empty()) r.add(section, "GPUs", "none: endpoints serve host memory only");
    const bool plugin = !c.net_plugin.empty();
    if (!plugin && !c.socket_ifname.empty()) {
        r.add(section, "socket transport",
              "TCPX_P2P_SOCKET_IFNAME is set: every endpoint uses its interfaces, not this map");
    }
    int pci_nics = 0;
    for (const topo::Nic& n : t.nics) pci_nics += n.pci_address.empty() ? 0 : 1;
    for (const DoctorGpu& g : gpus) {
        const std::string item = g.pci_address.empty()
                                     ? strformat("GPU %d", g.index)
                                     : strformat("GPU %d (%s)", g.index, g.pci_address.c_str());
        topo::NicChoice choice;
        int dev = -1;
        if (plugin && !plugin_devices.empty()) {
            auto d = topo::device_for_gpu(t, plugin_devices, c.gpu_nic_map, g.index, g.pci_address);
            if (!d.ok()) {
                r.problem(section, item, "no device", d.status().to_string(),
                          "name one of the plugin's devices in TCPX_P2P_GPU_NIC_MAP", true);
                continue;
            }
            choice = d->choice;
            dev = d->dev;
        } else {
            auto n = topo::nics_for_gpu(t, c.gpu_nic_map, g.index, g.pci_address);
            if (!n.ok()) continue;  // an invalid map is reported with the settings
            choice = *n;
        }
        std::string value = topo::describe(choice);
        value = value.substr(value.find(" -> ") + 4);
        if (plugin) value += dev >= 0 ? strformat(": plugin device %d", dev) : ": plugin device 0";
        nlohmann::json nics = nlohmann::json::array();
        for (const topo::Nic& n : choice.nics) nics.push_back(n.name);
        list.push_back(
            {{"gpu", g.index},
             {"gpu_pci", g.pci_address},
             {"nics", nics},
             {"source", choice.from_map       ? "map"
                        : choice.nics.empty() ? "none"
                                              : "sysfs"},
             {"distance",
              choice.nics.empty() || choice.from_map ? "" : topo::distance_name(choice.distance)},
             {"plugin_device", dev}});
        // A map entry naming an interface this host does not have stops that GPU's endpoints
        // (socket transport); one sysfs cannot place is only a warning.
        std::string missing;
        for (const topo::Nic& n : choice.nics) {
            if (choice.from_map && n.operstate.empty() && n.pci_address.empty()) {
                missing += (missing.empty() ? "" : ", ") + n.name;
            }
        }
        if (!missing.empty() && !plugin && c.socket_ifname.empty()) {
            r.problem(section, item, value,
                      "TCPX_P2P_GPU_NIC_MAP names " + missing + ", which this host does not have",
                      "name this host's interfaces in TCPX_P2P_GPU_NIC_MAP (see the interfaces "
                      "above)",
                      true);
        } else if (choice.nics.empty() && pci_nics > 1) {
            r.problem(
                section, item, value,
                "no NIC could be placed near this GPU: its endpoints use the default "
                "interface or device 0",
                "name its NICs in TCPX_P2P_GPU_NIC_MAP (e.g. " + std::to_string(g.index) + ":eth1)",
                false);
        } else {
            r.add(section, item, value);
        }
    }
    r.data()["topology"]["gpu_nic_map"] = std::move(list);
}

// Google's receive-datapath manager (RxDM) serves Google's TCPX plugin over UNIX sockets under
// NCCL_GPUDIRECTTCPX_UNIX_CLIENT_PREFIX (default /tmp); its rule manager is rx_rule_manager.
void check_rxdm_socket(Report& r) {
    const char* prefix = std::getenv("NCCL_GPUDIRECTTCPX_UNIX_CLIENT_PREFIX");
    const std::string dir = prefix != nullptr && prefix[0] != '\0' ? prefix : "/tmp";
    const std::string path = dir + "/rx_rule_manager";
    std::error_code ec;
    const fs::file_status st = fs::status(path, ec);
    std::string value;
    if (!ec && fs::is_socket(st)) {
        value = "there (" + path + ")";
    } else if (!ec && fs::exists(st)) {
        value = path + " is not a UNIX socket";
    } else {
        value = "absent (" + path + "): needed only by Google's TCPX plugin";
    }
    r.add("gpudirect-tcpx", "RxDM socket", value);
    r.data()["rxdm_socket"] = {{"path", path}, {"present", !ec && fs::is_socket(st)}};
}

// The plugin, probed in a child process exactly as an endpoint would before loading it; its
// devices (name and pciPath) when it loads.
std::vector<topo::NetDevice> check_plugin(Report& r, const Config& c) {
    std::vector<topo::NetDevice> devices;
    const char* ld = std::getenv("LD_LIBRARY_PATH");
    r.add("plugin", "LD_LIBRARY_PATH", ld != nullptr ? ld : "(unset)");
    if (c.net_plugin.empty()) {
        r.add("plugin", "TCPX_P2P_NET_PLUGIN", "(unset): the built-in socket transport");
        return devices;
    }
    r.add("plugin", "TCPX_P2P_NET_PLUGIN", c.net_plugin);
    // dlopen's rule: a name with a slash is a path, used as it is; a bare file name is searched
    // for in LD_LIBRARY_PATH, then the ld.so cache (/etc/ld.so.conf), then /lib and /usr/lib.
    r.add("plugin", "search",
          c.net_plugin.find('/') != std::string::npos
              ? "a path: loaded as given"
              : "a file name: searched in LD_LIBRARY_PATH, then the ld.so cache (ldconfig -p), "
                "then /lib and /usr/lib");
    auto probe = net::find_plugin_probe(c);
    if (!probe.ok()) {
        r.problem("plugin", "probe", "not found", probe.status().to_string(),
                  "set TCPX_P2P_PLUGIN_PROBE_PATH to tcpx-p2p-probe (installed in libexec/)", true);
        return devices;
    }
    auto out = net::run_plugin_probe(*probe, c.net_plugin, c.plugin_probe_timeout_ms);
    if (!out.ok()) {
        r.problem("plugin", "probe", "failed", out.status().to_string(),
                  "run the plugin's init by hand (NCCL_DEBUG=INFO) and fix what it reports", true);
        return devices;
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
        } else if (loaded && line.rfind("file: ", 0) == 0) {
            r.add("plugin", "loaded from", line.substr(6));
        } else if (line.rfind("dev ", 0) == 0 && line.find(": ") != std::string::npos) {
            // "dev N: NAME, pci PATH, speed ..."
            const std::string rest = line.substr(line.find(": ") + 2);
            r.add("plugin", line.substr(0, line.find(':')), rest);
            const size_t pci = rest.find(", pci ");
            const size_t speed = rest.find(", speed ");
            topo::NetDevice d;
            d.name = rest.substr(0, pci);
            if (pci != std::string::npos && speed != std::string::npos && speed > pci) {
                d.pci_path = rest.substr(pci + 6, speed - pci - 6);
                if (d.pci_path == "(null)") d.pci_path.clear();
            }
            devices.push_back(std::move(d));
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
        return devices;
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
    return devices;
}

// What Google's plugin makes of its variables, set or not (shared/reference/tcpx-plugin.md).
void check_tcpx_environment(Report& r, const topo::Topology& t) {
    const char* section = "gpudirect-tcpx";
    auto names_with_places = [&](const std::string& list) {
        std::string out;
        for (const std::string& name : split_trimmed(list, ',')) {
            const topo::Nic* nic = nullptr;
            for (const topo::Nic& n : t.nics) {
                if (n.name == name) nic = &n;
            }
            out += (out.empty() ? "" : "; ") + name + ": ";
            if (nic == nullptr) {
                out += "no such interface";
            } else if (nic->pci_address.empty()) {
                out += "no PCI device";
            } else {
                out += nic->pci_address + ", numa " +
                       (nic->numa_node < 0 ? std::string("none") : std::to_string(nic->numa_node));
            }
        }
        return out;
    };
    const char* ifname = std::getenv("NCCL_GPUDIRECTTCPX_SOCKET_IFNAME");
    r.add(section, "NCCL_GPUDIRECTTCPX_SOCKET_IFNAME",
          ifname != nullptr ? std::string(ifname) + " (" + names_with_places(ifname) + ")"
                            : "(unset): the plugin uses every interface but lo and docker*");
    const char* ctrl = std::getenv("NCCL_GPUDIRECTTCPX_CTRL_DEV");
    r.add(section, "NCCL_GPUDIRECTTCPX_CTRL_DEV",
          ctrl != nullptr ? std::string(ctrl) + " (" + names_with_places(ctrl) + ")" : "(unset)");
    const char* prefix = std::getenv("NCCL_GPUDIRECTTCPX_UNIX_CLIENT_PREFIX");
    r.add(section, "NCCL_GPUDIRECTTCPX_UNIX_CLIENT_PREFIX",
          prefix != nullptr ? prefix : "(unset): /tmp");
    // The defaults the loader sets for Google's plugin when the user has not.
    for (const std::string& line : split_trimmed(net::tcpx_env_defaults(), '\n')) {
        const size_t eq = line.find('=');
        if (eq == std::string::npos) continue;
        const std::string name = line.substr(0, eq);
        const char* v = std::getenv(name.c_str());
        r.add(section, name,
              v != nullptr
                  ? std::string(v)
                  : "(unset): tcpx-p2p sets " + line.substr(eq + 1) + " for Google's plugin");
    }
    const char* nccl_ifname = std::getenv("NCCL_SOCKET_IFNAME");
    if (nccl_ifname != nullptr) {
        r.add(section, "NCCL_SOCKET_IFNAME",
              std::string(nccl_ifname) +
                  " (NCCL's own sockets; tcpx-p2p reads TCPX_P2P_SOCKET_IFNAME instead)");
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

// Every text goes through printable(): values and names come from the environment, sysfs and
// the plugin's files, anyone's bytes, and a terminal acts on the control sequences among them.
void print_table(const Report& r) {
    using bench::printable;
    std::string section;
    int problems = 0;
    for (const Finding& f : r.findings()) {
        if (f.section != section) {
            std::printf("%s%s\n", section.empty() ? "" : "\n", printable(f.section).c_str());
            section = f.section;
        }
        std::printf("  %-34s %s\n", printable(f.item).c_str(), printable(f.value).c_str());
        if (!f.problem.empty()) {
            ++problems;
            std::printf("  %-34s %s: %s\n  %-34s fix: %s\n", "", f.blocking ? "PROBLEM" : "warning",
                        printable(f.problem).c_str(), "", printable(f.fix).c_str());
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
    json out = r.data();
    out["checks"] = std::move(checks);
    out["problems"] = problems;
    out["blocked"] = r.blocked();
    // The environment's values are anyone's bytes: what is not UTF-8 comes out as U+FFFD
    // (nlohmann::json would throw on it).
    std::printf("%s\n", bench::json_text(out, 2).c_str());
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
    const topo::Topology t = topo::read_topology(c.sysfs_root);
    check_interfaces(r, c, t);
    const std::vector<DoctorGpu> gpus = check_gpus(r, t);
    const std::vector<topo::NetDevice> plugin_devices = check_plugin(r, c);
    check_gpu_nic_map(r, c, t, gpus, plugin_devices);
    check_rxdm_socket(r);
    check_tcpx_environment(r, t);
    check_environment(r);
    if (options.json) {
        print_json(r);
    } else {
        print_table(r);
    }
    return r.blocked() ? 1 : 0;
}

}  // namespace tcpx::tools
