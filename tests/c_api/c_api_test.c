// The C API, driven from C: two endpoints in this process exchange data over loopback through
// every entry point of tcpx/tcpx.h, and bad inputs come back as the documented codes. Built as
// C11 against the public header and the shared library only. Exits non-zero at the first failure.
#define _POSIX_C_SOURCE 200809L

#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tcpx/tcpx.h"

// --- checking ----------------------------------------------------------------------------------

static void fail_at(const char* file, int line, const char* fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "c_api_test: FAILED at %s:%d: ", file, line);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\n  tcpx_last_error(): \"%s\"\n", tcpx_last_error());
    exit(1);
}

#define FAIL(...) fail_at(__FILE__, __LINE__, __VA_ARGS__)
#define CHECK(cond)                                   \
    do {                                              \
        if (!(cond)) FAIL("check failed: %s", #cond); \
    } while (0)
#define CHECK_OK(expr)                                                            \
    do {                                                                          \
        tcpx_status_t st_ = (expr);                                               \
        if (st_ != TCPX_OK) FAIL("%s returned %s", #expr, tcpx_status_name(st_)); \
    } while (0)
// `expr` (a call of tcpx_<fn>(...)) returns `code`, and tcpx_last_error() is the message of this
// very failure: "<CODE>: tcpx_<fn>: ...".
#define CHECK_ERR(expr, code)                                                 \
    do {                                                                      \
        tcpx_status_t st_ = (expr);                                           \
        if (st_ != (code))                                                    \
            FAIL("%s returned %s, expected %s", #expr, tcpx_status_name(st_), \
                 tcpx_status_name(code));                                     \
        check_error_message(__FILE__, __LINE__, #expr, (code));               \
    } while (0)

static void check_error_message(const char* file, int line, const char* expr, tcpx_status_t code) {
    char want[128];
    const char* paren = strchr(expr, '(');
    const int fn_len = paren ? (int)(paren - expr) : (int)strlen(expr);
    snprintf(want, sizeof(want), "%s: %.*s: ", tcpx_status_name(code), fn_len, expr);
    const char* msg = tcpx_last_error();
    if (strncmp(msg, want, strlen(want)) != 0 || strlen(msg) <= strlen(want)) {
        fail_at(file, line, "after %s, tcpx_last_error() should start with \"%s\" and say more",
                expr, want);
    }
}

// A message that must mention `part` (e.g. the piece of a vector that was wrong).
static void check_error_mentions(const char* part) {
    if (strstr(tcpx_last_error(), part) == NULL) {
        FAIL("tcpx_last_error() does not mention \"%s\"", part);
    }
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void sleep_ms(long ms) {
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static uint8_t pattern_byte(uint64_t i, uint32_t seed) {
    return (uint8_t)((i * 131u) ^ (i >> 9) ^ (seed * 0x9du) ^ (seed >> 3));
}

static void fill_pattern(uint8_t* p, uint64_t n, uint32_t seed) {
    for (uint64_t i = 0; i < n; ++i) p[i] = pattern_byte(i, seed);
}

// The first index where `p` differs from the pattern, or -1.
static int64_t pattern_mismatch(const uint8_t* p, uint64_t n, uint32_t seed) {
    for (uint64_t i = 0; i < n; ++i) {
        if (p[i] != pattern_byte(i, seed)) return (int64_t)i;
    }
    return -1;
}

#define CHECK_PATTERN(p, n, seed)                                                              \
    do {                                                                                       \
        int64_t at_ = pattern_mismatch((p), (n), (seed));                                      \
        if (at_ >= 0)                                                                          \
            FAIL("byte %" PRId64 " of %s differs from pattern %u", at_, #p, (unsigned)(seed)); \
    } while (0)

// A buffer with guard bytes on both sides, to catch writes outside the registered range.
enum { kGuard = 64, kGuardByte = 0xa5 };
typedef struct {
    uint8_t* base;
    uint8_t* data;
    uint64_t size;
} guarded_buf;

static guarded_buf buf_new(uint64_t size) {
    guarded_buf b;
    b.base = malloc(size + 2 * kGuard);
    if (b.base == NULL) FAIL("out of memory");
    memset(b.base, kGuardByte, size + 2 * kGuard);
    b.data = b.base + kGuard;
    memset(b.data, 0, size);
    b.size = size;
    return b;
}

static void buf_free(guarded_buf* b) {
    for (int i = 0; i < kGuard; ++i) {
        if (b->base[i] != kGuardByte || b->data[b->size + (uint64_t)i] != kGuardByte) {
            FAIL("a guard byte of a %" PRIu64 "-byte buffer was overwritten", b->size);
        }
    }
    free(b->base);
    b->base = b->data = NULL;
}

// --- shared state ------------------------------------------------------------------------------

static tcpx_endpoint_t* a;  // the initiator
static tcpx_endpoint_t* b;  // the target
static uint64_t a_to_b;     // b, as a knows it
static uint64_t b_to_a;     // a, as b knows it

enum { kTimeoutMs = 20000 };
#define MiB (1024u * 1024u)

// A registration's descriptor, fetched with the size-query convention.
typedef struct {
    uint8_t bytes[256];
    size_t len;
} desc_t;

static desc_t describe(tcpx_endpoint_t* ep, uint64_t mem) {
    desc_t d;
    d.len = 0;
    CHECK_ERR(tcpx_mem_descriptor(ep, mem, NULL, &d.len), TCPX_ERR_RESOURCE_EXHAUSTED);
    CHECK(d.len > 0 && d.len <= sizeof(d.bytes));
    const size_t needed = d.len;
    d.len = needed - 1;
    CHECK_ERR(tcpx_mem_descriptor(ep, mem, d.bytes, &d.len), TCPX_ERR_RESOURCE_EXHAUSTED);
    CHECK(d.len == needed);
    d.len = sizeof(d.bytes);
    CHECK_OK(tcpx_mem_descriptor(ep, mem, d.bytes, &d.len));
    CHECK(d.len == needed);
    return d;
}

// Polls until the transfer finishes; returns its result.
static tcpx_status_t poll_until_done(tcpx_endpoint_t* ep, uint64_t xfer) {
    const double deadline = now_s() + kTimeoutMs / 1000.0;
    for (;;) {
        int done = -1;
        tcpx_status_t st = tcpx_poll(ep, xfer, &done);
        CHECK(done == 0 || done == 1);
        if (done) return st;
        CHECK(st == TCPX_OK);
        if (now_s() > deadline) FAIL("transfer %" PRIx64 " still in flight", xfer);
        sleep_ms(1);
    }
}

// Takes the next notification of `ep`, waiting for one to arrive. Returns the payload length.
static size_t next_notification(tcpx_endpoint_t* ep, char* name, size_t name_len, void* payload,
                                size_t cap) {
    const double deadline = now_s() + kTimeoutMs / 1000.0;
    for (;;) {
        size_t len = cap;
        tcpx_status_t st = tcpx_get_notification(ep, name, name_len, payload, &len);
        if (st == TCPX_OK) return len;
        if (st != TCPX_ERR_NOT_FOUND) FAIL("tcpx_get_notification: %s", tcpx_status_name(st));
        if (now_s() > deadline) FAIL("no notification arrived");
        sleep_ms(1);
    }
}

static tcpx_config_t* loopback_config(void) {
    tcpx_config_t* cfg = NULL;
    CHECK_OK(tcpx_config_new(&cfg));
    CHECK(cfg != NULL);
    CHECK_OK(tcpx_config_set(cfg, "SOCKET_IFNAME", "=lo"));
    CHECK_OK(tcpx_config_set(cfg, "SOCKET_FAMILY", "ipv4"));
    CHECK_OK(tcpx_config_set(cfg, "NSOCKS", "2"));
    CHECK_OK(tcpx_config_set(cfg, "IO_THREADS", "2"));
    CHECK_OK(tcpx_config_set(cfg, "PEER_TIMEOUT_MS", "5000"));
    return cfg;
}

// --- the tests ---------------------------------------------------------------------------------

static void test_status_names(void) {
    CHECK(strcmp(tcpx_last_error(), "") == 0);  // nothing failed on this thread yet
    CHECK(strcmp(tcpx_status_name(TCPX_OK), "OK") == 0);
    CHECK(strcmp(tcpx_status_name(TCPX_ERR_INVALID_ARGUMENT), "INVALID_ARGUMENT") == 0);
    CHECK(strcmp(tcpx_status_name(TCPX_ERR_RESOURCE_EXHAUSTED), "RESOURCE_EXHAUSTED") == 0);
    CHECK(strcmp(tcpx_status_name(TCPX_ERR_TIMEOUT), "TIMEOUT") == 0);
    CHECK(strcmp(tcpx_status_name(TCPX_ERR_INTERNAL), "INTERNAL") == 0);
    CHECK(strcmp(tcpx_status_name((tcpx_status_t)99), "UNKNOWN") == 0);
    CHECK(strcmp(tcpx_status_name((tcpx_status_t)-1), "UNKNOWN") == 0);
}

static void test_config(void) {
    CHECK_ERR(tcpx_config_new(NULL), TCPX_ERR_INVALID_ARGUMENT);
    CHECK_ERR(tcpx_config_from_env(NULL), TCPX_ERR_INVALID_ARGUMENT);
    tcpx_config_t* cfg = NULL;
    CHECK_OK(tcpx_config_new(&cfg));
    CHECK_ERR(tcpx_config_set(cfg, "NO_SUCH_SETTING", "1"), TCPX_ERR_INVALID_ARGUMENT);
    check_error_mentions("NO_SUCH_SETTING");
    CHECK_ERR(tcpx_config_set(cfg, "NSOCKS", "many"), TCPX_ERR_INVALID_ARGUMENT);
    check_error_mentions("NSOCKS");
    CHECK_ERR(tcpx_config_set(cfg, "NSOCKS", "1000"), TCPX_ERR_OUT_OF_RANGE);
    CHECK_ERR(tcpx_config_set(cfg, "SOCKET_FAMILY", "ipx"), TCPX_ERR_INVALID_ARGUMENT);
    CHECK_ERR(tcpx_config_set(NULL, "NSOCKS", "2"), TCPX_ERR_INVALID_ARGUMENT);
    CHECK_ERR(tcpx_config_set(cfg, NULL, "2"), TCPX_ERR_INVALID_ARGUMENT);
    CHECK_ERR(tcpx_config_set(cfg, "NSOCKS", NULL), TCPX_ERR_INVALID_ARGUMENT);
    CHECK_OK(tcpx_config_set(cfg, "tcpx_p2p_nsocks", "4"));  // prefix and case are optional
    CHECK_OK(tcpx_config_set(cfg, "CHUNK_SIZE", "64K"));
    // Checks across settings wait for tcpx_endpoint_create.
    CHECK_OK(tcpx_config_set(cfg, "MIN_CHUNK_SIZE", "1MiB"));
    tcpx_endpoint_t* ep = (tcpx_endpoint_t*)&ep;  // must stay untouched on failure
    CHECK_ERR(tcpx_endpoint_create(cfg, "x", &ep), TCPX_ERR_INVALID_ARGUMENT);
    CHECK(ep == (tcpx_endpoint_t*)&ep);
    tcpx_config_free(cfg);
    tcpx_config_free(NULL);

    // From the environment: invalid values are errors naming the variable.
    tcpx_config_t* env = NULL;
    setenv("TCPX_P2P_NSOCKS", "zero", 1);
    CHECK_ERR(tcpx_config_from_env(&env), TCPX_ERR_INVALID_ARGUMENT);
    check_error_mentions("TCPX_P2P_NSOCKS");
    CHECK(env == NULL);
    CHECK_ERR(tcpx_endpoint_create(NULL, "x", &ep), TCPX_ERR_INVALID_ARGUMENT);
    setenv("TCPX_P2P_NSOCKS", "65", 1);
    CHECK_ERR(tcpx_config_from_env(&env), TCPX_ERR_OUT_OF_RANGE);
    setenv("TCPX_P2P_NSOCKS", "3", 1);
    CHECK_OK(tcpx_config_from_env(&env));
    CHECK(env != NULL);
    tcpx_config_free(env);

    // A NULL configuration is the environment's.
    setenv("TCPX_P2P_SOCKET_IFNAME", "=lo", 1);
    setenv("TCPX_P2P_SOCKET_FAMILY", "ipv4", 1);
    setenv("TCPX_P2P_IO_THREADS", "1", 1);
    ep = NULL;
    CHECK_OK(tcpx_endpoint_create(NULL, "from-env", &ep));
    CHECK(ep != NULL);
    CHECK(strcmp(tcpx_endpoint_name(ep), "from-env") == 0);
    tcpx_endpoint_destroy(ep);
    unsetenv("TCPX_P2P_NSOCKS");
    unsetenv("TCPX_P2P_SOCKET_IFNAME");
    unsetenv("TCPX_P2P_SOCKET_FAMILY");
    unsetenv("TCPX_P2P_IO_THREADS");
    tcpx_endpoint_destroy(NULL);
}

static void test_endpoints_and_metadata(tcpx_config_t* cfg) {
    CHECK_ERR(tcpx_endpoint_create(cfg, "a", NULL), TCPX_ERR_INVALID_ARGUMENT);
    char long_name[TCPX_NAME_MAX + 2];
    memset(long_name, 'n', sizeof(long_name) - 1);
    long_name[sizeof(long_name) - 1] = '\0';
    tcpx_endpoint_t* ep = NULL;
    CHECK_ERR(tcpx_endpoint_create(cfg, long_name, &ep), TCPX_ERR_INVALID_ARGUMENT);
    CHECK(ep == NULL);
    long_name[TCPX_NAME_MAX] = '\0';  // exactly the limit
    CHECK_OK(tcpx_endpoint_create(cfg, long_name, &ep));
    CHECK(strcmp(tcpx_endpoint_name(ep), long_name) == 0);
    tcpx_endpoint_destroy(ep);

    CHECK_OK(tcpx_endpoint_create(cfg, "a", &a));
    CHECK_OK(tcpx_endpoint_create(cfg, "b", &b));
    CHECK(strcmp(tcpx_endpoint_name(a), "a") == 0);
    CHECK(strcmp(tcpx_endpoint_name(b), "b") == 0);
    CHECK(tcpx_endpoint_name(NULL) == NULL);
    CHECK(strncmp(tcpx_last_error(), "INVALID_ARGUMENT: tcpx_endpoint_name: ", 38) == 0);

    // Metadata: size query, too small, exact, larger.
    size_t md_len = 0;
    CHECK_ERR(tcpx_endpoint_metadata(b, NULL, &md_len), TCPX_ERR_RESOURCE_EXHAUSTED);
    CHECK(md_len > 0);
    const size_t md_size = md_len;
    uint8_t* md = malloc(md_size + 16);
    CHECK(md != NULL);
    md_len = md_size - 1;
    CHECK_ERR(tcpx_endpoint_metadata(b, md, &md_len), TCPX_ERR_RESOURCE_EXHAUSTED);
    CHECK(md_len == md_size);
    md_len = md_size + 16;
    CHECK_OK(tcpx_endpoint_metadata(b, md, &md_len));
    CHECK(md_len == md_size);
    CHECK_ERR(tcpx_endpoint_metadata(NULL, md, &md_len), TCPX_ERR_INVALID_ARGUMENT);
    CHECK_ERR(tcpx_endpoint_metadata(b, md, NULL), TCPX_ERR_INVALID_ARGUMENT);

    tcpx_endpoint_info_t info;
    memset(&info, 0x7f, sizeof(info));
    CHECK_OK(tcpx_parse_metadata(md, md_len, &info));
    CHECK(strcmp(info.name, "b") == 0);
    CHECK(strcmp(info.host, "127.0.0.1") == 0);
    CHECK(info.port != 0);
    CHECK(info.gpu == -1);
    CHECK_ERR(tcpx_parse_metadata(md, md_len - 1, &info), TCPX_ERR_INVALID_ARGUMENT);
    CHECK_ERR(tcpx_parse_metadata("garbage!garbage!garbage!", 24, &info),
              TCPX_ERR_INVALID_ARGUMENT);
    CHECK_ERR(tcpx_parse_metadata(NULL, 10, &info), TCPX_ERR_INVALID_ARGUMENT);
    CHECK_ERR(tcpx_parse_metadata(md, md_len, NULL), TCPX_ERR_INVALID_ARGUMENT);

    // An unnamed endpoint is called "<host>:<port>".
    CHECK_OK(tcpx_endpoint_create(cfg, NULL, &ep));
    uint8_t md2[512];
    size_t md2_len = sizeof(md2);
    CHECK_OK(tcpx_endpoint_metadata(ep, md2, &md2_len));
    tcpx_endpoint_info_t info2;
    CHECK_OK(tcpx_parse_metadata(md2, md2_len, &info2));
    char expect[128];
    snprintf(expect, sizeof(expect), "127.0.0.1:%u", (unsigned)info2.port);
    CHECK(strcmp(tcpx_endpoint_name(ep), expect) == 0);
    CHECK(strcmp(info2.name, expect) == 0);
    tcpx_endpoint_destroy(ep);
    ep = NULL;
    CHECK_OK(tcpx_endpoint_create(cfg, "", &ep));
    CHECK(strchr(tcpx_endpoint_name(ep), ':') != NULL);
    tcpx_endpoint_destroy(ep);

    // Peers.
    uint64_t peer = 0;
    CHECK_ERR(tcpx_connect(a, "garbage!garbage!garbage!", 24, &peer), TCPX_ERR_INVALID_ARGUMENT);
    CHECK_ERR(tcpx_connect(a, NULL, md_len, &peer), TCPX_ERR_INVALID_ARGUMENT);
    CHECK_ERR(tcpx_connect(a, md, md_len, NULL), TCPX_ERR_INVALID_ARGUMENT);
    CHECK_ERR(tcpx_connect(NULL, md, md_len, &peer), TCPX_ERR_INVALID_ARGUMENT);
    CHECK(peer == 0);
    CHECK_OK(tcpx_connect(a, md, md_len, &a_to_b));
    CHECK(a_to_b != 0);
    CHECK_OK(tcpx_accept(b, 5000, &b_to_a));
    CHECK(b_to_a != 0);
    CHECK_ERR(tcpx_accept(b, 50, &peer), TCPX_ERR_TIMEOUT);
    CHECK_ERR(tcpx_accept(b, 0, NULL), TCPX_ERR_INVALID_ARGUMENT);
    CHECK_ERR(tcpx_accept(NULL, 0, &peer), TCPX_ERR_INVALID_ARGUMENT);
    // connect_async: returns at once; the connection is up soon after.
    uint64_t later = 0;
    CHECK_ERR(tcpx_connect_async(a, "garbage!garbage!garbage!", 24, &later),
              TCPX_ERR_INVALID_ARGUMENT);
    CHECK_ERR(tcpx_connect_async(a, md, md_len, NULL), TCPX_ERR_INVALID_ARGUMENT);
    CHECK_OK(tcpx_connect_async(a, md, md_len, &later));
    CHECK(later != 0 && later != a_to_b);
    tcpx_status_t st = TCPX_ERR_FAILED_PRECONDITION;
    for (int i = 0; i < 5000 && st == TCPX_ERR_FAILED_PRECONDITION; ++i) {
        st = tcpx_peer_status(a, later);
        if (st == TCPX_ERR_FAILED_PRECONDITION) sleep_ms(1);
    }
    CHECK(st == TCPX_OK);
    uint64_t again = 0;
    CHECK_OK(tcpx_accept(b, 5000, &again));
    CHECK_OK(tcpx_disconnect(a, later));
    CHECK_ERR(tcpx_peer_status(a, later), TCPX_ERR_NOT_FOUND);
    CHECK_OK(tcpx_disconnect(b, again));
    // md is b's metadata: a's peer b is b; b's peer a is not.
    CHECK_OK(tcpx_peer_matches(a, a_to_b, md, md_len));
    CHECK_ERR(tcpx_peer_matches(b, b_to_a, md, md_len), TCPX_ERR_UNAUTHENTICATED);
    CHECK_ERR(tcpx_peer_matches(a, a_to_b, "garbage!garbage!garbage!", 24),
              TCPX_ERR_INVALID_ARGUMENT);
    CHECK_ERR(tcpx_peer_matches(a, 424242, md, md_len), TCPX_ERR_NOT_FOUND);
    CHECK_ERR(tcpx_peer_matches(a, a_to_b, NULL, md_len), TCPX_ERR_INVALID_ARGUMENT);
    CHECK_ERR(tcpx_peer_matches(NULL, a_to_b, md, md_len), TCPX_ERR_INVALID_ARGUMENT);
    free(md);

    char name[TCPX_NAME_MAX + 1];
    CHECK_OK(tcpx_peer_name(a, a_to_b, name, sizeof(name)));
    CHECK(strcmp(name, "b") == 0);
    CHECK_OK(tcpx_peer_name(b, b_to_a, name, sizeof(name)));
    CHECK(strcmp(name, "a") == 0);
    char tiny[2] = {'x', 'x'};
    CHECK_OK(tcpx_peer_name(a, a_to_b, tiny, 2));  // "b" and its terminator: exactly
    CHECK(tiny[0] == 'b' && tiny[1] == '\0');
    CHECK_ERR(tcpx_peer_name(a, a_to_b, tiny, 1), TCPX_ERR_RESOURCE_EXHAUSTED);
    CHECK_ERR(tcpx_peer_name(a, a_to_b, NULL, 10), TCPX_ERR_INVALID_ARGUMENT);
    CHECK_ERR(tcpx_peer_name(a, 424242, name, sizeof(name)), TCPX_ERR_NOT_FOUND);
    CHECK_ERR(tcpx_peer_name(NULL, a_to_b, name, sizeof(name)), TCPX_ERR_INVALID_ARGUMENT);
    CHECK_OK(tcpx_peer_status(a, a_to_b));
    CHECK_OK(tcpx_peer_status(b, b_to_a));
    CHECK_ERR(tcpx_peer_status(a, 424242), TCPX_ERR_NOT_FOUND);
    CHECK_ERR(tcpx_peer_status(NULL, a_to_b), TCPX_ERR_INVALID_ARGUMENT);
}

// write (with a notification), then read back what the target changed meanwhile.
//
// A target region is never written after a read served from it: in one process, ThreadSanitizer
// cannot see that the target's I/O thread is done with it (the hand-off is through a socket).
static void test_write_read(uint64_t size) {
    guarded_buf src = buf_new(size), dst = buf_new(size), dst2 = buf_new(size),
                back = buf_new(size);
    const uint32_t seed = (uint32_t)size;
    fill_pattern(src.data, size, seed);
    uint64_t ms = 0, mb = 0, md = 0, md2 = 0;
    CHECK_OK(tcpx_reg(a, src.data, size, &ms));
    CHECK_OK(tcpx_reg(a, back.data, size, &mb));
    CHECK_OK(tcpx_reg(b, dst.data, size, &md));
    CHECK_OK(tcpx_reg(b, dst2.data, size, &md2));
    CHECK(ms != 0 && mb != 0 && md != 0 && ms != mb && md != md2);
    desc_t rd = describe(b, md), rd2 = describe(b, md2);

    // Binary payload: zeros inside, no terminator.
    uint8_t note[32];
    const int note_len = snprintf((char*)note, sizeof(note), "note%c%" PRIu64, 0, size);
    CHECK(note_len > 5);
    uint64_t x = 0;
    CHECK_OK(
        tcpx_write(a, a_to_b, ms, 0, rd.bytes, rd.len, 0, size, note, (size_t)note_len, 1, &x));
    CHECK(x != 0);
    CHECK_OK(tcpx_wait(a, x, kTimeoutMs));
    CHECK_PATTERN(dst.data, size, seed);
    CHECK_ERR(tcpx_wait(a, x, 0), TCPX_ERR_INVALID_ARGUMENT);  // reported once, then forgotten

    // The notification: size query, name buffer too small, then for real; it stays until taken.
    char name[TCPX_NAME_MAX + 1];
    size_t len = 0;
    const double deadline = now_s() + kTimeoutMs / 1000.0;
    tcpx_status_t st;
    while ((st = tcpx_get_notification(b, name, sizeof(name), NULL, &len)) == TCPX_ERR_NOT_FOUND) {
        if (now_s() > deadline) FAIL("no notification after the write");
        sleep_ms(1);
    }
    CHECK(st == TCPX_ERR_RESOURCE_EXHAUSTED);
    CHECK(len == (size_t)note_len);
    uint8_t got[64];
    len = sizeof(got);
    CHECK_ERR(tcpx_get_notification(b, name, 1, got, &len), TCPX_ERR_RESOURCE_EXHAUSTED);
    CHECK(len == (size_t)note_len);
    len = (size_t)note_len - 1;
    CHECK_ERR(tcpx_get_notification(b, name, sizeof(name), got, &len), TCPX_ERR_RESOURCE_EXHAUSTED);
    CHECK(len == (size_t)note_len);
    len = sizeof(got);
    CHECK_OK(tcpx_get_notification(b, name, sizeof(name), got, &len));
    CHECK(len == (size_t)note_len);
    CHECK(memcmp(got, note, len) == 0);
    CHECK(strcmp(name, "a") == 0);
    len = sizeof(got);
    CHECK_ERR(tcpx_get_notification(b, name, sizeof(name), got, &len), TCPX_ERR_NOT_FOUND);

    // A write with an empty notification, over what the first one left.
    memset(dst.data, 0, size);
    CHECK_OK(tcpx_write(a, a_to_b, ms, 0, rd.bytes, rd.len, 0, size, NULL, 0, 1, &x));
    CHECK_OK(tcpx_wait(a, x, kTimeoutMs));
    CHECK(next_notification(b, name, sizeof(name), NULL, 0) == 0);
    CHECK(strcmp(name, "a") == 0);
    CHECK_PATTERN(dst.data, size, seed);

    // The target changes its region; the initiator reads it (polling for completion), with a
    // notification that the target receives once the read is complete.
    fill_pattern(dst.data, size, seed + 1);
    CHECK_OK(tcpx_read(a, a_to_b, mb, 0, rd.bytes, rd.len, 0, size, "rd", 2, 1, &x));
    CHECK_OK(poll_until_done(a, x));
    CHECK_PATTERN(back.data, size, seed + 1);
    int done = 0;
    CHECK_ERR(tcpx_poll(a, x, &done), TCPX_ERR_INVALID_ARGUMENT);
    CHECK(done == 1);
    len = sizeof(got);
    CHECK(next_notification(b, name, sizeof(name), got, len) == 2);
    CHECK(memcmp(got, "rd", 2) == 0 && strcmp(name, "a") == 0);

    // Parts of regions: the middle of the source to the end of the target, and back.
    const uint64_t part = size / 2, at = size / 4, to = size - part;
    CHECK_OK(tcpx_write(a, a_to_b, ms, at, rd2.bytes, rd2.len, to, part, NULL, 0, 0, &x));
    CHECK_OK(tcpx_wait(a, x, kTimeoutMs));
    for (uint64_t i = 0; i < size; ++i) {
        const uint8_t want = i >= to ? pattern_byte(i - to + at, seed) : 0;
        if (dst2.data[i] != want) FAIL("partial write: byte %" PRIu64 " is wrong", i);
    }
    len = sizeof(got);
    CHECK_ERR(tcpx_get_notification(b, name, sizeof(name), got, &len), TCPX_ERR_NOT_FOUND);
    memset(back.data, 0, size);
    CHECK_OK(tcpx_read(a, a_to_b, mb, 1, rd2.bytes, rd2.len, to, part, NULL, 0, 0, &x));
    CHECK_OK(tcpx_wait(a, x, -1));
    CHECK(back.data[0] == 0);
    for (uint64_t i = 0; i < part; ++i) {
        if (back.data[1 + i] != pattern_byte(i + at, seed)) {
            FAIL("partial read: byte %" PRIu64 " is wrong", i);
        }
    }

    CHECK_OK(tcpx_dereg(a, ms));
    CHECK_OK(tcpx_dereg(a, mb));
    CHECK_OK(tcpx_dereg(b, md));
    CHECK_OK(tcpx_dereg(b, md2));
    buf_free(&src);
    buf_free(&dst);
    buf_free(&dst2);
    buf_free(&back);
}

// Several pieces, over two target registrations, as one transfer; then read them back.
static void test_writev_readv(int large) {
    const uint64_t size = large ? 6 * MiB : 4096;
    const uint64_t size2 = large ? 64 * 1024 : 512;
    guarded_buf src = buf_new(size), dst = buf_new(size), dst2 = buf_new(size2),
                back = buf_new(size);
    const uint32_t seed = 77 + (uint32_t)large;
    fill_pattern(src.data, size, seed);
    uint64_t ms, mb, md, md2;
    CHECK_OK(tcpx_reg(a, src.data, size, &ms));
    CHECK_OK(tcpx_reg(a, back.data, size, &mb));
    CHECK_OK(tcpx_reg(b, dst.data, size, &md));
    CHECK_OK(tcpx_reg(b, dst2.data, size2, &md2));
    desc_t d1 = describe(b, md), d2 = describe(b, md2);
    // {local offset, remote region, remote offset, length}
    const uint64_t u = size / 6;  // 1 MiB or 682 bytes
    struct {
        uint64_t off;
        int second;
        uint64_t roff;
        uint64_t len;
    } pieces[] = {
        {0, 0, 5 * u, 100},       {100, 0, 0, 2 * u + 5},       {3 * u, 0, 2 * u + 1000 % u, u},
        {5 * u, 1, size2 / 2, 7}, {4 * u + 3, 1, 0, size2 / 4},
    };
    enum { kPieces = sizeof(pieces) / sizeof(pieces[0]) };
    tcpx_iov_t iov[kPieces];
    for (int i = 0; i < kPieces; ++i) {
        iov[i].mem = ms;
        iov[i].offset = pieces[i].off;
        iov[i].remote_desc = pieces[i].second ? d2.bytes : d1.bytes;
        iov[i].remote_desc_len = pieces[i].second ? d2.len : d1.len;
        iov[i].remote_offset = pieces[i].roff;
        iov[i].len = pieces[i].len;
    }
    uint64_t x;
    CHECK_OK(tcpx_writev(a, a_to_b, iov, kPieces, "vec", 3, 1, &x));
    CHECK_OK(tcpx_wait(a, x, kTimeoutMs));
    // Every written byte is the source's; every other one still zero.
    uint8_t* expect = calloc(size, 1);
    uint8_t* expect2 = calloc(size2, 1);
    CHECK(expect != NULL && expect2 != NULL);
    for (int i = 0; i < kPieces; ++i) {
        uint8_t* e = pieces[i].second ? expect2 : expect;
        memcpy(e + pieces[i].roff, src.data + pieces[i].off, pieces[i].len);
    }
    CHECK(memcmp(dst.data, expect, size) == 0);
    CHECK(memcmp(dst2.data, expect2, size2) == 0);
    char name[TCPX_NAME_MAX + 1];
    char payload[8];
    CHECK(next_notification(b, name, sizeof(name), payload, sizeof(payload)) == 3);
    CHECK(memcmp(payload, "vec", 3) == 0 && strcmp(name, "a") == 0);

    // Read the same pieces back into `back`, at the source's offsets, with a notification.
    for (int i = 0; i < kPieces; ++i) iov[i].mem = mb;
    CHECK_OK(tcpx_readv(a, a_to_b, iov, kPieces, "back", 4, 1, &x));
    CHECK_OK(poll_until_done(a, x));
    for (int i = 0; i < kPieces; ++i) {
        if (memcmp(back.data + pieces[i].off, src.data + pieces[i].off, pieces[i].len) != 0) {
            FAIL("readv: piece %d differs", i);
        }
    }
    CHECK(next_notification(b, name, sizeof(name), payload, sizeof(payload)) == 4);
    CHECK(memcmp(payload, "back", 4) == 0 && strcmp(name, "a") == 0);

    // No pieces at all: a transfer that completes at once (and no notification without one).
    CHECK_OK(tcpx_writev(a, a_to_b, NULL, 0, NULL, 0, 0, &x));
    CHECK_OK(tcpx_wait(a, x, kTimeoutMs));
    CHECK_OK(tcpx_readv(a, a_to_b, NULL, 0, NULL, 0, 0, &x));
    CHECK_OK(tcpx_wait(a, x, kTimeoutMs));
    // With one, the target still hears of it; the sentinel after it shows there was one only.
    CHECK_OK(tcpx_readv(a, a_to_b, NULL, 0, "none", 4, 1, &x));
    CHECK_OK(tcpx_wait(a, x, kTimeoutMs));
    CHECK_OK(tcpx_notify(a, a_to_b, "end", 3));
    CHECK(next_notification(b, name, sizeof(name), payload, sizeof(payload)) == 4);
    CHECK(memcmp(payload, "none", 4) == 0);
    CHECK(next_notification(b, name, sizeof(name), payload, sizeof(payload)) == 3);
    CHECK(memcmp(payload, "end", 3) == 0);

    free(expect);
    free(expect2);
    CHECK_OK(tcpx_dereg(a, ms));
    CHECK_OK(tcpx_dereg(a, mb));
    CHECK_OK(tcpx_dereg(b, md));
    CHECK_OK(tcpx_dereg(b, md2));
    buf_free(&src);
    buf_free(&dst);
    buf_free(&dst2);
    buf_free(&back);
}

// Tags match sends to receives whatever the order of posting.
static void test_send_recv(uint64_t size) {
    guarded_buf s1 = buf_new(size), s2 = buf_new(size), r1 = buf_new(size + 100),
                r2 = buf_new(size);
    const uint32_t seed = 1000 + (uint32_t)size;
    fill_pattern(s1.data, size, seed);
    fill_pattern(s2.data, size, seed + 1);
    uint64_t m1, m2, n1, n2;
    CHECK_OK(tcpx_reg(a, s1.data, size, &m1));
    CHECK_OK(tcpx_reg(a, s2.data, size, &m2));
    CHECK_OK(tcpx_reg(b, r1.data, size + 100, &n1));
    CHECK_OK(tcpx_reg(b, r2.data, size, &n2));

    // Receives first (tag 9, then 7); sends in the other order.
    uint64_t rx9, rx7, tx7, tx9;
    CHECK_OK(tcpx_recv(b, b_to_a, n1, 0, size + 100, 9, &rx9));  // larger than the send: fine
    CHECK_OK(tcpx_recv(b, b_to_a, n2, 0, size, 7, &rx7));
    CHECK_OK(tcpx_send(a, a_to_b, m1, 0, size, 7, &tx7));
    CHECK_OK(tcpx_send(a, a_to_b, m2, 0, size, 9, &tx9));
    CHECK_OK(tcpx_wait(a, tx7, kTimeoutMs));
    CHECK_OK(poll_until_done(a, tx9));
    CHECK_OK(tcpx_wait(b, rx9, kTimeoutMs));
    CHECK_OK(poll_until_done(b, rx7));
    CHECK_PATTERN(r2.data, size, seed);      // tag 7 <- s1
    CHECK_PATTERN(r1.data, size, seed + 1);  // tag 9 <- s2

    // A send before its receive is posted.
    memset(r2.data, 0, size);
    uint64_t tx, rx;
    CHECK_OK(tcpx_send(a, a_to_b, m1, 0, size, 11, &tx));
    sleep_ms(20);
    CHECK_OK(tcpx_recv(b, b_to_a, n2, 0, size, 11, &rx));
    CHECK_OK(tcpx_wait(b, rx, kTimeoutMs));
    CHECK_OK(tcpx_wait(a, tx, kTimeoutMs));
    CHECK_PATTERN(r2.data, size, seed);

    // A receive with nobody sending is in flight: wait times out, poll says not done.
    CHECK_OK(tcpx_recv(b, b_to_a, n2, 0, size, 42, &rx));
    CHECK_ERR(tcpx_wait(b, rx, 0), TCPX_ERR_TIMEOUT);
    CHECK_ERR(tcpx_wait(b, rx, 30), TCPX_ERR_TIMEOUT);
    int done = -1;
    CHECK_OK(tcpx_poll(b, rx, &done));
    CHECK(done == 0);
    CHECK_OK(tcpx_send(a, a_to_b, m2, 0, size, 42, &tx));
    CHECK_OK(tcpx_wait(b, rx, -1));
    CHECK_OK(tcpx_wait(a, tx, kTimeoutMs));
    CHECK_PATTERN(r2.data, size, seed + 1);

    // A send larger than its receive fails on both sides.
    CHECK_OK(tcpx_recv(b, b_to_a, n2, 0, size / 2, 43, &rx));
    CHECK_OK(tcpx_send(a, a_to_b, m1, 0, size, 43, &tx));
    CHECK_ERR(tcpx_wait(b, rx, kTimeoutMs), TCPX_ERR_OUT_OF_RANGE);
    CHECK_ERR(tcpx_wait(a, tx, kTimeoutMs), TCPX_ERR_OUT_OF_RANGE);

    // A receive no send has matched is cancelled: it fails with CANCELLED, and a send with its
    // tag that comes later meets the next receive. A send, on the wire, cannot be.
    CHECK_OK(tcpx_recv(b, b_to_a, n2, 0, size, 44, &rx));
    CHECK_OK(tcpx_cancel(b, rx));
    CHECK_ERR(tcpx_wait(b, rx, kTimeoutMs), TCPX_ERR_CANCELLED);
    CHECK_ERR(tcpx_cancel(b, rx), TCPX_ERR_INVALID_ARGUMENT);  // reported: unknown
    memset(r2.data, 0, size);
    CHECK_OK(tcpx_send(a, a_to_b, m1, 0, size, 44, &tx));
    CHECK_ERR(tcpx_cancel(a, tx), TCPX_ERR_FAILED_PRECONDITION);
    CHECK_OK(tcpx_recv(b, b_to_a, n2, 0, size, 44, &rx));
    CHECK_OK(tcpx_wait(b, rx, kTimeoutMs));
    CHECK_OK(tcpx_wait(a, tx, kTimeoutMs));
    CHECK_PATTERN(r2.data, size, seed);
    CHECK_ERR(tcpx_cancel(NULL, rx), TCPX_ERR_INVALID_ARGUMENT);

    // Bad arguments.
    CHECK_ERR(tcpx_send(a, a_to_b, m1, 1, size, 1, &tx), TCPX_ERR_OUT_OF_RANGE);
    CHECK_ERR(tcpx_recv(b, b_to_a, n2, size, 1, 1, &rx), TCPX_ERR_OUT_OF_RANGE);
    CHECK_ERR(tcpx_send(a, a_to_b, 987654, 0, size, 1, &tx), TCPX_ERR_NOT_FOUND);
    CHECK_ERR(tcpx_recv(b, 987654, n2, 0, size, 1, &rx), TCPX_ERR_NOT_FOUND);
    CHECK_ERR(tcpx_send(a, a_to_b, m1, 0, size, 1, NULL), TCPX_ERR_INVALID_ARGUMENT);
    CHECK_ERR(tcpx_recv(NULL, b_to_a, n2, 0, size, 1, &rx), TCPX_ERR_INVALID_ARGUMENT);

    CHECK_OK(tcpx_dereg(a, m1));
    CHECK_OK(tcpx_dereg(a, m2));
    CHECK_OK(tcpx_dereg(b, n1));
    CHECK_OK(tcpx_dereg(b, n2));
    buf_free(&s1);
    buf_free(&s2);
    buf_free(&r1);
    buf_free(&r2);
}

// Notifications on their own, in order, and one large enough to need a size query.
static void test_notify(void) {
    CHECK_OK(tcpx_notify(a, a_to_b, "one", 3));
    CHECK_OK(tcpx_notify(a, a_to_b, NULL, 0));
    const size_t big_len = 100000;
    uint8_t* big = malloc(big_len);
    CHECK(big != NULL);
    fill_pattern(big, big_len, 5);
    CHECK_OK(tcpx_notify(a, a_to_b, big, big_len));
    CHECK_OK(tcpx_notify(a, a_to_b, "four", 4));
    CHECK_OK(tcpx_notify(b, b_to_a, "back", 4));

    char name[TCPX_NAME_MAX + 1];
    char small[16];
    CHECK(next_notification(b, name, sizeof(name), small, sizeof(small)) == 3);
    CHECK(memcmp(small, "one", 3) == 0 && strcmp(name, "a") == 0);
    CHECK(next_notification(b, NULL, 0, small, sizeof(small)) == 0);  // the name is optional
    size_t len = sizeof(small);
    const double deadline = now_s() + kTimeoutMs / 1000.0;
    tcpx_status_t st;
    while ((st = tcpx_get_notification(b, name, sizeof(name), small, &len)) == TCPX_ERR_NOT_FOUND) {
        if (now_s() > deadline) FAIL("the large notification did not arrive");
        sleep_ms(1);
    }
    CHECK(st == TCPX_ERR_RESOURCE_EXHAUSTED);
    CHECK(strncmp(tcpx_last_error(), "RESOURCE_EXHAUSTED: tcpx_get_notification: ", 43) == 0);
    CHECK(len == big_len);
    uint8_t* got = malloc(len);
    CHECK(got != NULL);
    CHECK_OK(tcpx_get_notification(b, name, sizeof(name), got, &len));
    CHECK(len == big_len && memcmp(got, big, big_len) == 0);
    CHECK(next_notification(b, name, sizeof(name), small, sizeof(small)) == 4);
    CHECK(memcmp(small, "four", 4) == 0);
    // With the connection it came on: the name is a claim, the connection can be checked.
    uint64_t from = 0;
    len = sizeof(small);
    const double back_deadline = now_s() + kTimeoutMs / 1000.0;
    while ((st = tcpx_get_notification_from(a, &from, name, sizeof(name), small, &len)) ==
           TCPX_ERR_NOT_FOUND) {
        if (now_s() > back_deadline) FAIL("the notification from b did not arrive");
        sleep_ms(1);
    }
    CHECK(st == TCPX_OK);
    CHECK(len == 4 && memcmp(small, "back", 4) == 0 && strcmp(name, "b") == 0);
    CHECK(from == a_to_b);
    uint8_t b_md[512];
    size_t b_md_len = sizeof(b_md);
    CHECK_OK(tcpx_endpoint_metadata(b, b_md, &b_md_len));
    CHECK_OK(tcpx_peer_matches(a, from, b_md, b_md_len));
    uint8_t a_md[512];
    size_t a_md_len = sizeof(a_md);
    CHECK_OK(tcpx_endpoint_metadata(a, a_md, &a_md_len));
    CHECK_ERR(tcpx_peer_matches(a, from, a_md, a_md_len), TCPX_ERR_UNAUTHENTICATED);
    free(big);
    free(got);

    CHECK_ERR(tcpx_notify(a, a_to_b, NULL, 3), TCPX_ERR_INVALID_ARGUMENT);
    CHECK_ERR(tcpx_notify(a, 31337, "x", 1), TCPX_ERR_NOT_FOUND);
    CHECK_ERR(tcpx_notify(NULL, a_to_b, "x", 1), TCPX_ERR_INVALID_ARGUMENT);
    CHECK_ERR(tcpx_get_notification(b, name, sizeof(name), small, NULL), TCPX_ERR_INVALID_ARGUMENT);
    len = sizeof(small);
    CHECK_ERR(tcpx_get_notification(NULL, name, sizeof(name), small, &len),
              TCPX_ERR_INVALID_ARGUMENT);
    CHECK_ERR(tcpx_get_notification(b, name, sizeof(name), small, &len), TCPX_ERR_NOT_FOUND);
}

// Bad inputs to memory and one-sided calls, and transfers the target refuses.
static void test_bad_inputs(void) {
    const uint64_t size = 100;
    guarded_buf src = buf_new(size), dst = buf_new(size);
    uint64_t ms, md, x = 0;
    CHECK_ERR(tcpx_reg(a, NULL, size, &ms), TCPX_ERR_INVALID_ARGUMENT);
    CHECK_ERR(tcpx_reg(a, src.data, 0, &ms), TCPX_ERR_INVALID_ARGUMENT);
    CHECK_ERR(tcpx_reg(a, src.data, size, NULL), TCPX_ERR_INVALID_ARGUMENT);
    CHECK_ERR(tcpx_reg(NULL, src.data, size, &ms), TCPX_ERR_INVALID_ARGUMENT);
    CHECK_OK(tcpx_reg(a, src.data, size, &ms));
    CHECK_OK(tcpx_reg(b, dst.data, size, &md));
    desc_t rd = describe(b, md);

    size_t len = 0;
    CHECK_ERR(tcpx_mem_descriptor(b, 555555, NULL, &len), TCPX_ERR_NOT_FOUND);
    CHECK_ERR(tcpx_mem_descriptor(b, md, rd.bytes, NULL), TCPX_ERR_INVALID_ARGUMENT);
    CHECK_ERR(tcpx_mem_descriptor(NULL, md, rd.bytes, &len), TCPX_ERR_INVALID_ARGUMENT);
    CHECK_ERR(tcpx_dereg(a, 555555), TCPX_ERR_NOT_FOUND);
    CHECK_ERR(tcpx_dereg(NULL, ms), TCPX_ERR_INVALID_ARGUMENT);

    // Unknown registration, peer; ranges outside the local or the remote region.
    CHECK_ERR(tcpx_write(a, a_to_b, 555555, 0, rd.bytes, rd.len, 0, size, NULL, 0, 0, &x),
              TCPX_ERR_NOT_FOUND);
    CHECK_ERR(tcpx_write(a, 777, ms, 0, rd.bytes, rd.len, 0, size, NULL, 0, 0, &x),
              TCPX_ERR_NOT_FOUND);
    CHECK_ERR(tcpx_write(a, a_to_b, ms, 1, rd.bytes, rd.len, 0, size, NULL, 0, 0, &x),
              TCPX_ERR_OUT_OF_RANGE);
    CHECK_ERR(tcpx_write(a, a_to_b, ms, 0, rd.bytes, rd.len, 1, size, NULL, 0, 0, &x),
              TCPX_ERR_OUT_OF_RANGE);
    CHECK_ERR(tcpx_write(a, a_to_b, ms, UINT64_MAX, rd.bytes, rd.len, 0, 2, NULL, 0, 0, &x),
              TCPX_ERR_OUT_OF_RANGE);
    CHECK_ERR(tcpx_write(a, a_to_b, ms, 0, rd.bytes, rd.len, UINT64_MAX - 1, 2, NULL, 0, 0, &x),
              TCPX_ERR_OUT_OF_RANGE);
    CHECK_ERR(tcpx_read(a, a_to_b, ms, size, rd.bytes, rd.len, 0, 1, NULL, 0, 0, &x),
              TCPX_ERR_OUT_OF_RANGE);
    CHECK_ERR(tcpx_read(a, a_to_b, ms, 0, rd.bytes, rd.len, size + 1, 0, NULL, 0, 0, &x),
              TCPX_ERR_OUT_OF_RANGE);
    CHECK_ERR(tcpx_read(a, a_to_b, 555555, 0, rd.bytes, rd.len, 0, 1, NULL, 0, 0, &x),
              TCPX_ERR_NOT_FOUND);

    // Descriptors that are not descriptors.
    uint8_t garbage[64];
    memset(garbage, 0x5c, sizeof(garbage));
    CHECK_ERR(tcpx_write(a, a_to_b, ms, 0, garbage, rd.len, 0, size, NULL, 0, 0, &x),
              TCPX_ERR_INVALID_ARGUMENT);
    check_error_mentions("remote_desc");
    CHECK_ERR(tcpx_write(a, a_to_b, ms, 0, rd.bytes, rd.len - 1, 0, size, NULL, 0, 0, &x),
              TCPX_ERR_INVALID_ARGUMENT);
    CHECK_ERR(tcpx_write(a, a_to_b, ms, 0, rd.bytes, rd.len + 1, 0, size, NULL, 0, 0, &x),
              TCPX_ERR_INVALID_ARGUMENT);
    CHECK_ERR(tcpx_write(a, a_to_b, ms, 0, rd.bytes, 0, 0, size, NULL, 0, 0, &x),
              TCPX_ERR_INVALID_ARGUMENT);
    CHECK_ERR(tcpx_write(a, a_to_b, ms, 0, NULL, rd.len, 0, size, NULL, 0, 0, &x),
              TCPX_ERR_INVALID_ARGUMENT);
    CHECK_ERR(tcpx_read(a, a_to_b, ms, 0, garbage, sizeof(garbage), 0, size, NULL, 0, 0, &x),
              TCPX_ERR_INVALID_ARGUMENT);
    desc_t wrong_version = rd;
    wrong_version.bytes[4] ^= 0x7f;
    CHECK_ERR(tcpx_read(a, a_to_b, ms, 0, wrong_version.bytes, wrong_version.len, 0, size, NULL, 0,
                        0, &x),
              TCPX_ERR_INVALID_ARGUMENT);

    // Other bad arguments.
    CHECK_ERR(tcpx_write(a, a_to_b, ms, 0, rd.bytes, rd.len, 0, size, NULL, 5, 1, &x),
              TCPX_ERR_INVALID_ARGUMENT);
    CHECK_ERR(tcpx_write(a, a_to_b, ms, 0, rd.bytes, rd.len, 0, size, NULL, 0, 0, NULL),
              TCPX_ERR_INVALID_ARGUMENT);
    CHECK_ERR(tcpx_write(NULL, a_to_b, ms, 0, rd.bytes, rd.len, 0, size, NULL, 0, 0, &x),
              TCPX_ERR_INVALID_ARGUMENT);
    CHECK_ERR(tcpx_read(a, a_to_b, ms, 0, rd.bytes, rd.len, 0, size, NULL, 0, 0, NULL),
              TCPX_ERR_INVALID_ARGUMENT);
    CHECK_ERR(tcpx_read(NULL, a_to_b, ms, 0, rd.bytes, rd.len, 0, size, NULL, 0, 0, &x),
              TCPX_ERR_INVALID_ARGUMENT);
    CHECK_ERR(tcpx_read(a, a_to_b, ms, 0, rd.bytes, rd.len, 0, size, NULL, 5, 1, &x),
              TCPX_ERR_INVALID_ARGUMENT);

    tcpx_iov_t iov[3];
    for (int i = 0; i < 3; ++i) {
        iov[i].mem = ms;
        iov[i].offset = (uint64_t)i * 10;
        iov[i].remote_desc = rd.bytes;
        iov[i].remote_desc_len = rd.len;
        iov[i].remote_offset = (uint64_t)i * 10;
        iov[i].len = 10;
    }
    iov[1].remote_desc = garbage;
    CHECK_ERR(tcpx_writev(a, a_to_b, iov, 3, NULL, 0, 0, &x), TCPX_ERR_INVALID_ARGUMENT);
    check_error_mentions("iov[1]");
    iov[1].remote_desc = NULL;
    CHECK_ERR(tcpx_readv(a, a_to_b, iov, 3, NULL, 0, 0, &x), TCPX_ERR_INVALID_ARGUMENT);
    check_error_mentions("iov[1]");
    iov[1].remote_desc = rd.bytes;
    iov[2].offset = size - 5;
    CHECK_ERR(tcpx_writev(a, a_to_b, iov, 3, NULL, 0, 0, &x), TCPX_ERR_OUT_OF_RANGE);
    iov[2].offset = 20;
    iov[2].remote_offset = size - 5;
    CHECK_ERR(tcpx_readv(a, a_to_b, iov, 3, NULL, 0, 0, &x), TCPX_ERR_OUT_OF_RANGE);
    iov[2].remote_offset = 20;
    iov[0].mem = 555555;
    CHECK_ERR(tcpx_writev(a, a_to_b, iov, 3, NULL, 0, 0, &x), TCPX_ERR_NOT_FOUND);
    iov[0].mem = ms;
    CHECK_ERR(tcpx_writev(a, a_to_b, NULL, 3, NULL, 0, 0, &x), TCPX_ERR_INVALID_ARGUMENT);
    CHECK_ERR(tcpx_readv(a, a_to_b, NULL, 1, NULL, 0, 0, &x), TCPX_ERR_INVALID_ARGUMENT);
    CHECK_ERR(tcpx_writev(a, a_to_b, iov, 3, NULL, 1, 1, &x), TCPX_ERR_INVALID_ARGUMENT);
    CHECK_ERR(tcpx_writev(a, a_to_b, iov, 3, NULL, 0, 0, NULL), TCPX_ERR_INVALID_ARGUMENT);
    CHECK_ERR(tcpx_readv(NULL, a_to_b, iov, 3, NULL, 0, 0, &x), TCPX_ERR_INVALID_ARGUMENT);
    CHECK_ERR(tcpx_readv(a, a_to_b, iov, 3, NULL, 1, 1, &x), TCPX_ERR_INVALID_ARGUMENT);
    CHECK_OK(tcpx_writev(a, a_to_b, iov, 3, NULL, 0, 0, &x));  // all fixed: it works
    CHECK_OK(tcpx_wait(a, x, kTimeoutMs));

    // Completion of unknown transfers.
    int done = -1;
    CHECK_ERR(tcpx_poll(a, 0x1234567812345678ull, &done), TCPX_ERR_INVALID_ARGUMENT);
    CHECK(done == 1);
    CHECK_ERR(tcpx_poll(a, 0, &done), TCPX_ERR_INVALID_ARGUMENT);
    CHECK_ERR(tcpx_poll(a, x, NULL), TCPX_ERR_INVALID_ARGUMENT);
    done = -1;  // written on every failure: nothing is in flight for a call that failed
    CHECK_ERR(tcpx_poll(NULL, x, &done), TCPX_ERR_INVALID_ARGUMENT);
    CHECK(done == 1);
    CHECK_ERR(tcpx_wait(a, 0x1234567812345678ull, 10), TCPX_ERR_INVALID_ARGUMENT);
    CHECK_ERR(tcpx_wait(NULL, x, 10), TCPX_ERR_INVALID_ARGUMENT);

    // The target deregisters: its old descriptor is refused there, and the transfer fails here.
    CHECK_OK(tcpx_dereg(b, md));
    CHECK_ERR(tcpx_dereg(b, md), TCPX_ERR_NOT_FOUND);
    CHECK_OK(tcpx_write(a, a_to_b, ms, 0, rd.bytes, rd.len, 0, size, "n", 1, 1, &x));
    CHECK(poll_until_done(a, x) == TCPX_ERR_NOT_FOUND);
    check_error_message(__FILE__, __LINE__, "tcpx_poll", TCPX_ERR_NOT_FOUND);
    check_error_mentions("refused");
    char name[TCPX_NAME_MAX + 1];
    len = 0;
    CHECK_ERR(tcpx_get_notification(b, name, sizeof(name), NULL, &len), TCPX_ERR_NOT_FOUND);
    // A refused read sends no notification: the next one the target gets is the sentinel.
    CHECK_OK(tcpx_read(a, a_to_b, ms, 0, rd.bytes, rd.len, 0, size, "no", 2, 1, &x));
    CHECK_ERR(tcpx_wait(a, x, kTimeoutMs), TCPX_ERR_NOT_FOUND);
    check_error_mentions("refused");
    CHECK_OK(tcpx_notify(a, a_to_b, "sentinel", 8));
    char note[16];
    CHECK(next_notification(b, name, sizeof(name), note, sizeof(note)) == 8);
    CHECK(memcmp(note, "sentinel", 8) == 0);

    CHECK_OK(tcpx_dereg(a, ms));
    buf_free(&src);
    buf_free(&dst);
}

// tcpx_last_error() belongs to each thread.
static void* other_thread(void* arg) {
    (void)arg;
    if (strcmp(tcpx_last_error(), "") != 0) return "a new thread sees another thread's error";
    if (tcpx_reg(a, NULL, 1, NULL) != TCPX_ERR_INVALID_ARGUMENT)
        return "tcpx_reg(NULL) not refused";
    if (strncmp(tcpx_last_error(), "INVALID_ARGUMENT: tcpx_reg: ", 28) != 0) {
        return "unexpected message on the other thread";
    }
    return NULL;
}

static void test_thread_local_error(void) {
    CHECK_ERR(tcpx_dereg(a, 999), TCPX_ERR_NOT_FOUND);
    pthread_t t;
    CHECK(pthread_create(&t, NULL, other_thread, NULL) == 0);
    void* result = NULL;
    CHECK(pthread_join(t, &result) == 0);
    if (result != NULL) FAIL("%s", (const char*)result);
    CHECK(strncmp(tcpx_last_error(), "NOT_FOUND: tcpx_dereg: ", 23) == 0);
    // Success leaves the last error alone.
    CHECK(strcmp(tcpx_status_name(TCPX_OK), "OK") == 0);
    char name[TCPX_NAME_MAX + 1];
    CHECK_OK(tcpx_peer_name(a, a_to_b, name, sizeof(name)));
    CHECK(strncmp(tcpx_last_error(), "NOT_FOUND: tcpx_dereg: ", 23) == 0);
}

// Disconnecting fails the peer on both sides.
static void test_disconnect(void) {
    CHECK_ERR(tcpx_disconnect(a, 4242), TCPX_ERR_NOT_FOUND);
    CHECK_ERR(tcpx_disconnect(NULL, a_to_b), TCPX_ERR_INVALID_ARGUMENT);
    CHECK_OK(tcpx_disconnect(a, a_to_b));
    CHECK_ERR(tcpx_notify(a, a_to_b, "x", 1), TCPX_ERR_NOT_FOUND);
    char name[TCPX_NAME_MAX + 1];
    CHECK_ERR(tcpx_peer_name(a, a_to_b, name, sizeof(name)), TCPX_ERR_NOT_FOUND);
    const double deadline = now_s() + kTimeoutMs / 1000.0;
    tcpx_status_t st;
    while ((st = tcpx_notify(b, b_to_a, "x", 1)) == TCPX_OK) {
        if (now_s() > deadline) FAIL("b never noticed that a disconnected");
        sleep_ms(1);
    }
    if (st != TCPX_ERR_UNAVAILABLE) {
        FAIL("notify to a disconnected peer: %s, expected UNAVAILABLE", tcpx_status_name(st));
    }
    check_error_message(__FILE__, __LINE__, "tcpx_notify", TCPX_ERR_UNAVAILABLE);
    CHECK_OK(tcpx_disconnect(b, b_to_a));

    // They can connect again.
    uint8_t md[512];
    size_t md_len = sizeof(md);
    CHECK_OK(tcpx_endpoint_metadata(a, md, &md_len));
    uint64_t peer;
    CHECK_OK(tcpx_connect(b, md, md_len, &peer));
    uint64_t back;
    CHECK_OK(tcpx_accept(a, -1, &back));
    CHECK_OK(tcpx_peer_name(a, back, name, sizeof(name)));
    CHECK(strcmp(name, "b") == 0);
    CHECK_OK(tcpx_notify(a, back, "again", 5));
    char payload[8];
    CHECK(next_notification(b, name, sizeof(name), payload, sizeof(payload)) == 5);
    CHECK(memcmp(payload, "again", 5) == 0 && strcmp(name, "a") == 0);
}

// Notifications the application has not taken are bounded (MAX_QUEUED_NOTIFICATIONS, here 2):
// past it a write carrying one is refused. One the C API returned is taken, and only that one:
// before, the first tcpx_get_notification took the engine's whole queue into the C API's own
// buffer, where none of them counted any more, and peers could send twice the bound.
static void test_untaken_notifications_stay_bounded(void) {
    tcpx_config_t* cfg = loopback_config();
    CHECK_OK(tcpx_config_set(cfg, "MAX_QUEUED_NOTIFICATIONS", "2"));
    tcpx_endpoint_t *x = NULL, *y = NULL;
    CHECK_OK(tcpx_endpoint_create(cfg, "x", &x));
    CHECK_OK(tcpx_endpoint_create(cfg, "y", &y));
    tcpx_config_free(cfg);
    uint8_t md[512];
    size_t md_len = sizeof(md);
    CHECK_OK(tcpx_endpoint_metadata(y, md, &md_len));
    uint64_t x_to_y, y_to_x;
    CHECK_OK(tcpx_connect(x, md, md_len, &x_to_y));
    CHECK_OK(tcpx_accept(y, -1, &y_to_x));
    guarded_buf src = buf_new(64), dst = buf_new(64);
    uint64_t ms, mt;
    CHECK_OK(tcpx_reg(x, src.data, 64, &ms));
    CHECK_OK(tcpx_reg(y, dst.data, 64, &mt));
    const desc_t d = describe(y, mt);
    // A write of 8 bytes with notification "n<i>"; its result.
#define WRITE_WITH_NOTE(i, result)                                                             \
    do {                                                                                       \
        char note_[8];                                                                         \
        snprintf(note_, sizeof(note_), "n%d", (i));                                            \
        uint64_t w_;                                                                           \
        CHECK_OK(                                                                              \
            tcpx_write(x, x_to_y, ms, 0, d.bytes, d.len, 0, 8, note_, strlen(note_), 1, &w_)); \
        (result) = tcpx_wait(x, w_, kTimeoutMs);                                               \
    } while (0)
    tcpx_status_t st;
    WRITE_WITH_NOTE(0, st);
    CHECK(st == TCPX_OK);
    WRITE_WITH_NOTE(1, st);
    CHECK(st == TCPX_OK);
    WRITE_WITH_NOTE(2, st);
    CHECK(st == TCPX_ERR_RESOURCE_EXHAUSTED);
    char name[TCPX_NAME_MAX + 1];
    char payload[8];
    CHECK(next_notification(y, name, sizeof(name), payload, sizeof(payload)) == 2);
    CHECK(memcmp(payload, "n0", 2) == 0);
    // One taken: room for one more, not for three.
    WRITE_WITH_NOTE(3, st);
    CHECK(st == TCPX_OK);
    WRITE_WITH_NOTE(4, st);
    CHECK(st == TCPX_ERR_RESOURCE_EXHAUSTED);
#undef WRITE_WITH_NOTE
    CHECK(next_notification(y, name, sizeof(name), payload, sizeof(payload)) == 2);
    CHECK(memcmp(payload, "n1", 2) == 0);
    CHECK(next_notification(y, name, sizeof(name), payload, sizeof(payload)) == 2);
    CHECK(memcmp(payload, "n3", 2) == 0);
    size_t len = sizeof(payload);
    CHECK_ERR(tcpx_get_notification(y, name, sizeof(name), payload, &len), TCPX_ERR_NOT_FOUND);
    tcpx_endpoint_destroy(x);
    tcpx_endpoint_destroy(y);
    buf_free(&src);
    buf_free(&dst);
}

// Two endpoints joined: x with a progress thread, and y without one, which moves only in its
// calls (an application that stops calling it leaves its peer's transfers waiting).
// `peer_timeout_ms`: both endpoints' PEER_TIMEOUT_MS, or NULL for the test config's.
typedef struct {
    tcpx_endpoint_t* x;
    tcpx_endpoint_t* y;
    uint64_t x_to_y;  // x's id for y
    uint64_t y_to_x;  // y's id for x
} quiet_pair;

static quiet_pair quiet_pair_new(const char* peer_timeout_ms) {
    quiet_pair p = {NULL, NULL, 0, 0};
    tcpx_config_t* cfg = loopback_config();
    if (peer_timeout_ms != NULL) CHECK_OK(tcpx_config_set(cfg, "PEER_TIMEOUT_MS", peer_timeout_ms));
    CHECK_OK(tcpx_endpoint_create(cfg, "x", &p.x));
    CHECK_OK(tcpx_config_set(cfg, "PROGRESS_THREAD", "off"));
    CHECK_OK(tcpx_endpoint_create(cfg, "y", &p.y));
    tcpx_config_free(cfg);
    uint8_t md[512];
    size_t md_len = sizeof(md);
    CHECK_OK(tcpx_endpoint_metadata(p.y, md, &md_len));
    CHECK_OK(tcpx_connect_async(p.x, md, md_len, &p.x_to_y));
    CHECK_OK(tcpx_accept(p.y, -1, &p.y_to_x));
    // y's calls make its progress: a few more, until x has the connection.
    const double deadline = now_s() + kTimeoutMs / 1000.0;
    while (tcpx_peer_status(p.x, p.x_to_y) != TCPX_OK && now_s() < deadline) {
        uint64_t none;
        (void)tcpx_accept(p.y, 1, &none);
    }
    CHECK_OK(tcpx_peer_status(p.x, p.x_to_y));
    return p;
}

static void quiet_pair_free(quiet_pair* p) {
    tcpx_endpoint_destroy(p->x);
    tcpx_endpoint_destroy(p->y);
}

// A transfer that fails with TIMEOUT (here a write to an endpoint without a progress thread
// whose application stops calling it: after PEER_TIMEOUT_MS without a word from it, the peer
// fails with TIMEOUT) is reported by tcpx_wait(-1) as that failure. Before, the wait took
// TIMEOUT for "still in flight", waited again, and found the id already reported
// (INVALID_ARGUMENT).
static void test_wait_forever_reports_a_timed_out_transfer(void) {
    quiet_pair p = quiet_pair_new("200");
    guarded_buf src = buf_new(4096), dst = buf_new(4096);
    uint64_t m, n, w;
    CHECK_OK(tcpx_reg(p.x, src.data, 4096, &m));
    CHECK_OK(tcpx_reg(p.y, dst.data, 4096, &n));
    const desc_t d = describe(p.y, n);
    CHECK_OK(tcpx_write(p.x, p.x_to_y, m, 0, d.bytes, d.len, 0, 4096, NULL, 0, 0, &w));
    CHECK_ERR(tcpx_wait(p.x, w, -1), TCPX_ERR_TIMEOUT);  // y is not called meanwhile
    check_error_message(__FILE__, __LINE__, "tcpx_wait", TCPX_ERR_TIMEOUT);
    quiet_pair_free(&p);
    buf_free(&src);
    buf_free(&dst);
}

// A read the target has not answered yet (it has no progress thread, and its application is
// not calling it) is cancelled at once: CANCELLED, its memory free (a dereg does not wait for
// it), and nothing lands there when the target answers later.
static void test_cancel_a_read_in_flight(void) {
    quiet_pair p = quiet_pair_new(NULL);
    const uint64_t size = 1 << 20;
    guarded_buf src = buf_new(size), dst = buf_new(size);
    memset(src.data, 0x3c, size);
    uint64_t m, n, r, none;
    CHECK_OK(tcpx_reg(p.x, dst.data, size, &m));
    CHECK_OK(tcpx_reg(p.y, src.data, size, &n));
    const desc_t d = describe(p.y, n);
    CHECK_OK(tcpx_read(p.x, p.x_to_y, m, 0, d.bytes, d.len, 0, size, "gone", 4, 1, &r));
    sleep_ms(20);
    CHECK_OK(tcpx_cancel(p.x, r));
    CHECK_ERR(tcpx_wait(p.x, r, kTimeoutMs), TCPX_ERR_CANCELLED);
    CHECK_ERR(tcpx_cancel(p.x, r), TCPX_ERR_INVALID_ARGUMENT);  // reported: unknown
    const double dereg_start = now_s();
    CHECK_OK(tcpx_dereg(p.x, m));
    CHECK(now_s() - dereg_start < 1.0);
    // y answers now; the data drains into x's scratch.
    const double deadline = now_s() + 0.3;
    while (now_s() < deadline) (void)tcpx_accept(p.y, 1, &none);
    for (uint64_t i = 0; i < size; ++i) {
        if (dst.data[i] != 0) FAIL("byte %" PRIu64 " of a cancelled read's memory changed", i);
    }
    CHECK_OK(tcpx_peer_status(p.x, p.x_to_y));
    quiet_pair_free(&p);
    buf_free(&src);
    buf_free(&dst);
}

// Counters: a write moves them by exactly its bytes and one transfer here, one served there; a
// peer's are the endpoint's when it is the only one; bad arguments are refused.
static void test_stats(void) {
    const uint64_t size = 4096;
    guarded_buf src = buf_new(size), dst = buf_new(size);
    uint64_t ms = 0, md = 0;
    CHECK_OK(tcpx_reg(a, src.data, size, &ms));
    CHECK_OK(tcpx_reg(b, dst.data, size, &md));
    desc_t rd = describe(b, md);
    tcpx_stats_t a0, b0, a1, b1, ap;
    CHECK_OK(tcpx_endpoint_stats(a, &a0));
    CHECK_OK(tcpx_endpoint_stats(b, &b0));
    uint64_t x = 0;
    CHECK_OK(tcpx_write(a, a_to_b, ms, 0, rd.bytes, rd.len, 0, size, NULL, 0, 0, &x));
    CHECK_OK(tcpx_wait(a, x, kTimeoutMs));
    CHECK_OK(tcpx_endpoint_stats(a, &a1));
    CHECK(a1.transfers_started == a0.transfers_started + 1);
    CHECK(a1.transfers_completed == a0.transfers_completed + 1);
    CHECK(a1.transfers_failed == a0.transfers_failed);
    CHECK(a1.bytes_sent == a0.bytes_sent + size);
    CHECK(a1.bytes_received == a0.bytes_received);
    const double deadline = now_s() + kTimeoutMs / 1000.0;
    do {
        CHECK_OK(tcpx_endpoint_stats(b, &b1));
        if (b1.requests_served == b0.requests_served + 1) break;
        sleep_ms(1);
    } while (now_s() < deadline);
    CHECK(b1.requests_served == b0.requests_served + 1);
    CHECK(b1.bytes_received == b0.bytes_received + size);
    CHECK_OK(tcpx_peer_stats(a, a_to_b, &ap));
    CHECK(ap.bytes_sent == a1.bytes_sent && ap.transfers_started == a1.transfers_started);
    CHECK_ERR(tcpx_peer_stats(a, 987654, &ap), TCPX_ERR_NOT_FOUND);
    CHECK_ERR(tcpx_endpoint_stats(a, NULL), TCPX_ERR_INVALID_ARGUMENT);
    CHECK_ERR(tcpx_endpoint_stats(NULL, &ap), TCPX_ERR_INVALID_ARGUMENT);
    CHECK_ERR(tcpx_peer_stats(a, a_to_b, NULL), TCPX_ERR_INVALID_ARGUMENT);
    CHECK_OK(tcpx_dereg(a, ms));
    CHECK_OK(tcpx_dereg(b, md));
    buf_free(&src);
    buf_free(&dst);
}

int main(void) {
    test_status_names();
    test_config();
    tcpx_config_t* cfg = loopback_config();
    test_endpoints_and_metadata(cfg);
    tcpx_config_free(cfg);  // the endpoints do not need it any more
    const uint64_t sizes[] = {100, 4 * MiB};
    for (int i = 0; i < 2; ++i) {
        test_write_read(sizes[i]);
        test_writev_readv(i);
        test_send_recv(sizes[i]);
    }
    test_stats();
    test_notify();
    test_untaken_notifications_stay_bounded();
    test_bad_inputs();
    test_thread_local_error();
    test_disconnect();
    test_wait_forever_reports_a_timed_out_transfer();
    test_cancel_a_read_in_flight();
    tcpx_endpoint_destroy(a);
    tcpx_endpoint_destroy(b);
    printf("c_api_test: all checks passed\n");
    return 0;
}
