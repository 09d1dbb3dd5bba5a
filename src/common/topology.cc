#include "common/topology.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <filesystem>
#include <set>

#include "common/status_util.h"
#include "common/strings.h"

namespace tcpx::topo {
namespace {

namespace fs = std::filesystem;

constexpr std::string_view kMapParam = "TCPX_P2P_GPU_NIC_MAP";
constexpr int kMaxGpuIndex = 1023;  // TCPX_P2P_GPU_INDEX's range

// The first line of a small sysfs attribute, trimmed; "" when it cannot be read. SYSFS_ROOT may
// point anywhere (a fixture tree in tests), so nothing is assumed of what lies there: only a
// regular file is read (a FIFO would block the open, a link to /dev/zero would never end), at
// most kMaxAttribute bytes of it.
std::string read_line(const fs::path& path) {
    constexpr size_t kMaxAttribute = 4096;
    const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
    if (fd < 0) return "";
    struct stat st {};
    std::string text;
    if (::fstat(fd, &st) == 0 && S_ISREG(st.st_mode)) {
        char buf[kMaxAttribute];
        size_t got = 0;
        while (got < sizeof(buf)) {
            const ssize_t n = ::read(fd, buf + got, sizeof(buf) - got);
            if (n < 0 && errno == EINTR) continue;
            if (n <= 0) break;
            got += static_cast<size_t>(n);
        }
        text.assign(buf, got);
    }
    ::close(fd);
    const size_t eol = text.find('\n');
    if (eol != std::string::npos) text.resize(eol);
    return std::string(trim(text));
}

// An integer file (numa_node, speed, mtu); -1 when missing or garbled.
int read_int(const fs::path& path) {
    const std::string text = read_line(path);
    int v = -1;
    auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
    if (text.empty() || ec != std::errc() || end != text.data() + text.size()) return -1;
    return v < 0 ? -1 : v;
}

bool is_hex(std::string_view s) {
    return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) {
        return std::isxdigit(static_cast<unsigned char>(c)) != 0;
    });
}

// "pci0000:80": a root complex (host bridge) directory under /sys/devices.
bool is_root_complex(std::string_view s) {
    return s.size() == 10 && s.substr(0, 3) == "pci" && s[7] == ':' && is_hex(s.substr(3, 4)) &&
           is_hex(s.substr(8, 2));
}

bool is_pci_address(std::string_view s) { return normalize_pci_address(s) == s; }

// The chain of a PCI device's sysfs path from its root complex down: ["pci0000:80",
// "0000:80:01.0", ..., "0000:85:00.0"]. Components past the last PCI device (a virtio NIC's
// "virtio0") are dropped. Empty when the path holds no root complex.
std::vector<std::string> pci_chain(std::string_view path) {
    std::vector<std::string> chain;
    bool in = false;
    for (const std::string& part : split_trimmed(path, '/')) {
        if (!in && is_root_complex(part)) in = true;
        if (in) chain.push_back(part);
    }
    while (chain.size() > 1 && !is_pci_address(chain.back())) chain.pop_back();
    if (chain.size() < 2) chain.clear();
    return chain;
}

// eth2 before eth10.
bool natural_less(const std::string& a, const std::string& b) {
    size_t i = 0;
    size_t j = 0;
    while (i < a.size() && j < b.size()) {
        const bool da = std::isdigit(static_cast<unsigned char>(a[i])) != 0;
        const bool db = std::isdigit(static_cast<unsigned char>(b[j])) != 0;
        if (da && db) {
            size_t ie = i;
            size_t je = j;
            while (ie < a.size() && std::isdigit(static_cast<unsigned char>(a[ie])) != 0) ++ie;
            while (je < b.size() && std::isdigit(static_cast<unsigned char>(b[je])) != 0) ++je;
            // Compare the numbers by length (without leading zeros), then digit by digit.
            std::string_view na = std::string_view(a).substr(i, ie - i);
            std::string_view nb = std::string_view(b).substr(j, je - j);
            while (na.size() > 1 && na[0] == '0') na.remove_prefix(1);
            while (nb.size() > 1 && nb[0] == '0') nb.remove_prefix(1);
            if (na.size() != nb.size()) return na.size() < nb.size();
            if (na != nb) return na < nb;
            i = ie;
            j = je;
        } else {
            if (a[i] != b[j]) return a[i] < b[j];
            ++i;
            ++j;
        }
    }
    return a.size() - i < b.size() - j;
}

