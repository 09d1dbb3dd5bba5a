// tcpx_nixl_peer: the other process of the NIXL backend's multi-process tests. One agent with
// the TCPX backend and one registered host buffer, driven by lines on stdin; binary values
// (metadata, messages) travel as hex.
//
//   tcpx_nixl_peer <agent name> <buffer bytes> <pattern seed>
//   prints:  ready <buffer address> <hex metadata>
//   load <hex md>                        -> ok <agent name> | error <status>
//   wait_notif <hex msg>                 -> notif <from> | timeout  (the first with this message)
//   count <hex msg>                      -> count <n>  (received so far with this message)
//   check <seed> <start> <offset> <len>  -> ok | bad <index>  (buffer bytes against pattern
//                                           bytes [start, start + len) of <seed>)
//   fill <seed>                          -> ok
//   notify <agent> <hex msg>             -> ok | error <status>
//   params                               -> params <key>=<value> ... (getPluginParams' TCPX)
//   quit                                 -> exits 0
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <sstream>
#include <string>
#include <thread>

#include "nixl_test_util.h"

namespace tcpx::nixl_test {
namespace {

int run(int argc, char** argv) {
    if (argc != 4) {
        std::cerr << "usage: tcpx_nixl_peer <agent name> <buffer bytes> <pattern seed>\n";
        return 2;
    }
    const std::string name = argv[1];
    const size_t size = std::strtoull(argv[2], nullptr, 10);
    auto buffer = Buffer::create(DRAM_SEG, size);
    if (!buffer) return 3;
    buffer->fill(std::strtoull(argv[3], nullptr, 10));
    TestAgent agent(name);
    if (agent.backend() == nullptr || !agent.reg(*buffer)) return 4;
    std::cout << "ready " << buffer->addr() << " " << to_hex(agent.metadata()) << std::endl;

    std::string line;
    while (std::getline(std::cin, line)) {
        std::istringstream in(line);
        std::string cmd;
        in >> cmd;
        if (cmd == "load") {
            std::string hex, remote;
            in >> hex;
            const nixl_status_t st = agent->loadRemoteMD(from_hex(hex), remote);
            if (st == NIXL_SUCCESS) {
                std::cout << "ok " << remote << std::endl;
            } else {
                std::cout << "error " << st << std::endl;
            }
        } else if (cmd == "wait_notif" || cmd == "count") {
            std::string hex;
            in >> hex;
            const std::string msg = from_hex(hex);
            auto find = [&]() -> const Notif* {
                for (const Notif& n : agent.received()) {
                    if (n.msg == msg) return &n;
                }
                return nullptr;
            };
            if (cmd == "count") {
                agent.pump();
                size_t n = 0;
                for (const Notif& r : agent.received()) n += r.msg == msg ? 1 : 0;
                std::cout << "count " << n << std::endl;
                continue;
            }
            const auto deadline = std::chrono::steady_clock::now() + kTimeout;
            while (find() == nullptr && std::chrono::steady_clock::now() < deadline) {
                agent.pump();
                std::this_thread::sleep_for(std::chrono::microseconds(50));
            }
            const Notif* n = find();
            if (n != nullptr) {
                std::cout << "notif " << n->from << std::endl;
            } else {
                std::cout << "timeout" << std::endl;
            }
        } else if (cmd == "check") {
            uint64_t seed = 0, start = 0, offset = 0, len = 0;
            in >> seed >> start >> offset >> len;
            std::vector<uint8_t> got(len);
            buffer->read(offset, got.data(), len);
            const size_t bad = pattern_mismatch(got.data(), len, seed, start);
            if (bad == kNoMismatch) {
                std::cout << "ok" << std::endl;
            } else {
                std::cout << "bad " << bad << std::endl;
            }
        } else if (cmd == "fill") {
            uint64_t seed = 0;
            in >> seed;
            buffer->fill(seed);
            // The test posts its READ of these bytes only after our "ok", so they are ordered
            // before the engine sends them, but through the other process (the pipe, then the
            // READ_REQ on the socket), which ThreadSanitizer cannot follow. A getNotifs takes
            // the engine's lock, which the engine holds when it starts sending: that order it
            // sees.
            agent.pump();
            std::cout << "ok" << std::endl;
        } else if (cmd == "notify") {
            std::string to, hex;
            in >> to >> hex;
            const nixl_status_t st = agent->genNotif(to, from_hex(hex));
            if (st == NIXL_SUCCESS) {
                std::cout << "ok" << std::endl;
            } else {
                std::cout << "error " << st << std::endl;
            }
        } else if (cmd == "params") {
            nixl_mem_list_t mems;
            nixl_b_params_t params;
            if (agent->getPluginParams("TCPX", mems, params) != NIXL_SUCCESS) {
                std::cout << "error" << std::endl;
            } else {
                std::cout << "params";
                for (const auto& [key, value] : params) std::cout << " " << key << "=" << value;
                std::cout << std::endl;
            }
        } else if (cmd == "quit") {
            break;
        } else {
            std::cout << "error unknown command" << std::endl;
        }
    }
    agent.dereg_all();
    return 0;
}

}  // namespace
}  // namespace tcpx::nixl_test

int main(int argc, char** argv) { return tcpx::nixl_test::run(argc, argv); }
