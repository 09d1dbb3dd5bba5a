#include "tests/support/net_test_util.h"

#include <dirent.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <thread>

#include "common/status_util.h"
#include "net/plugin/nccl_net_table.h"
#include "net/plugin/v7_net.h"
#include "net/socket/socket_net.h"
#include "net/socket/socket_v7.h"

namespace tcpx::testing {

Settings loopback_settings() {
    Settings s;
    s.socket_ifname = "=lo";
    s.socket_family = "ipv4";
    s.nsocks = 4;
    s.io_threads = 4;
    s.handshake_timeout_ms = 5000;
    return s;
}

int plugin_version(Provider p) {
    switch (p) {
        case Provider::kNcclPluginV7:
            return 7;
        case Provider::kNcclPluginV8:
            return 8;
        case Provider::kNcclPluginV9:
            return 9;
        case Provider::kNcclPluginV10:
            return 10;
        case Provider::kNcclPluginV11:
            return 11;
        default:
            return 0;
    }
}

std::string provider_name(Provider p) {
    if (p == Provider::kSocket) return "Socket";
    if (p == Provider::kSocketInCaller) return "SocketInCaller";
    if (p == Provider::kSocketV7) return "SocketV7";
    return "NcclPluginV" + std::to_string(plugin_version(p));
}

void set_socket_env(const Settings& settings) {
    setenv("TCPX_P2P_SOCKET_IFNAME", settings.socket_ifname.c_str(), 1);
    setenv("TCPX_P2P_SOCKET_FAMILY", settings.socket_family.c_str(), 1);
    setenv("TCPX_P2P_NSOCKS", std::to_string(settings.nsocks).c_str(), 1);
    setenv("TCPX_P2P_IO_THREADS", std::to_string(settings.io_threads).c_str(), 1);
}

std::unique_ptr<net::Net> make_net(Provider provider, const Settings& settings) {
    if (provider == Provider::kSocket || provider == Provider::kSocketInCaller) {
        auto net = net::SocketNet::create(settings, provider == Provider::kSocket
                                                        ? net::SocketNet::Io::kThreads
                                                        : net::SocketNet::Io::kInCaller);
        if (!net.ok()) return nullptr;
        return std::move(net).value();
    }
    // The v7 table builds its process-wide net from the environment. (Only the first init
    // creates it; every test uses the same loopback settings.)
    set_socket_env(settings);
    net::V7Options options;
    options.max_requests = static_cast<int>(settings.max_requests);
    options.reports_sizes = true;
    options.settings = settings;
    if (const int version = plugin_version(provider); version != 0) {
        // As NCCL loads it: the library by path, the version's table by its symbol. Never
        // unloaded (its net lives as long as the process).
        void* lib = ::dlopen(TCPX_NCCL_PLUGIN_PATH, RTLD_NOW | RTLD_LOCAL);
        if (lib == nullptr) {
            ADD_FAILURE() << "cannot load " << TCPX_NCCL_PLUGIN_PATH << ": " << ::dlerror();
            return nullptr;
        }
        const std::string symbol = "ncclNetPlugin_v" + std::to_string(version);
        const void* table = ::dlsym(lib, symbol.c_str());
        if (table == nullptr) {
            ADD_FAILURE() << TCPX_NCCL_PLUGIN_PATH << " does not export " << symbol;
            return nullptr;
        }
        auto net = net::V7Net::create(net::nccl_net_table(table, version), options);
        if (!net.ok()) {
            ADD_FAILURE() << symbol << ": " << net.status().to_string();
            return nullptr;
        }
        return std::move(net).value();
    }
    auto net = net::V7Net::create(net::socket_net_v7(), options);
    if (!net.ok()) return nullptr;
    return std::move(net).value();
}

CommPair connect_pair(net::Net* net, std::chrono::milliseconds timeout) {
    CommPair pair;
    net::Handle handle;
    net::ListenComm* listen = nullptr;
    if (!net->listen(0, &handle, &listen).ok()) return pair;
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while ((pair.send == nullptr || pair.recv == nullptr) &&
           std::chrono::steady_clock::now() < deadline) {
        if (pair.send == nullptr && !net->connect(0, &handle, &pair.send, nullptr).ok()) break;
        if (pair.recv == nullptr && !net->accept(listen, &pair.recv, nullptr).ok()) break;
    }
    (void)net->close_listen(listen);
    if (pair.send == nullptr || pair.recv == nullptr) {
        close_pair(net, pair);
        return CommPair{};
    }
    return pair;
}

void close_pair(net::Net* net, CommPair pair) {
    if (pair.send != nullptr) (void)net->close_send(pair.send);
    if (pair.recv != nullptr) (void)net->close_recv(pair.recv);
}

Status wait_request(net::Net* net, net::Request* request, size_t* sizes,
                    std::chrono::milliseconds timeout) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    size_t local_sizes[8] = {};
    while (true) {
        net->progress();
        bool done = false;
        Status st = net->test(request, &done, sizes != nullptr ? sizes : local_sizes);
        if (done || !st.ok()) return st;
        if (std::chrono::steady_clock::now() > deadline) {
            return timeout_error("request did not complete in time");
        }
        std::this_thread::yield();
    }
}

