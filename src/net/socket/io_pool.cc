#include "net/socket/io_pool.h"

#include <pthread.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string>
#include <utility>

#include "common/log.h"
#include "common/status_util.h"

namespace tcpx::net {
namespace {

thread_local const void* tls_current_thread = nullptr;

// epoll data for the wake eventfd; handlers are never null, so null marks the eventfd.
constexpr void* kWakeMarker = nullptr;

}  // namespace

StatusOr<std::unique_ptr<IoPool>> IoPool::create(int threads, Mode mode) {
    if (threads < 1) return invalid_argument("I/O pool needs at least one thread");
    std::unique_ptr<IoPool> pool(new IoPool());
    pool->driven_ = mode == Mode::kDriven;
    TCPX_ASSIGN_OR_RETURN(pool->completions_, Wakeup::create());
    for (int i = 0; i < threads; ++i) {
        auto t = std::make_unique<Thread>();
        t->epfd = ::epoll_create1(EPOLL_CLOEXEC);
        if (t->epfd < 0) return errno_status(errno, "epoll_create1");
        t->wakefd = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
        if (t->wakefd < 0) {
            ::close(t->epfd);
            return errno_status(errno, "eventfd");
        }
        epoll_event ev{};
        ev.events = EPOLLIN;
        ev.data.ptr = kWakeMarker;
        if (::epoll_ctl(t->epfd, EPOLL_CTL_ADD, t->wakefd, &ev) != 0) {
            const int err = errno;
            ::close(t->wakefd);
            ::close(t->epfd);
            return errno_status(err, "epoll_ctl(eventfd)");
        }
        pool->threads_.push_back(std::move(t));
    }
    if (pool->driven_) return pool;
    for (size_t i = 0; i < pool->threads_.size(); ++i) {
        Thread* raw = pool->threads_[i].get();
        IoPool* self = pool.get();
        raw->thread = std::thread([self, raw] { self->run(raw); });
        // Named for top, gdb and the tests (at most 15 characters), before create() returns.
        const std::string name = "tcpx-io-" + std::to_string(i);
        pthread_setname_np(raw->thread.native_handle(), name.c_str());
    }
    return pool;
}

IoPool::~IoPool() {
    for (auto& t : threads_) {
        t->stop.store(true);
        std::lock_guard<std::mutex> lock(t->mu);
        wake_locked(t.get());
    }
    for (auto& t : threads_) {
        if (t->thread.joinable()) t->thread.join();
        ::close(t->wakefd);
        ::close(t->epfd);
    }
}

int IoPool::assign_thread(int weight, Lane lane) {
    // By lane first: the sockets of one direction are busy together (a peer's reads all arrive
    // on receiving data sockets), so each lane on its own is spread over every thread. Spread
    // by load alone, the order comms open in could pair the receiving sockets of two channels
    // on half the threads, and put two sending ones on each of the others, and a burst in one
    // direction would then find half the threads idle.
    const auto l = static_cast<size_t>(lane);
    // (lane's weight, all lanes' weight) of thread i: the least wins, the first of equals.
    const auto rank = [&](int i) {
        const auto& w = threads_[i]->lane_load;
        return std::pair<int64_t, int64_t>(w[l].load(), w[0].load() + w[1].load() + w[2].load());
    };
    int best = 0;
    auto best_rank = rank(0);
    for (int i = 1; i < size(); ++i) {
        if (const auto r = rank(i); r < best_rank) {
            best = i;
            best_rank = r;
        }
    }
    threads_[best]->lane_load[l].fetch_add(weight);
    return best;
}

void IoPool::unassign(int thread, int weight, Lane lane) {
    threads_[thread]->lane_load[static_cast<size_t>(lane)].fetch_sub(weight);
}

Status IoPool::add(Handler* handler, int fd, int thread) {
    handler->thread_ = thread;
    epoll_event ev{};
    ev.events = EPOLLIN | EPOLLOUT | EPOLLRDHUP | EPOLLET;
    ev.data.ptr = handler;
    if (::epoll_ctl(threads_[thread]->epfd, EPOLL_CTL_ADD, fd, &ev) != 0) {
        return errno_status(errno, "epoll_ctl(ADD)");
    }
    return Status();
}

void IoPool::remove(Handler* handler, int fd) {
    Thread* t = threads_[handler->thread_].get();
    if (::epoll_ctl(t->epfd, EPOLL_CTL_DEL, fd, nullptr) != 0 && errno != ENOENT &&
        errno != EBADF) {
        TCPX_WARN("epoll_ctl(DEL, fd %d): %s", fd, std::strerror(errno));
    }
    if (handler->ready_) {
        t->ready.erase(std::remove(t->ready.begin(), t->ready.end(), handler), t->ready.end());
        handler->ready_ = false;
    }
    std::lock_guard<std::mutex> lock(t->mu);
    if (handler->kicked_) {
        t->kicks.erase(std::remove(t->kicks.begin(), t->kicks.end(), handler), t->kicks.end());
        handler->kicked_ = false;
    }
}

void IoPool::kick(Handler* handler) {
    Thread* t = threads_[handler->thread_].get();
    std::lock_guard<std::mutex> lock(t->mu);
    if (!handler->kicked_) {
        t->kicks.push_back(handler);  // (first: out of memory leaves it kickable)
        handler->kicked_ = true;
    }
    wake_locked(t);
}

void IoPool::requeue(Handler* handler) {
    Thread* t = threads_[handler->thread_].get();
    if (!handler->ready_) {
        handler->ready_ = true;
        t->ready.push_back(handler);
    }
}

void IoPool::continue_later(Handler* handler) {
    if (on_thread(handler->thread_)) {
        requeue(handler);
    } else {
        kick(handler);
    }
}

void IoPool::post(int thread, std::function<void()> task) {
    Thread* t = threads_[thread].get();
    std::lock_guard<std::mutex> lock(t->mu);
    t->tasks.push_back(std::move(task));
    wake_locked(t);
}

bool IoPool::on_thread(int thread) const { return tls_current_thread == threads_[thread].get(); }

int IoPool::wait_fd() {
    if (!driven_ || threads_.size() != 1) return -1;
    driven_wakeups_.store(true);
    return threads_[0]->epfd;
}

void IoPool::wake_locked(Thread* t) {
    // Only a thread blocked (or about to block) in epoll_wait needs the eventfd; one that is
    // running checks its lists before it next blocks. A driven pool's caller may sleep on the
    // set at any time (wait_fd()): it gets the eventfd whenever there is no wakeup pending.
    if ((t->sleeping || driven_wakeups_.load(std::memory_order_relaxed)) && !t->wake_pending) {
        const uint64_t one = 1;
        if (::write(t->wakefd, &one, sizeof(one)) < 0 && errno != EAGAIN) {
            TCPX_WARN("eventfd write: %s", std::strerror(errno));
        }
        t->wake_pending = true;
    }
}

namespace {

// A handler's service or a task never lets an exception (out of memory) end a pool thread, and
// with it the process: the handler hears of it (a connection fails its comm), a task's is logged.
void serve(IoPool::Handler* h, uint32_t events) {
    try {
        h->service(events);
    } catch (...) {
        try {
            h->service_failed(status_of_current_exception("socket I/O"));
        } catch (...) {
            TCPX_ERROR("socket I/O: out of memory, and again while failing the connection");
        }
    }
}

void run_task(const std::function<void()>& task) {
    try {
        task();
    } catch (...) {
        try {
            TCPX_ERROR("socket I/O task: %s",
                       status_of_current_exception("socket I/O task").to_string().c_str());
        } catch (...) {
            TCPX_ERROR("socket I/O task: out of memory");
        }
    }
}

}  // namespace

void IoPool::run(Thread* t) {
    tls_current_thread = t;
    while (!t->stop.load(std::memory_order_relaxed)) round(t, true);
    tls_current_thread = nullptr;
}

bool IoPool::drive() {
    if (!driven_) return false;
    bool did = false;
    for (auto& t : threads_) {
        std::unique_lock<std::mutex> lock(t->round_mu, std::try_to_lock);
        if (!lock.owns_lock()) continue;  // another caller is running this round
        const void* outer = tls_current_thread;
        tls_current_thread = t.get();
        did = round(t.get(), false) || did;
        tls_current_thread = outer;
    }
    return did;
}

bool IoPool::round(Thread* t, bool block) {
    constexpr int kMaxEvents = 128;
    epoll_event events[kMaxEvents];
    // The round's own lists, kept in the Thread so that steady traffic allocates nothing.
    std::vector<Handler*>& kicks = t->round_kicks;
    std::vector<std::function<void()>>& tasks = t->round_tasks;
    std::vector<Handler*>& ready = t->round_ready;
    {
        std::lock_guard<std::mutex> lock(t->mu);
        kicks.swap(t->kicks);
        tasks.swap(t->tasks);
        for (Handler* h : kicks) h->kicked_ = false;
    }
    bool did = !kicks.empty() || !tasks.empty();
    for (Handler* h : kicks) serve(h, 0);
    kicks.clear();
    for (auto& task : tasks) run_task(task);
    tasks.clear();

    ready.swap(t->ready);
    for (Handler* h : ready) h->ready_ = false;
    // Swapped after the tasks ran, so a handler removed by a task is not in this list.
    for (Handler* h : ready) serve(h, 0);
    did = did || !ready.empty();
    ready.clear();

    int timeout = -1;
    {
        std::lock_guard<std::mutex> lock(t->mu);
        if (!block || !t->kicks.empty() || !t->tasks.empty() || !t->ready.empty() ||
            t->stop.load(std::memory_order_relaxed)) {
            timeout = 0;
        } else {
            t->sleeping = true;
        }
    }
    const int n = ::epoll_wait(t->epfd, events, kMaxEvents, timeout);
    if (timeout != 0) {
        std::lock_guard<std::mutex> lock(t->mu);
        t->sleeping = false;
    }
    if (n < 0) {
        if (errno != EINTR) TCPX_ERROR("epoll_wait: %s", std::strerror(errno));
        return did;
    }
    for (int i = 0; i < n; ++i) {
        if (events[i].data.ptr == kWakeMarker) {
            uint64_t value = 0;
            while (::read(t->wakefd, &value, sizeof(value)) > 0) {
            }
            std::lock_guard<std::mutex> lock(t->mu);
            t->wake_pending = false;
            // A kick or task that came after this round took the lists, and found the eventfd
            // already written, has no wakeup left: report work so the caller drives again
            // (a thread's next round takes it anyway; a driven pool's caller might sleep).
            did = true;
            continue;
        }
        serve(static_cast<Handler*>(events[i].data.ptr), events[i].events);
        did = true;
    }
    return did;
}

}  // namespace tcpx::net