std::string canonical_or_empty(const fs::path& p) {
    std::error_code ec;
    fs::path c = fs::canonical(p, ec);
    return ec ? std::string() : c.string();
}

// A PCI device's address from its path: the last component of its chain.
std::string address_of(std::string_view path) {
    std::vector<std::string> chain = pci_chain(path);
    return chain.empty() ? std::string() : chain.back();
}

Status map_error(size_t entry, std::string_view text, const std::string& why) {
    return invalid_argument(strformat("%.*s: entry %zu '%.*s': %s",
                                      static_cast<int>(kMapParam.size()), kMapParam.data(), entry,
                                      static_cast<int>(text.size()), text.data(), why.c_str()));
}

// Split at `sep`, each piece trimmed, empty pieces kept (the map refuses them).
std::vector<std::string> split_all(std::string_view text, char sep) {
    std::vector<std::string> out;
    size_t start = 0;
    while (true) {
        const size_t end = text.find(sep, start);
        out.emplace_back(trim(
            text.substr(start, end == std::string_view::npos ? text.size() - start : end - start)));
        if (end == std::string_view::npos) return out;
        start = end + 1;
    }
}

bool valid_ifname(std::string_view name) {
    if (name.empty() || name.size() > 15) return false;  // IFNAMSIZ - 1
    return std::none_of(name.begin(), name.end(), [](char c) {
        return c == '/' || c == ':' || c == ',' || c == '+' ||
               std::isspace(static_cast<unsigned char>(c)) != 0;
    });
}

const MapEntry* find_entry(const std::vector<MapEntry>& map, int gpu, const std::string& gpu_pci) {
    for (const MapEntry& e : map) {
        if (e.gpu >= 0 && e.gpu == gpu) return &e;
        if (!e.gpu_pci.empty() && e.gpu_pci == gpu_pci) return &e;
    }
    return nullptr;
}

}  // namespace

const char* distance_name(Distance d) {
    switch (d) {
        case Distance::kPciSwitch:
            return "same PCIe switch";
        case Distance::kRootComplex:
            return "same root complex";
        case Distance::kNumaNode:
            return "same NUMA node";
        case Distance::kSystem:
            break;
    }
    return "different NUMA nodes";
}

std::string normalize_pci_address(std::string_view text) {
    std::string s;
    for (char c : trim(text)) s += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    // [domain:]bus:device.function
    const size_t dot = s.rfind('.');
    const size_t last = s.rfind(':');
    if (dot == std::string::npos || last == std::string::npos || dot < last) return "";
    const size_t first = s.rfind(':', last == 0 ? 0 : last - 1);
    std::string domain = "0000";
    std::string bus;
    if (first == std::string::npos || last == 0) {
        bus = s.substr(0, last);
    } else {
        domain = s.substr(0, first);
        bus = s.substr(first + 1, last - first - 1);
        while (domain.size() > 4 && domain[0] == '0') domain.erase(0, 1);
    }
    const std::string device = s.substr(last + 1, dot - last - 1);
    const std::string function = s.substr(dot + 1);
    if (domain.size() != 4 || !is_hex(domain) || bus.size() != 2 || !is_hex(bus) ||
        device.size() != 2 || !is_hex(device) || function.size() != 1 || function[0] < '0' ||
        function[0] > '7') {
        return "";
    }
    return domain + ":" + bus + ":" + device + "." + function;
}

