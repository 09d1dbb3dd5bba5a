// Microbenchmarks of the socket transport's per-message costs (Google Benchmark), in one
// process over loopback: how many messages of a size one comm moves with a window in flight, and
// the cost of a full post/complete cycle for one message at a time.
#include <benchmark/benchmark.h>

#include <deque>
#include <memory>
#include <vector>

#include "common/params.h"
#include "net/socket/socket_net.h"

namespace {

using namespace tcpx;

struct Pair {
    std::unique_ptr<net::SocketNet> net;
    net::SendComm* send = nullptr;
    net::RecvComm* recv = nullptr;
};

bool make_pair(Pair* p) {
    Settings s;
    s.socket_ifname = "=lo";
    s.socket_family = "ipv4";
    auto created = net::SocketNet::create(s);
    if (!created.ok()) return false;
    p->net = std::move(created).value();
    net::Handle handle;
    net::ListenComm* listen = nullptr;
    if (!p->net->listen(0, &handle, &listen).ok()) return false;
    for (int i = 0; i < 1000000 && (p->send == nullptr || p->recv == nullptr); ++i) {
        if (p->send == nullptr && !p->net->connect(0, &handle, &p->send, nullptr).ok()) break;
        if (p->recv == nullptr && !p->net->accept(listen, &p->recv, nullptr).ok()) break;
    }
    (void)p->net->close_listen(listen);
    return p->send != nullptr && p->recv != nullptr;
}

void close_pair(Pair* p) {
    (void)p->net->close_send(p->send);
    (void)p->net->close_recv(p->recv);
}

bool wait(net::Net* net, net::Request* req) {
    while (true) {
        bool done = false;
        if (!net->test(req, &done, nullptr).ok()) return false;
        if (done) return true;
    }
}

net::Request* post_recv(Pair* p, void* buf, size_t size) {
    net::Request* req = nullptr;
    int tag = 0;
    while (req == nullptr) {
        if (!p->net->irecv(p->recv, 1, &buf, &size, &tag, nullptr, &req).ok()) return nullptr;
    }
    return req;
}

net::Request* post_send(Pair* p, const void* buf, size_t size) {
    net::Request* req = nullptr;
    while (req == nullptr) {
        if (!p->net->isend(p->send, buf, size, 0, nullptr, &req).ok()) return nullptr;
    }
    return req;
}

// Messages of state.range(0) bytes, 16 in flight; the receiver reposts as each completes.
void BM_PipelinedMessages(benchmark::State& state) {
    const size_t size = static_cast<size_t>(state.range(0));
    constexpr int kWindow = 16;
    Pair p;
    if (!make_pair(&p)) {
        state.SkipWithError("could not connect over loopback");
        return;
    }
    std::vector<uint8_t> src(size, 1), dst(size * kWindow);
    std::deque<net::Request*> sends, recvs;
    int slot = 0;
    for (auto _ : state) {
        if (recvs.size() >= kWindow) {
            if (!wait(p.net.get(), recvs.front())) state.SkipWithError("receive failed");
            (void)p.net->irecv_consumed(p.recv, 1, recvs.front());
            recvs.pop_front();
        }
        if (sends.size() >= kWindow) {
            if (!wait(p.net.get(), sends.front())) state.SkipWithError("send failed");
            sends.pop_front();
        }
        recvs.push_back(post_recv(&p, dst.data() + size * (slot++ % kWindow), size));
        sends.push_back(post_send(&p, src.data(), size));
    }
    for (auto* r : recvs) {
        wait(p.net.get(), r);
        (void)p.net->irecv_consumed(p.recv, 1, r);
    }
    for (auto* s : sends) wait(p.net.get(), s);
    state.SetItemsProcessed(state.iterations());
    state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(size));
    close_pair(&p);
}
BENCHMARK(BM_PipelinedMessages)->Arg(64)->Arg(4096)->Arg(64 << 10)->Arg(1 << 20)->UseRealTime();

// One message at a time: post the receive and the send, wait for both (one-way latency plus
// the posting and completion costs).
void BM_OneMessageAtATime(benchmark::State& state) {
    const size_t size = static_cast<size_t>(state.range(0));
    Pair p;
    if (!make_pair(&p)) {
        state.SkipWithError("could not connect over loopback");
        return;
    }
    std::vector<uint8_t> src(size, 1), dst(size);
    for (auto _ : state) {
        net::Request* r = post_recv(&p, dst.data(), size);
        net::Request* s = post_send(&p, src.data(), size);
        if (!wait(p.net.get(), s) || !wait(p.net.get(), r)) state.SkipWithError("transfer failed");
        (void)p.net->irecv_consumed(p.recv, 1, r);
    }
    state.SetItemsProcessed(state.iterations());
    close_pair(&p);
}
BENCHMARK(BM_OneMessageAtATime)->Arg(64)->Arg(4096)->Arg(64 << 10)->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
