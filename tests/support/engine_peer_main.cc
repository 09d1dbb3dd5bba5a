// tcpx_engine_peer: the other process of multi-process engine tests.
//
//   tcpx_engine_peer target <bytes> [<gpu>]
//       An endpoint named "target" with one registered region of <bytes>, filled with pattern
//       seed 7; in GPU <gpu>'s memory when given (the endpoint then serves that GPU). Prints
//       "metadata <hex>" and "mem <hex>", then serves until stdin closes, printing "notif <hex
//       payload>" for each notification and answering stdin lines "check <offset> <len> <seed>"
//       with "ok" or "bad <index>". With TCPX_TEST_TARGET_UNFILLED=1 in the environment the region
//       stays zero: for tests that kill or stop the target and never read it back (filling 256
//       MiB took seconds under ThreadSanitizer).
//   tcpx_engine_peer initiator <metadata hex> <descriptor hex> <bytes>
//       Connects to the endpoint, prints "connected", then writes <bytes> to offset 0 of the
//       region again and again (printing "wrote" after each) until killed or failed.
//
// Settings come from the TCPX_P2P_* environment. Exits non-zero with a message on errors.
#include <poll.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <string>
#include <vector>

#include "common/status_util.h"
#include "common/strings.h"
#include "tcpx/endpoint.h"
#include "tests/support/net_test_util.h"
#include "tests/support/test_buffer.h"

using namespace tcpx;

namespace {

int fail(const Status& st) {
    std::fprintf(stderr, "tcpx_engine_peer: %s\n", st.to_string().c_str());
    return 1;
}

void say(const std::string& line) {
    std::printf("%s\n", line.c_str());
    std::fflush(stdout);
}

std::string unhex(const std::string& hex) {
    std::vector<uint8_t> raw;
    if (!from_hex(hex, &raw)) return {};
    return std::string(raw.begin(), raw.end());
}

}  // namespace

int main(int argc, char** argv) {
    auto config = Config::from_env();
    if (!config.ok()) return fail(config.status());
    const std::string mode = argc > 1 ? argv[1] : "";
    if (mode == "target" && (argc == 3 || argc == 4)) {
        const size_t bytes = std::strtoull(argv[2], nullptr, 10);
        const int gpu = argc == 4 ? std::atoi(argv[3]) : -1;
        if (gpu >= 0) config->gpu_index = gpu;
        auto buf =
            gpu >= 0 ? testing::device_buffer(bytes, gpu, nullptr) : testing::host_buffer(bytes);
        if (buf == nullptr) return fail(unavailable("no memory on that GPU"));
        auto ep = Endpoint::create(*config, "target");
        if (!ep.ok()) return fail(ep.status());
        const char* unfilled = std::getenv("TCPX_TEST_TARGET_UNFILLED");
        if (unfilled == nullptr || std::strcmp(unfilled, "1") != 0) {
            std::vector<uint8_t> pattern(bytes);
            testing::fill_pattern(pattern.data(), bytes, 7);
            buf->upload(0, pattern.data(), bytes);
        }
        auto mem = (*ep)->reg(buf->data(), bytes);
        if (!mem.ok()) return fail(mem.status());
        const std::string md = (*ep)->metadata();
        const std::string desc = (*ep)->describe(*mem)->serialize();
        say("metadata " + to_hex(md.data(), md.size()));
        say("mem " + to_hex(desc.data(), desc.size()));
        std::string pending;
        while (true) {
            for (const Notification& n : (*ep)->get_notifications()) {
                say("notif " + to_hex(n.payload.data(), n.payload.size()));
            }
            pollfd pfd{STDIN_FILENO, POLLIN, 0};
            if (::poll(&pfd, 1, 10) <= 0) continue;
            char chunk[256];
            const ssize_t n = ::read(STDIN_FILENO, chunk, sizeof(chunk));
            if (n <= 0) return 0;  // the parent closed stdin: done
            pending.append(chunk, static_cast<size_t>(n));
            size_t nl;
            while ((nl = pending.find('\n')) != std::string::npos) {
                std::istringstream line(pending.substr(0, nl));
                pending.erase(0, nl + 1);
                std::string cmd;
                uint64_t off = 0, len = 0, seed = 0;
                line >> cmd >> off >> len >> seed;
                if (cmd != "check" || off + len > bytes) {
                    say("bad request");
                    continue;
                }
                const int64_t at =
                    testing::find_pattern_mismatch(buf->download(off, len).data(), len, seed);
                say(at < 0 ? "ok" : "bad " + std::to_string(at));
            }
        }
    }
    if (mode == "initiator" && argc == 5) {
        const size_t bytes = std::strtoull(argv[4], nullptr, 10);
        auto ep = Endpoint::create(*config, "initiator");
        if (!ep.ok()) return fail(ep.status());
        auto remote = RemoteMem::parse(unhex(argv[3]));
        if (!remote.ok()) return fail(remote.status());
        auto peer = (*ep)->connect(unhex(argv[2]));
        if (!peer.ok()) return fail(peer.status());
        std::vector<uint8_t> buf(bytes, 0x42);
        auto mem = (*ep)->reg(buf.data(), bytes);
        if (!mem.ok()) return fail(mem.status());
        say("connected");
        while (true) {
            auto x = (*ep)->write(*peer, *mem, 0, *remote, 0, bytes);
            if (!x.ok()) return fail(x.status());
            Status st = (*ep)->wait(*x, std::chrono::seconds(60));
            if (!st.ok()) return fail(st);
            say("wrote");
        }
    }
    std::fprintf(stderr, "usage: %s target <bytes> | initiator <md> <desc> <bytes>\n", argv[0]);
    return 2;
}
