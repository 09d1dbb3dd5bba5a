// tcpx_net_peer: the other process of multi-process net tests.
//
//   tcpx_net_peer send <handle-hex> <bytes>   connect to the handle, send <bytes>
//   tcpx_net_peer recv <bytes>                listen (prints "handle <hex>"), accept, receive
//
// Prints "posted" once the transfer is posted and "done" when it completes, then exits 0; exits 1
// with a message on stderr on any error. Settings come from the TCPX_P2P_* environment.

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "common/params.h"
#include "common/status_util.h"
#include "common/strings.h"
#include "net/socket/socket_net.h"
#include "tests/support/test_buffer.h"

using namespace tcpx;

namespace {

int fail(const Status& st) {
    std::fprintf(stderr, "tcpx_net_peer: %s\n", st.to_string().c_str());
    return 1;
}

Status wait(net::Net* net, net::Request* req) {
    while (true) {
        bool done = false;
        Status st = net->test(req, &done, nullptr);
        if (!st.ok() || done) return st;
        std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
}

}  // namespace

int main(int argc, char** argv) {
    if (argc < 3) {
        std::fprintf(stderr, "usage: %s send <handle-hex> <bytes> | recv <bytes>\n", argv[0]);
        return 2;
    }
    auto settings = Settings::from_env();
    if (!settings.ok()) return fail(settings.status());
    auto created = net::SocketNet::create(*settings);
    if (!created.ok()) return fail(created.status());
    net::Net* net = created->get();
    const std::string mode = argv[1];

    if (mode == "send" && argc == 4) {
        std::vector<uint8_t> raw;
        net::Handle handle;
        if (!from_hex(argv[2], &raw) || raw.size() != handle.bytes.size()) {
            return fail(invalid_argument("bad handle"));
        }
        std::memcpy(handle.bytes.data(), raw.data(), raw.size());
        const size_t bytes = std::strtoull(argv[3], nullptr, 10);
        net::SendComm* comm = nullptr;
        while (comm == nullptr) {
            Status st = net->connect(0, &handle, &comm, nullptr);
            if (!st.ok()) return fail(st);
        }
        testing::LazyBuffer mapped(bytes);
        if (mapped.data() == nullptr) return fail(internal_error("mmap"));
        net::Request* req = nullptr;
        while (req == nullptr) {
            Status st = net->isend(comm, mapped.data(), bytes, 0, nullptr, &req);
            if (!st.ok()) return fail(st);
        }
        std::printf("posted\n");
        std::fflush(stdout);
        Status st = wait(net, req);
        if (!st.ok()) return fail(st);
        std::printf("done\n");
        std::fflush(stdout);
        (void)net->close_send(comm);
        return 0;
    }
    if (mode == "recv" && argc == 3) {
        const size_t bytes = std::strtoull(argv[2], nullptr, 10);
        net::Handle handle;
        net::ListenComm* listen = nullptr;
        Status st = net->listen(0, &handle, &listen);
        if (!st.ok()) return fail(st);
        std::printf("handle %s\n", to_hex(handle.bytes.data(), handle.bytes.size()).c_str());
        std::fflush(stdout);
        net::RecvComm* comm = nullptr;
        while (comm == nullptr) {
            st = net->accept(listen, &comm, nullptr);
            if (!st.ok()) return fail(st);
            std::this_thread::sleep_for(std::chrono::milliseconds(1));
        }
        testing::LazyBuffer mapped(bytes);
        if (mapped.data() == nullptr) return fail(internal_error("mmap"));
        void* buf = mapped.data();
        net::Request* req = nullptr;
        int tag = 0;
        while (req == nullptr) {
            st = net->irecv(comm, 1, &buf, &bytes, &tag, nullptr, &req);
            if (!st.ok()) return fail(st);
        }
        std::printf("posted\n");
        std::fflush(stdout);
        st = wait(net, req);
        if (!st.ok()) return fail(st);
        std::printf("done\n");
        std::fflush(stdout);
        (void)net->close_recv(comm);
        (void)net->close_listen(listen);
        return 0;
    }
    std::fprintf(stderr, "usage: %s send <handle-hex> <bytes> | recv <bytes>\n", argv[0]);
    return 2;
}
