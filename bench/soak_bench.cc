#include "bench/soak_bench.h"

#include <dirent.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <memory>
#include <thread>
#include <vector>

#include "common/strings.h"
#include "tcpx/config.h"
#include "tcpx/endpoint.h"

namespace tcpx::bench {

namespace {

using Clock = std::chrono::steady_clock;

int open_fds() {
    int n = 0;
    if (DIR* d = ::opendir("/proc/self/fd")) {
        while (::readdir(d) != nullptr) ++n;
        ::closedir(d);
        n -= 3;  // ".", "..", and the directory's own fd
    }
    return n;
}

long resident_mib() {
    long pages = 0;
    long resident = 0;
    FILE* f = std::fopen("/proc/self/statm", "r");
    if (f == nullptr) return -1;
    if (std::fscanf(f, "%ld %ld", &pages, &resident) != 2) resident = -1;
    std::fclose(f);
    return resident * ::sysconf(_SC_PAGESIZE) / (1 << 20);
}

uint8_t pattern(size_t peer, size_t slot, size_t i) {
    return static_cast<uint8_t>(peer * 131 + slot * 17 + i * 7 + (i >> 9));
}

struct Initiator {
    std::unique_ptr<Endpoint> ep;
    PeerId peer = 0;
    std::vector<uint8_t> buf;  // one slot per transfer in flight, each its own pattern
    MemId mem = 0;
    std::vector<XferId> inflight;
};

}  // namespace

int run_soak_bench(const SoakOptions& o) {
    auto base = Config::from_env();
    if (!base.ok()) {
        std::fprintf(stderr, "tcpx-p2p bench soak: %s\n", base.status().to_string().c_str());
        return 2;
    }
    if (o.peers < 1 || o.inflight < 1 || o.threads < 1) {
        std::fprintf(stderr,
                     "tcpx-p2p bench soak: --peers, --inflight and --threads: at least 1\n");
        return 2;
    }
    const size_t slots = static_cast<size_t>(o.inflight);
    const size_t peers = static_cast<size_t>(o.peers);
    uint64_t total = 0;
    if (o.size == 0 || o.size > kSoakMaxSize ||
        __builtin_mul_overflow(static_cast<uint64_t>(peers) * slots, o.size, &total) ||
        total > kSoakMaxBytes) {
        std::fprintf(stderr,
                     "tcpx-p2p bench soak: --size in 1..%s, and --peers x --inflight x --size at "
                     "most %s (the target's region)\n",
                     format_bytes(kSoakMaxSize).c_str(), format_bytes(kSoakMaxBytes).c_str());
        return 2;
    }
    auto target = Endpoint::create(*base, "soak-target");
    if (!target.ok()) {
        std::fprintf(stderr, "tcpx-p2p bench soak: %s\n", target.status().to_string().c_str());
        return 1;
    }
    std::vector<uint8_t> region(total);
    const StatusOr<MemId> tmem = (*target)->reg(region.data(), region.size());
    StatusOr<RemoteMem> described =
        tmem.ok() ? (*target)->describe(*tmem) : StatusOr<RemoteMem>(tmem.status());
    if (!described.ok()) {
        std::fprintf(stderr, "tcpx-p2p bench soak: the target's region: %s\n",
                     described.status().to_string().c_str());
        return 1;
    }
    const RemoteMem desc = *described;
    // Initiators make their own progress (their threads call poll), so the process's thread
    // count stays near the peer count's I/O threads.
    Config ic = *base;
    ic.progress_thread = "off";
    std::vector<Initiator> inits(peers);
    for (size_t p = 0; p < peers; ++p) {
        auto ep = Endpoint::create(ic, "soak-" + std::to_string(p));
        if (!ep.ok()) {
            std::fprintf(stderr, "initiator %zu: %s\n", p, ep.status().to_string().c_str());
            return 1;
        }
        inits[p].ep = std::move(ep).value();
        auto id = inits[p].ep->connect((*target)->metadata());
        if (!id.ok()) {
            std::fprintf(stderr, "initiator %zu: %s\n", p, id.status().to_string().c_str());
            return 1;
        }
        inits[p].peer = *id;
        inits[p].buf.resize(slots * o.size);
        for (size_t s = 0; s < slots; ++s) {
            for (size_t i = 0; i < o.size; ++i) inits[p].buf[s * o.size + i] = pattern(p, s, i);
        }
        auto mem = inits[p].ep->reg(inits[p].buf.data(), inits[p].buf.size());
        if (!mem.ok()) {
            std::fprintf(stderr, "initiator %zu: %s\n", p, mem.status().to_string().c_str());
            return 1;
        }
        inits[p].mem = *mem;
        inits[p].inflight.assign(slots, 0);
    }
    const int fds0 = open_fds();
    const long rss0 = resident_mib();
    std::printf(
        "soak: %zu peers x %zu transfers of %s in flight, %.0f s; start: %d fds, %ld MiB "
        "resident\n",
        peers, slots, format_bytes(o.size).c_str(), o.seconds, fds0, rss0);
    std::fflush(stdout);

    std::atomic<uint64_t> done{0};
    std::atomic<uint64_t> errors{0};
    std::atomic<bool> stop{false};
    const int nthreads = std::max(1, std::min<int>(o.threads, static_cast<int>(peers)));
    std::vector<std::thread> workers;
    for (int t = 0; t < nthreads; ++t) {
        workers.emplace_back([&, t] {
            auto post = [&](size_t p, size_t s) {
                Initiator& in = inits[p];
                auto x = in.ep->write(in.peer, in.mem, s * o.size, desc, (p * slots + s) * o.size,
                                      o.size);
                if (!x.ok()) {
                    if (errors.fetch_add(1) < 5) {
                        std::fprintf(stderr, "write: %s\n", x.status().to_string().c_str());
                    }
                    in.inflight[s] = 0;
                    return;
                }
                in.inflight[s] = *x;
            };
            for (size_t p = static_cast<size_t>(t); p < peers; p += nthreads) {
                for (size_t s = 0; s < slots; ++s) post(p, s);
            }
            while (!stop.load()) {
                for (size_t p = static_cast<size_t>(t); p < peers; p += nthreads) {
                    for (size_t s = 0; s < slots; ++s) {
                        XferId x = inits[p].inflight[s];
                        if (x == 0) continue;
                        XferStatus st = inits[p].ep->poll(x);
                        if (st.state == XferState::kInProgress) continue;
                        if (st.state == XferState::kFailed) {
                            if (errors.fetch_add(1) < 5) {
                                std::fprintf(stderr, "transfer: %s\n",
                                             st.error.to_string().c_str());
                            }
                        } else {
                            done.fetch_add(1);
                        }
                        post(p, s);
                    }
                }
            }
            // Drain: every transfer ends before the endpoints go.
            for (size_t p = static_cast<size_t>(t); p < peers; p += nthreads) {
                for (XferId x : inits[p].inflight) {
                    if (x != 0 && !inits[p].ep->wait(x, std::chrono::seconds(60)).ok()) {
                        errors.fetch_add(1);
                    }
                }
            }
        });
    }
    const auto t0 = Clock::now();
    auto next_report = t0 + std::chrono::seconds(o.report_seconds);
    while (Clock::now() - t0 < std::chrono::duration<double>(o.seconds)) {
        std::this_thread::sleep_for(std::chrono::milliseconds(200));
        if (Clock::now() >= next_report) {
            next_report += std::chrono::seconds(o.report_seconds);
            const double el = std::chrono::duration<double>(Clock::now() - t0).count();
            std::printf("  %6.0f s: %llu transfers (%.2f GB/s), %llu errors, %d fds, %ld MiB\n", el,
                        static_cast<unsigned long long>(done.load()),
                        static_cast<double>(done.load()) * static_cast<double>(o.size) / el / 1e9,
                        static_cast<unsigned long long>(errors.load()), open_fds(), resident_mib());
            std::fflush(stdout);
        }
    }
    stop.store(true);
    for (std::thread& w : workers) w.join();
    const double el = std::chrono::duration<double>(Clock::now() - t0).count();
    // Every slot of the target holds its initiator's pattern: nothing landed anywhere else.
    uint64_t bad = 0;
    for (size_t p = 0; p < peers; ++p) {
        for (size_t s = 0; s < slots; ++s) {
            const uint8_t* at = region.data() + (p * slots + s) * o.size;
            for (size_t i = 0; i < o.size; ++i) bad += at[i] != pattern(p, s, i);
        }
    }
    const int fds1 = open_fds();
    const long rss1 = resident_mib();
    std::printf(
        "soak: %llu transfers in %.0f s (%.2f GB/s), %llu errors, %llu bad bytes; end: %d "
        "fds (start %d), %ld MiB resident (start %ld)\n",
        static_cast<unsigned long long>(done.load()), el,
        static_cast<double>(done.load()) * static_cast<double>(o.size) / el / 1e9,
        static_cast<unsigned long long>(errors.load()), static_cast<unsigned long long>(bad), fds1,
        fds0, rss1, rss0);
    return errors.load() == 0 && bad == 0 ? 0 : 1;
}

}  // namespace tcpx::bench