Distance pci_distance(std::string_view path_a, int numa_a, std::string_view path_b, int numa_b) {
    const std::vector<std::string> a = pci_chain(path_a);
    const std::vector<std::string> b = pci_chain(path_b);
    size_t common = 0;
    while (common < a.size() && common < b.size() && a[common] == b[common]) ++common;
    // Sharing a bridge below the root complex (the root port, and a switch below it when there
    // is one): their traffic need not cross the root complex.
    if (common >= 2) return Distance::kPciSwitch;
    if (common == 1) return Distance::kRootComplex;
    if (numa_a >= 0 && numa_a == numa_b) return Distance::kNumaNode;
    return Distance::kSystem;
}

Nic read_nic(const std::string& sysfs_root, const std::string& name) {
    const fs::path dir = fs::path(sysfs_root) / "class" / "net" / name;
    Nic nic;
    nic.name = name;
    // The PCI function the interface hangs off (a virtio NIC's `device` is a child of it).
    fs::path dev(canonical_or_empty(dir / "device"));
    while (dev.has_filename() && !is_pci_address(dev.filename().string())) {
        dev = dev.parent_path();
    }
    if (dev.has_filename() && !pci_chain(dev.string()).empty()) {
        nic.pci_path = dev.string();
        nic.pci_address = dev.filename().string();
        nic.numa_node = read_int(dev / "numa_node");
    }
    nic.speed_mbps = read_int(dir / "speed");
    nic.mtu = read_int(dir / "mtu");
    nic.operstate = read_line(dir / "operstate");
    return nic;
}

Topology read_topology(const std::string& sysfs_root) {
    Topology t;
    const fs::path root(sysfs_root);
    std::error_code ec;
    for (const auto& entry : fs::directory_iterator(root / "class" / "net", ec)) {
        t.nics.push_back(read_nic(sysfs_root, entry.path().filename().string()));
    }
    std::sort(t.nics.begin(), t.nics.end(),
              [](const Nic& a, const Nic& b) { return natural_less(a.name, b.name); });
    for (const auto& entry : fs::directory_iterator(root / "bus" / "pci" / "devices", ec)) {
        const fs::path dir = entry.path();
        if (read_line(dir / "vendor") != "0x10de") continue;
        const std::string cls = read_line(dir / "class");
        if (cls.rfind("0x0302", 0) != 0 && cls.rfind("0x0300", 0) != 0) continue;
        Gpu gpu;
        gpu.pci_address = normalize_pci_address(dir.filename().string());
        if (gpu.pci_address.empty()) continue;
        gpu.pci_path = canonical_or_empty(dir);
        if (pci_chain(gpu.pci_path).empty()) gpu.pci_path.clear();
        gpu.numa_node = read_int(dir / "numa_node");
        t.gpus.push_back(std::move(gpu));
    }
    std::sort(t.gpus.begin(), t.gpus.end(),
              [](const Gpu& a, const Gpu& b) { return a.pci_address < b.pci_address; });
    return t;
}

StatusOr<std::vector<MapEntry>> parse_gpu_nic_map(std::string_view text) {
    std::vector<MapEntry> map;
    if (trim(text).empty()) return map;
    const std::vector<std::string> entries = split_all(text, ',');
    for (size_t i = 0; i < entries.size(); ++i) {
        const std::string& e = entries[i];
        if (e.empty()) return map_error(i + 1, e, "empty entry");
        // GPU:NICS; a PCI bus id as the GPU has colons of its own.
        const size_t colon = e.rfind(':');
        if (colon == std::string::npos) {
            return map_error(i + 1, e, "expected GPU:NIC, e.g. 0:eth1 or 0:eth1+eth2");
        }
        const std::string_view key = trim(std::string_view(e).substr(0, colon));
        MapEntry entry;
        int index = -1;
        auto [end, ec] = std::from_chars(key.data(), key.data() + key.size(), index);
        if (!key.empty() && ec == std::errc() && end == key.data() + key.size()) {
            if (index < 0 || index > kMaxGpuIndex) {
                return map_error(i + 1, e,
                                 strformat("GPU index %d is outside [0, %d]", index, kMaxGpuIndex));
            }
            entry.gpu = index;
        } else {
            entry.gpu_pci = normalize_pci_address(key);
            if (entry.gpu_pci.empty()) {
                return map_error(i + 1, e,
                                 strformat("'%.*s' is neither a GPU index (0, 1, ...) nor a PCI "
                                           "bus id (0000:86:00.0)",
                                           static_cast<int>(key.size()), key.data()));
            }
        }
        for (const std::string& name : split_all(std::string_view(e).substr(colon + 1), '+')) {
            if (name.empty()) return map_error(i + 1, e, "empty interface name");
            if (!valid_ifname(name)) {
                return map_error(i + 1, e, "'" + name + "' is not an interface name");
            }
            if (std::find(entry.nics.begin(), entry.nics.end(), name) != entry.nics.end()) {
                return map_error(i + 1, e, "'" + name + "' is named twice");
            }
            entry.nics.push_back(name);
        }
        for (const MapEntry& other : map) {
            if ((entry.gpu >= 0 && other.gpu == entry.gpu) ||
                (!entry.gpu_pci.empty() && other.gpu_pci == entry.gpu_pci)) {
                return map_error(i + 1, e, "this GPU has an entry already");
            }
        }
        map.push_back(std::move(entry));
    }
    return map;
}

