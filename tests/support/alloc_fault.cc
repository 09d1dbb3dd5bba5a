// The replacement operator new behind AllocFault (alloc_fault.h). Every form of operator new and
// delete is replaced together, over malloc and free (under the sanitizers too: theirs intercept
// malloc), so that memory from one form is never handed to another's delete.
#include "tests/support/alloc_fault.h"

#include <pthread.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <new>

namespace tcpx::test {
namespace {

// Everything atomic: threads allocate while a test arms and disarms (and TSan watches).
std::atomic<bool> g_armed{false};
std::atomic<uint64_t> g_prefix[2];  // the thread-name prefix, 16 bytes, zero-padded
std::atomic<bool> g_this_thread{false};
std::atomic<pthread_t> g_thread{};
std::atomic<long> g_skip{0};
std::atomic<long> g_count{0};
std::atomic<long> g_failed{0};

bool should_fail() {
    if (!g_armed.load(std::memory_order_relaxed)) return false;
    if (g_this_thread.load()) {
        if (!pthread_equal(pthread_self(), g_thread.load())) return false;
    } else {
        char prefix[17] = {};
        const uint64_t words[2] = {g_prefix[0].load(), g_prefix[1].load()};
        std::memcpy(prefix, words, 16);
        char name[16] = {};
        if (pthread_getname_np(pthread_self(), name, sizeof(name)) != 0) return false;
        if (std::strncmp(name, prefix, std::strlen(prefix)) != 0) return false;
    }
    if (g_skip.fetch_sub(1) > 0) return false;
    if (g_count.fetch_sub(1) <= 0) return false;
    g_failed.fetch_add(1);
    return true;
}

void* allocate(std::size_t size, std::size_t align, bool nothrow) {
    if (should_fail()) {
        if (nothrow) return nullptr;
        throw std::bad_alloc();
    }
    if (size == 0) size = 1;
    void* p = nullptr;
    if (align <= alignof(std::max_align_t)) {
        p = std::malloc(size);
    } else if (posix_memalign(&p, align, size) != 0) {
        p = nullptr;
    }
    if (p == nullptr && !nothrow) throw std::bad_alloc();
    return p;
}

}  // namespace

AllocFault::AllocFault(std::string thread_prefix, long skip, long count) {
    g_armed.store(false);
    g_this_thread.store(thread_prefix.empty());
    g_thread.store(pthread_self());
    char prefix[16] = {};
    std::strncpy(prefix, thread_prefix.c_str(), sizeof(prefix) - 1);
    uint64_t words[2];
    std::memcpy(words, prefix, sizeof(words));
    g_prefix[0].store(words[0]);
    g_prefix[1].store(words[1]);
    g_skip.store(skip);
    g_count.store(count);
    g_failed.store(0);
    g_armed.store(true);
}

AllocFault::~AllocFault() { g_armed.store(false); }

long AllocFault::failed() const { return g_failed.load(); }

}  // namespace tcpx::test

using tcpx::test::allocate;

void* operator new(std::size_t n) { return allocate(n, 0, false); }
void* operator new[](std::size_t n) { return allocate(n, 0, false); }
void* operator new(std::size_t n, const std::nothrow_t&) noexcept { return allocate(n, 0, true); }
void* operator new[](std::size_t n, const std::nothrow_t&) noexcept { return allocate(n, 0, true); }
void* operator new(std::size_t n, std::align_val_t a) {
    return allocate(n, static_cast<std::size_t>(a), false);
}
void* operator new[](std::size_t n, std::align_val_t a) {
    return allocate(n, static_cast<std::size_t>(a), false);
}
void* operator new(std::size_t n, std::align_val_t a, const std::nothrow_t&) noexcept {
    return allocate(n, static_cast<std::size_t>(a), true);
}
void* operator new[](std::size_t n, std::align_val_t a, const std::nothrow_t&) noexcept {
    return allocate(n, static_cast<std::size_t>(a), true);
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
void operator delete(void* p, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete[](void* p, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete(void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete(void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }
void operator delete(void* p, std::align_val_t, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete[](void* p, std::align_val_t, const std::nothrow_t&) noexcept { std::free(p); }
