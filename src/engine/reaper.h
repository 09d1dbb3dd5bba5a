// Destroys objects on a thread of its own, for objects whose destructor may block for long:
// the engine's staging rings, whose cudaFree and cudaFreeHost wait for every kernel on the
// device. Freed under the engine's lock, a disconnect stalled every API call and peer behind the
// application's kernels; freed by the progress thread, it stalled the progress of every other
// peer (the requests it serves, its timers) just as long. The reaper's thread takes no lock of
// the engine's and touches nothing but what it is handed.
//
// The thread starts with the first object handed over and ends with the reaper, which first
// destroys everything it was given: the owner's destructor waits for the device, as it did
// before. Where no thread can be started or no memory is left to queue an object, put() destroys
// it in the caller, as before.
//
// Each object may carry a weight (the bytes it holds), counted in pending() until it is
// destroyed: the engine bounds its staging memory with what it holds plus what is still being
// freed, so memory handed over here is not taken for free before it is.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

namespace tcpx::engine {

template <class T>
class Reaper {
 public:
    Reaper() = default;
    Reaper(const Reaper&) = delete;
    Reaper& operator=(const Reaper&) = delete;
    ~Reaper() {
        {
            std::lock_guard<std::mutex> lock(mu_);
            stop_ = true;
        }
        cv_.notify_all();
        if (thread_.joinable()) thread_.join();
        queue_.clear();  // (only when the thread never started)
    }

    // Hands `obj` over to be destroyed on the reaper's thread, counted in pending() as
    // `weight` until it is.
    void put(std::unique_ptr<T> obj, uint64_t weight = 0) noexcept {
        if (!obj) return;
        {
            std::lock_guard<std::mutex> lock(mu_);
            if (start_locked()) {
                try {
                    queue_.reserve(queue_.size() + 1);  // (obj stays ours if this throws)
                    queue_.push_back(Item{std::move(obj), weight});
                    pending_.fetch_add(weight);
                } catch (const std::bad_alloc&) {
                }
            }
        }
        if (obj) {
            obj.reset();  // no thread or no memory: here, as before
        } else {
            cv_.notify_one();
        }
    }

    // The weight of what was handed over and is not destroyed yet.
    uint64_t pending() const { return pending_.load(); }

    // Returns once everything handed over before the call has been destroyed.
    void drain() {
        std::unique_lock<std::mutex> lock(mu_);
        drained_.wait(lock, [this] { return queue_.empty() && busy_ == 0; });
    }

 private:
    // Starts the thread on first use; false when it cannot be started.
    bool start_locked() noexcept {
        if (thread_.joinable()) return true;
        if (failed_to_start_) return false;
        try {
            thread_ = std::thread([this] { run(); });
            return true;
        } catch (const std::system_error&) {
            failed_to_start_ = true;
            return false;
        }
    }

    void run() {
        std::unique_lock<std::mutex> lock(mu_);
        for (;;) {
            cv_.wait(lock, [this] { return stop_ || !queue_.empty(); });
            if (queue_.empty()) return;  // stopping, and nothing left
            std::vector<Item> batch;
            batch.swap(queue_);
            busy_ = batch.size();
            uint64_t weight = 0;
            for (const Item& item : batch) weight += item.weight;
            lock.unlock();
            batch.clear();  // the destructors, which may wait long, without the lock
            pending_.fetch_sub(weight);
            lock.lock();
            busy_ = 0;
            drained_.notify_all();
        }
    }

    struct Item {
        std::unique_ptr<T> obj;
        uint64_t weight;
    };
    std::mutex mu_;
    std::condition_variable cv_;       // something to destroy, or stop
    std::condition_variable drained_;  // a batch destroyed
    std::vector<Item> queue_;
    std::atomic<uint64_t> pending_{0};
    size_t busy_ = 0;  // objects being destroyed now
    bool stop_ = false;
    bool failed_to_start_ = false;
    std::thread thread_;
};

}  // namespace tcpx::engine