std::string describe(const NicChoice& c) {
    std::string out = c.gpu >= 0 ? strformat("GPU %d", c.gpu) : std::string("GPU");
    if (!c.gpu_pci.empty()) out += " (" + c.gpu_pci + ")";
    out += " ->";
    if (c.nics.empty()) return out + " no NIC known";
    for (size_t i = 0; i < c.nics.size(); ++i) {
        const Nic& n = c.nics[i];
        out += (i == 0 ? " " : " + ") + n.name;
        if (!n.pci_address.empty()) out += " (" + n.pci_address + ")";
    }
    out += ", ";
    out += c.from_map ? "from TCPX_P2P_GPU_NIC_MAP" : distance_name(c.distance);
    return out;
}

std::vector<NicChoice> assign_nics(std::span<const Gpu> gpus, std::span<const Nic> nics) {
    std::vector<NicChoice> out(gpus.size());
    std::vector<size_t> candidates;
    for (size_t n = 0; n < nics.size(); ++n) {
        if (!nics[n].pci_path.empty() && nics[n].operstate != "down") candidates.push_back(n);
    }
    // Each GPU's closest candidates.
    std::vector<std::vector<size_t>> closest(gpus.size());
    for (size_t g = 0; g < gpus.size(); ++g) {
        out[g].gpu = static_cast<int>(g);
        out[g].gpu_pci = gpus[g].pci_address;
        if (gpus[g].pci_path.empty()) continue;
        Distance best = Distance::kSystem;
        for (size_t n : candidates) {
            best = std::min(best, pci_distance(gpus[g].pci_path, gpus[g].numa_node,
                                               nics[n].pci_path, nics[n].numa_node));
        }
        for (size_t n : candidates) {
            if (pci_distance(gpus[g].pci_path, gpus[g].numa_node, nics[n].pci_path,
                             nics[n].numa_node) == best) {
                closest[g].push_back(n);
            }
        }
        out[g].distance = best;
    }
    // One NIC per GPU, the least used of its closest (the first on a tie)...
    std::vector<int> users(nics.size(), 0);
    std::vector<std::vector<size_t>> chosen(gpus.size());
    for (size_t g = 0; g < gpus.size(); ++g) {
        size_t pick = SIZE_MAX;
        for (size_t n : closest[g]) {
            if (pick == SIZE_MAX || users[n] < users[pick]) pick = n;
        }
        if (pick == SIZE_MAX) continue;
        chosen[g].push_back(pick);
        ++users[pick];
    }
    // ... then a closest NIC nobody took to the GPU of those it is closest to with the fewest.
    for (size_t n : candidates) {
        if (users[n] > 0) continue;
        size_t pick = SIZE_MAX;
        for (size_t g = 0; g < gpus.size(); ++g) {
            if (std::find(closest[g].begin(), closest[g].end(), n) == closest[g].end()) continue;
            if (pick == SIZE_MAX || chosen[g].size() < chosen[pick].size()) pick = g;
        }
        if (pick == SIZE_MAX) continue;
        chosen[pick].push_back(n);
        ++users[n];
    }
    for (size_t g = 0; g < gpus.size(); ++g) {
        for (size_t n : chosen[g]) out[g].nics.push_back(nics[n]);
    }
    return out;
}