namespace {

template <typename Post>
Status post_with_retry(net::Net* net, Post post, net::Request** request) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (true) {
        net->progress();  // the room comes from requests that finish
        *request = nullptr;
        TCPX_RETURN_IF_ERROR(post());
        if (*request != nullptr) return Status();
        if (std::chrono::steady_clock::now() > deadline) {
            return timeout_error("no room to post within 30 s");
        }
        std::this_thread::yield();
    }
}

}  // namespace

Status post_send(net::Net* net, net::SendComm* comm, const void* data, size_t size, int tag,
                 net::Request** request) {
    return post_with_retry(
        net, [&] { return net->isend(comm, data, size, tag, nullptr, request); }, request);
}

Status post_recv(net::Net* net, net::RecvComm* comm, void* data, size_t size, int tag,
                 net::Request** request) {
    return post_with_retry(
        net, [&] { return net->irecv(comm, 1, &data, &size, &tag, nullptr, request); }, request);
}

namespace {

inline uint64_t mix(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ULL;
    x ^= x >> 33;
    return x;
}

}  // namespace

void fill_pattern(void* data, size_t size, uint64_t seed) {
    auto* p = static_cast<uint8_t*>(data);
    size_t i = 0;
    for (; i + 8 <= size; i += 8) {
        const uint64_t v = mix(seed * 0x9e3779b97f4a7c15ULL + i / 8);
        std::memcpy(p + i, &v, 8);
    }
    if (i < size) {
        const uint64_t v = mix(seed * 0x9e3779b97f4a7c15ULL + i / 8);
        std::memcpy(p + i, &v, size - i);
    }
}

int64_t find_pattern_mismatch(const void* data, size_t size, uint64_t seed) {
    const auto* p = static_cast<const uint8_t*>(data);
    for (size_t i = 0; i < size; i += 8) {
        const uint64_t v = mix(seed * 0x9e3779b97f4a7c15ULL + i / 8);
        const size_t n = std::min<size_t>(8, size - i);
        if (std::memcmp(p + i, &v, n) != 0) {
            for (size_t j = 0; j < n; ++j) {
                if (p[i + j] != reinterpret_cast<const uint8_t*>(&v)[j]) {
                    return static_cast<int64_t>(i + j);
                }
            }
        }
    }
    return -1;
}

namespace {

int count_dir_entries(const char* path) {
    DIR* dir = opendir(path);
    if (dir == nullptr) return -1;
    int n = 0;
    while (dirent* e = readdir(dir)) {
        if (e->d_name[0] != '.') ++n;
    }
    closedir(dir);
    return n;
}

}  // namespace

int plain_connect(const SocketAddress& addr, bool nonblocking) {
    const int fd =
        ::socket(addr.family(), SOCK_STREAM | SOCK_CLOEXEC | (nonblocking ? SOCK_NONBLOCK : 0), 0);
    if (fd < 0) return -1;
    if (::connect(fd, addr.get(), addr.size()) != 0 && !(nonblocking && errno == EINPROGRESS)) {
        ::close(fd);
        return -1;
    }
    return fd;
}

int count_open_fds() { return count_dir_entries("/proc/self/fd") - 1; /* the DIR's own fd */ }

int count_io_threads() {
    DIR* dir = opendir("/proc/self/task");
    if (dir == nullptr) return -1;
    int n = 0;
    while (dirent* e = readdir(dir)) {
        if (e->d_name[0] == '.') continue;
        const std::string path = std::string("/proc/self/task/") + e->d_name + "/comm";
        char name[32] = {};
        if (FILE* f = fopen(path.c_str(), "r")) {
            if (fgets(name, sizeof(name), f) != nullptr && std::strncmp(name, "tcpx-io-", 8) == 0) {
                ++n;
            }
            fclose(f);
        }
    }
    closedir(dir);
    return n;
}

int settled_io_threads() {
    int n = count_io_threads();
    for (int i = 0; i < 200; ++i) {  // at most about 2 s
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
        const int again = count_io_threads();
        if (again == n) return n;
        n = again;
    }
    return n;
}

bool eventually(const std::function<bool()>& cond, std::chrono::milliseconds timeout) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (!cond()) {
        if (std::chrono::steady_clock::now() > deadline) return false;
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    return true;
}

NoDescriptorsLeft::NoDescriptorsLeft() {
    rlimit lim{};
    if (::getrlimit(RLIMIT_NOFILE, &lim) != 0) return;
    // The lowest free descriptor (every one below it is in use) becomes the last one allowed.
    const int last = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (last < 0) return;
    taken_.push_back(last);
    saved_cur_ = lim.rlim_cur;
    lim.rlim_cur = static_cast<rlim_t>(last + 1);
    if (::setrlimit(RLIMIT_NOFILE, &lim) != 0) return;
    const int more = ::dup(last);
    if (more >= 0) {
        taken_.push_back(more);
        return;
    }
    ok_ = errno == EMFILE;
}

NoDescriptorsLeft::~NoDescriptorsLeft() {
    for (int fd : taken_) ::close(fd);
    rlimit lim{};
    if (saved_cur_ != 0 && ::getrlimit(RLIMIT_NOFILE, &lim) == 0) {
        lim.rlim_cur = static_cast<rlim_t>(saved_cur_);
        (void)::setrlimit(RLIMIT_NOFILE, &lim);
    }
}

}  // namespace tcpx::testing
