// A fixed pool of I/O threads (named tcpx-io-<n>) serving non-blocking sockets with
// edge-triggered epoll.
//
// Each socket (a Handler) belongs to one thread for its whole life, so its I/O state needs no
// lock against other pool threads. The thread count is fixed at creation and never grows with
// peers or connections.
//
// A thread's round: (1) service handlers kicked from other threads, (2) run posted tasks,
// (3) service handlers that asked to continue (requeue), (4) wait in epoll_wait and service the
// sockets it reports. Kicks run before tasks so that a task posted after a kick (closing a
// connection, say) finds that kick already served; a handler is removed only from inside a task
// on its own thread (remove()), after which no event, kick or requeue reaches it.
//
// A driven pool (create(n, kDriven)) starts no threads: its n "threads" are rounds that callers
// run with drive(), each under a lock of its own, so a handler is still served by one thread at a
// time. It is for an endpoint without a progress thread, whose application polls anyway: the
// socket I/O then happens inside the application's own calls, with no thread to wake and no core
// to share with one (on a machine of two cores, the difference between keeping up with a
// transport that does its I/O in the caller's thread, as UCX does, and half of that).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "common/socket.h"
#include "common/wakeup.h"
#include "tcpx/status.h"

namespace tcpx::net {

class IoPool {
 public:
    class Handler {
     public:
        virtual ~Handler() = default;
        // Runs on the handler's thread. `events` are epoll events, or 0 when kicked or requeued.
        // Edge-triggered: the handler reads and writes until the socket would block, or requeues
        // itself when it stops early.
        virtual void service(uint32_t events) = 0;
        // Runs on the handler's thread when service() threw (out of memory): the exception
        // ends there, never the thread. `why` says what it was.
        virtual void service_failed(Status why) = 0;
        // The pool thread serving this handler (-1 before add()).
        int thread() const { return thread_; }

     private:
        friend class IoPool;
        int thread_ = -1;
        bool kicked_ = false;  // in the thread's kick list (guarded by the thread's mutex)
        bool ready_ = false;   // in the thread's ready list (owner thread only)
    };

    enum class Mode { kThreads, kDriven };
    static StatusOr<std::unique_ptr<IoPool>> create(int threads, Mode mode = Mode::kThreads);
    ~IoPool();
    IoPool(const IoPool&) = delete;
    IoPool& operator=(const IoPool&) = delete;

    int size() const { return static_cast<int>(threads_.size()); }
    bool driven() const { return driven_; }

    // A driven pool: runs one round of every thread not being run by another caller, without
    // blocking; true when a round served something (a handler, a kick or a task). A pool with
    // threads: does nothing, false.
    bool drive();
    // A driven pool of one thread: an fd that turns readable (for an outer epoll) when drive()
    // has something to do: a socket event, a kick or a task. From the first call on, kicks and
    // tasks write the thread's wake eventfd (which sits in that set) for whoever sleeps on it.
    // Otherwise -1.
    int wait_fd();

    // What a socket carries, for spreading sockets over the threads: each lane is spread on its
    // own (assign_thread).
    enum class Lane { kControl = 0, kSendData = 1, kRecvData = 2 };
    // The thread with the least weight of `lane`, and of those the least load (weight of all
    // lanes); adds `weight` to its lane there. Pair with unassign().
    int assign_thread(int weight, Lane lane);
    void unassign(int thread, int weight, Lane lane);

    // Registers `fd` for edge-triggered read/write/hang-up events on `thread`. Callable from any
    // thread; events may start arriving before add() returns.
    Status add(Handler* handler, int fd, int thread);
    // Unregisters on the handler's own thread (call from a posted task): no event, kick or requeue
    // reaches the handler afterwards.
    void remove(Handler* handler, int fd);

    // Has `handler` serviced (events = 0) on its thread soon. Callable from any thread.
    void kick(Handler* handler);
    // From the handler's own thread: service it again in the next round without waiting for
    // events (a handler that stopped early to be fair to others).
    void requeue(Handler* handler);
    // requeue() on the handler's thread, kick() from any other (a handler serviced elsewhere
    // that stopped early).
    void continue_later(Handler* handler);
    // Runs `task` on `thread` at the start of its next round.
    void post(int thread, std::function<void()> task);
    // Whether the calling thread is pool thread `thread`.
    bool on_thread(int thread) const;

    // Notified whenever a request of a comm served by this pool finishes (done or failed), from
    // whichever thread finishes it: what Net::completion_wakeup() hands out.
    Wakeup& completions() { return *completions_; }

 private:
    struct Thread {
        int epfd = -1;
        int wakefd = -1;
        std::thread thread;
        std::mutex mu;
        std::vector<Handler*> kicks;               // guarded by mu
        std::vector<std::function<void()>> tasks;  // guarded by mu
        bool sleeping = false;                     // guarded by mu: blocked in epoll_wait
        bool wake_pending = false;                 // guarded by mu: wakefd written, not drained
        std::vector<Handler*> ready;               // owner thread only
        std::atomic<int64_t> lane_load[3] = {0, 0, 0};  // weight assigned, by Lane
        std::atomic<bool> stop{false};
        std::mutex round_mu;  // a driven pool: held by the caller running this thread's round
        // Whoever runs the round (the thread, or a driven pool's caller under round_mu):
        std::vector<Handler*> round_kicks;
        std::vector<std::function<void()>> round_tasks;
        std::vector<Handler*> round_ready;
    };

    IoPool() = default;
    void run(Thread* t);
    // One round of `t` on the calling thread (which is `t` for its duration); `block`: wait in
    // epoll_wait when there is nothing to do. True when something was served.
    bool round(Thread* t, bool block);
    void wake_locked(Thread* t);

    std::vector<std::unique_ptr<Thread>> threads_;
    std::unique_ptr<Wakeup> completions_;
    bool driven_ = false;
    std::atomic<bool> driven_wakeups_{false};  // wait_fd() was asked for
};

}  // namespace tcpx::net