StatusOr<NicChoice> nics_for_gpu(const Topology& t, std::string_view map, int gpu,
                                 std::string_view gpu_pci) {
    TCPX_ASSIGN_OR_RETURN(std::vector<MapEntry> entries, parse_gpu_nic_map(map));
    NicChoice c;
    c.gpu = gpu;
    c.gpu_pci = normalize_pci_address(gpu_pci);
    if (const MapEntry* e = find_entry(entries, gpu, c.gpu_pci)) {
        c.from_map = true;
        for (const std::string& name : e->nics) {
            auto known = std::find_if(t.nics.begin(), t.nics.end(),
                                      [&](const Nic& n) { return n.name == name; });
            Nic nic;
            nic.name = name;
            c.nics.push_back(known != t.nics.end() ? *known : nic);
        }
        return c;
    }
    if (c.gpu_pci.empty()) return c;
    const std::vector<NicChoice> all = assign_nics(t.gpus, t.nics);
    for (const NicChoice& a : all) {
        if (a.gpu_pci == c.gpu_pci) {
            c.nics = a.nics;
            c.distance = a.distance;
        }
    }
    return c;
}

StatusOr<DeviceChoice> device_for_gpu(const Topology& t, std::span<const NetDevice> devices,
                                      std::string_view map, int gpu, std::string_view gpu_pci) {
    TCPX_ASSIGN_OR_RETURN(std::vector<MapEntry> entries, parse_gpu_nic_map(map));
    DeviceChoice out;
    out.choice.gpu = gpu;
    out.choice.gpu_pci = normalize_pci_address(gpu_pci);
    // The devices as NICs: their NUMA nodes from the NICs of sysfs with the same PCI address.
    std::vector<Nic> as_nics;
    for (const NetDevice& d : devices) {
        Nic nic;
        nic.name = d.name;
        nic.pci_address = address_of(d.pci_path);
        nic.pci_path = nic.pci_address.empty() ? std::string() : d.pci_path;
        for (const Nic& known : t.nics) {
            if (!nic.pci_address.empty() && known.pci_address == nic.pci_address) {
                nic.numa_node = known.numa_node;
            }
        }
        as_nics.push_back(std::move(nic));
    }
    if (const MapEntry* e = find_entry(entries, gpu, out.choice.gpu_pci)) {
        out.choice.from_map = true;
        std::string have;
        for (const std::string& name : e->nics) {
            for (size_t d = 0; d < devices.size(); ++d) {
                if (devices[d].name != name) continue;
                if (out.dev < 0) out.dev = static_cast<int>(d);
                out.choice.nics.push_back(as_nics[d]);
            }
        }
        if (out.dev < 0) {
            for (const NetDevice& d : devices) have += (have.empty() ? "" : ", ") + d.name;
            return not_found(
                strformat("%.*s names no device of this transport for GPU %d (its devices: %s)",
                          static_cast<int>(kMapParam.size()), kMapParam.data(), gpu,
                          have.empty() ? "none" : have.c_str()));
        }
        return out;
    }
    if (out.choice.gpu_pci.empty()) return out;
    const std::vector<NicChoice> all = assign_nics(t.gpus, as_nics);
    for (const NicChoice& a : all) {
        if (a.gpu_pci != out.choice.gpu_pci || a.nics.empty()) continue;
        out.choice.nics = a.nics;
        out.choice.distance = a.distance;
        for (size_t d = 0; d < devices.size(); ++d) {
            if (devices[d].name == a.nics.front().name &&
                as_nics[d].pci_address == a.nics.front().pci_address) {
                out.dev = static_cast<int>(d);
                break;
            }
        }
    }
    return out;
}

}  // namespace tcpx::topo
