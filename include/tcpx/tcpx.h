/* tcpx/tcpx.h — the C API of tcpx-p2p (C11 and C++).
 *
 * The same operations as the C++ API (tcpx/endpoint.h), over opaque handles:
 *
 *   tcpx_config_t* cfg;
 *   tcpx_config_new(&cfg);
 *   tcpx_config_set(cfg, "NSOCKS", "4");
 *   tcpx_endpoint_t* ep;
 *   tcpx_endpoint_create(cfg, "prefill-0", &ep);
 *   size_t md_len = 0;
 *   tcpx_endpoint_metadata(ep, NULL, &md_len);       // size query: RESOURCE_EXHAUSTED
 *   ...                                              // give the metadata to peers out of band
 *   uint64_t peer, mem, xfer;
 *   tcpx_connect(ep, their_md, their_md_len, &peer);
 *   tcpx_reg(ep, buf, len, &mem);
 *   tcpx_write(ep, peer, mem, 0, their_desc, their_desc_len, 0, len, "kv", 2, 1, &xfer);
 *   tcpx_wait(ep, xfer, 10000);
 *
 * Conventions shared by every entry point:
 *
 * - Every function returns a tcpx_status_t (except the few that return a string, which say so).
 *   TCPX_OK is success; any other value is the failure's code, and tcpx_last_error() then holds
 *   "<CODE NAME>: <what was attempted>: <why>" for the calling thread. A successful call leaves
 *   tcpx_last_error() as it was (like errno).
 * - Null pointers and bad arguments are TCPX_ERR_INVALID_ARGUMENT, never a crash. No C++
 *   exception leaves the library; an unexpected one becomes TCPX_ERR_INTERNAL.
 * - Output parameters are written only on TCPX_OK, except where a function says otherwise (size
 *   queries, tcpx_poll).
 * - Size queries: functions that return variable-length bytes take (void* buf, size_t* len), *len
 *   being the capacity of buf on entry. When the bytes do not fit (*len smaller than needed, or
 *   buf NULL while there is at least one byte to return), nothing is copied, *len is set to the
 *   size needed and the result is TCPX_ERR_RESOURCE_EXHAUSTED; call again with a buffer that
 *   large. Otherwise the bytes are copied and *len is set to their size (TCPX_OK).
 * - Binary blobs (endpoint metadata, memory descriptors, notification payloads) are bytes, not
 *   C strings: they may contain zeros and carry no terminator.
 * - Ids (peers, registrations, transfers) are uint64_t and never 0 when valid.
 * - All functions are thread-safe, except that an endpoint must not be destroyed while another
 *   thread uses it, and a configuration must not be changed while another thread reads it.
 */
#ifndef TCPX_TCPX_H_
#define TCPX_TCPX_H_

#include <stddef.h>
#include <stdint.h>

#include "tcpx/api.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------------------------------------
 * Status codes: the same values as tcpx::StatusCode. */
typedef enum tcpx_status_t {
    TCPX_OK = 0,
    TCPX_ERR_INVALID_ARGUMENT = 1,    /* the caller passed something wrong */
    TCPX_ERR_NOT_FOUND = 2,           /* no such object (mem, key, peer, interface) */
    TCPX_ERR_ALREADY_EXISTS = 3,      /* the object exists already */
    TCPX_ERR_OUT_OF_RANGE = 4,        /* offset/length outside a registration or limit */
    TCPX_ERR_RESOURCE_EXHAUSTED = 5,  /* a bounded resource is full, or a buffer too small */
    TCPX_ERR_FAILED_PRECONDITION = 6, /* the object is in the wrong state (closed, failed) */
    TCPX_ERR_UNAVAILABLE = 7,         /* the peer or connection is unreachable or was lost; or not
                                         yet, try again (tcpx_cancel of a transfer still landing) */
    TCPX_ERR_TIMEOUT = 8,             /* a deadline passed */
    TCPX_ERR_CANCELLED = 9,           /* the operation was cancelled or its object closed */
    TCPX_ERR_PROTOCOL = 10,           /* the peer sent something the protocol does not allow */
    TCPX_ERR_REMOTE = 11,             /* the peer reported an error for this operation */
    TCPX_ERR_SYSTEM = 12,             /* an operating-system call failed */
    TCPX_ERR_CUDA = 13,               /* a CUDA call failed */
    TCPX_ERR_UNIMPLEMENTED = 14,      /* not supported by this build or transport */
    TCPX_ERR_INTERNAL = 15,           /* a bug in tcpx-p2p */
    TCPX_ERR_UNAUTHENTICATED = 16     /* the peer failed authentication, or we failed its */
} tcpx_status_t;

/* The longest endpoint name, in bytes (without the terminating zero). */
#define TCPX_NAME_MAX 256

/* "OK", "INVALID_ARGUMENT", ... (the code's name without the TCPX_ERR_ prefix); "UNKNOWN" for a
 * value outside the enum. The string is static. */
TCPX_C_API const char* tcpx_status_name(tcpx_status_t status);

/* The message of the last call on this thread that did not return TCPX_OK, as
 * "<CODE NAME>: <message>"; "" if there was none. Never NULL. The string belongs to the library
 * and stays valid until the next failing call on this thread. */
TCPX_C_API const char* tcpx_last_error(void);

/* ---------------------------------------------------------------------------------------------
 * Configuration: every setting of tcpx-p2p (see docs/configuration.md, `tcpx-p2p params`). */
typedef struct tcpx_config_t tcpx_config_t;

/* A configuration with every setting at its default. Free it with tcpx_config_free. */
TCPX_C_API tcpx_status_t tcpx_config_new(tcpx_config_t** out);

/* The defaults overridden by every TCPX_P2P_<NAME> environment variable that is set. An invalid
 * value is an error naming the variable (nothing is allocated then). */
TCPX_C_API tcpx_status_t tcpx_config_from_env(tcpx_config_t** out);

/* Sets one setting by name ("NSOCKS" or "TCPX_P2P_NSOCKS", case-insensitive) from text, with the
 * environment's parsing and range checks: an unknown name or unparsable value is
 * TCPX_ERR_INVALID_ARGUMENT, a value outside the setting's range TCPX_ERR_OUT_OF_RANGE. Checks
 * that involve several settings happen in tcpx_endpoint_create. */
TCPX_C_API tcpx_status_t tcpx_config_set(tcpx_config_t* config, const char* name,
                                         const char* value);

/* Frees a configuration; NULL is ignored. Endpoints created from it do not need it any more. */
TCPX_C_API void tcpx_config_free(tcpx_config_t* config);

/* ---------------------------------------------------------------------------------------------
 * Endpoints. */
typedef struct tcpx_endpoint_t tcpx_endpoint_t;

/* Starts an endpoint: picks the interface and transport from `config` (NULL: from the
 * environment, as tcpx_config_from_env), listens for peers. `name` identifies it to peers (at
 * most TCPX_NAME_MAX bytes, no ASCII control characters; NULL or "": "<host>:<port>"). Destroy it
 * with tcpx_endpoint_destroy.
 */
TCPX_C_API tcpx_status_t tcpx_endpoint_create(const tcpx_config_t* config, const char* name,
                                              tcpx_endpoint_t** out);

/* Disconnects every peer (their transfers fail, here and there) and stops; NULL is ignored. No
 * other thread may use the endpoint during or after this call. */
TCPX_C_API void tcpx_endpoint_destroy(tcpx_endpoint_t* ep);

/* The endpoint's name, valid until the endpoint is destroyed. NULL (and tcpx_last_error set) if
 * `ep` is NULL. */
TCPX_C_API const char* tcpx_endpoint_name(const tcpx_endpoint_t* ep);

/* How to reach this endpoint: a versioned binary blob to hand to peers out of band (they pass it
 * to tcpx_connect). Size-query convention (see the top of this file). */
TCPX_C_API tcpx_status_t tcpx_endpoint_metadata(const tcpx_endpoint_t* ep, void* buf, size_t* len);

/* What an endpoint's metadata says. */
typedef struct tcpx_endpoint_info_t {
    char name[TCPX_NAME_MAX + 1]; /* zero-terminated */
    char host[64];                /* numeric IPv4 or IPv6 address, zero-terminated */
    uint16_t port;
    int32_t gpu; /* -1: none */
} tcpx_endpoint_info_t;

/* Decodes metadata (from tcpx_endpoint_metadata) without connecting. Bytes that are not valid
 * metadata are TCPX_ERR_INVALID_ARGUMENT. */
TCPX_C_API tcpx_status_t tcpx_parse_metadata(const void* md, size_t len, tcpx_endpoint_info_t* out);

/* ---------------------------------------------------------------------------------------------
 * Peers. */

/* Connects to the endpoint described by `md` (its metadata, `len` bytes); returns once the
 * connection is ready, or fails after the CONNECT_TIMEOUT_MS setting. */
TCPX_C_API tcpx_status_t tcpx_connect(tcpx_endpoint_t* ep, const void* md, size_t len,
                                      uint64_t* peer);

/* Starts connecting and returns at once. Transfers and notifications may be posted to the peer
 * right away: they wait (in order, at most 65536) for the connection and then go out, or fail
 * with its error. tcpx_peer_status() says where it stands; a failed peer stays known until
 * tcpx_disconnect(), or until TCPX_P2P_MAX_PEERS peers have failed after it without being
 * disconnected (then TCPX_ERR_NOT_FOUND). */
TCPX_C_API tcpx_status_t tcpx_connect_async(tcpx_endpoint_t* ep, const void* md, size_t len,
                                            uint64_t* peer);

/* Endpoints that connect to us are served at once, without accepting them: one-sided transfers,
 * notifications and sends from them work immediately. tcpx_accept returns the next such peer not
 * yet returned, waiting up to `timeout_ms` milliseconds (negative: forever); TCPX_ERR_TIMEOUT if
 * none came. */
TCPX_C_API tcpx_status_t tcpx_accept(tcpx_endpoint_t* ep, int timeout_ms, uint64_t* peer);

/* Closes the connection; the peer's transfers in flight fail, here and there. The id is unknown
 * afterwards. */
TCPX_C_API tcpx_status_t tcpx_disconnect(tcpx_endpoint_t* ep, uint64_t peer);

/* The peer endpoint's name, zero-terminated, into buf (`len` bytes). A buffer of
 * TCPX_NAME_MAX + 1 bytes always suffices; a smaller one that cannot hold the name is
 * TCPX_ERR_RESOURCE_EXHAUSTED (nothing written). */
TCPX_C_API tcpx_status_t tcpx_peer_name(const tcpx_endpoint_t* ep, uint64_t peer, char* buf,
                                        size_t len);

/* Whether the connection to the peer is up: TCPX_OK when ready; the error it failed with (e.g.
 * TCPX_ERR_UNAVAILABLE when the peer closed it, TCPX_ERR_TIMEOUT when it stopped answering);
 * TCPX_ERR_FAILED_PRECONDITION while it is still being made; TCPX_ERR_NOT_FOUND for an unknown
 * id. Makes progress once where no progress thread runs. */
TCPX_C_API tcpx_status_t tcpx_peer_status(tcpx_endpoint_t* ep, uint64_t peer);

/* Whether the peer is, as far as can be told, the endpoint that metadata `md` (`len` bytes)
 * describes: its name is the metadata's, and unless it proved the shared secret it talks to us
 * from the host address the metadata gives (from this host, when that address is one of ours).
 * TCPX_OK; TCPX_ERR_UNAUTHENTICATED naming the difference; TCPX_ERR_INVALID_ARGUMENT for
 * metadata that does not parse; TCPX_ERR_NOT_FOUND for an unknown peer. */
TCPX_C_API tcpx_status_t tcpx_peer_matches(const tcpx_endpoint_t* ep, uint64_t peer, const void* md,
                                           size_t len);

/* Counters of an endpoint (all its peers, gone ones included, since it was created) or of one
 * peer (since it connected); monotonic but for staging_bytes (held now). As tcpx::Stats in
 * tcpx/endpoint.h. */
typedef struct tcpx_stats_t {
    uint64_t bytes_sent;          /* bytes of completed transfers that left our memory */
    uint64_t bytes_received;      /* bytes of completed transfers that landed in our memory */
    uint64_t transfers_started;   /* posted here */
    uint64_t transfers_completed; /* of those, done */
    uint64_t transfers_failed;    /* of those, failed (cancelled ones included) */
    uint64_t requests_served;     /* the peers' reads and writes served here */
    uint64_t errors;              /* peers failed */
    uint64_t retries;             /* transport requests posted later for lack of room */
    uint64_t window_blocked_ns;   /* time data channels had chunks waiting on a full window */
    uint64_t staging_waits;       /* chunks that waited for staging memory (its total) */
    uint64_t staging_bytes;       /* staging memory held now */
    uint64_t staging_peak_bytes;  /* the most the endpoint held (0 for a peer) */
} tcpx_stats_t;

/* The endpoint's counters. */
TCPX_C_API tcpx_status_t tcpx_endpoint_stats(const tcpx_endpoint_t* ep, tcpx_stats_t* out);
/* One peer's counters; TCPX_ERR_NOT_FOUND for an unknown id. */
TCPX_C_API tcpx_status_t tcpx_peer_stats(const tcpx_endpoint_t* ep, uint64_t peer,
                                         tcpx_stats_t* out);

/* ---------------------------------------------------------------------------------------------
 * Memory. */

/* Registers [ptr, ptr + len) for transfers. Registration ids are never reused. */
TCPX_C_API tcpx_status_t tcpx_reg(tcpx_endpoint_t* ep, void* ptr, size_t len, uint64_t* mem);

/* Deregisters. After it returns nothing reads or writes the region any more: new requests for it
 * are refused; transfers already using it finish first (or fail, if their peer does not complete
 * them within the PEER_TIMEOUT_MS setting — that peer is then disconnected). */
TCPX_C_API tcpx_status_t tcpx_dereg(tcpx_endpoint_t* ep, uint64_t mem);

/* The descriptor of registration `mem`: a versioned binary blob that peers pass to tcpx_write,
 * tcpx_read (and their vector forms) as the remote side. Size-query convention. */
TCPX_C_API tcpx_status_t tcpx_mem_descriptor(const tcpx_endpoint_t* ep, uint64_t mem, void* buf,
                                             size_t* len);

/* ---------------------------------------------------------------------------------------------
 * One-sided transfers: the target's application takes no part; its endpoint checks every request
 * against its registrations. Remote regions are given by their descriptor (`remote_desc`,
 * `remote_desc_len` bytes, from the target's tcpx_mem_descriptor); bytes that are not a
 * descriptor are TCPX_ERR_INVALID_ARGUMENT. A range outside our registration or the remote one is
 * TCPX_ERR_OUT_OF_RANGE, an unknown registration or peer TCPX_ERR_NOT_FOUND.
 *
 * Every transfer is asynchronous: *xfer receives its id, for tcpx_poll / tcpx_wait. A request the
 * target refuses (its registration was deregistered, say) fails the transfer with the target's
 * code (TCPX_ERR_NOT_FOUND for a region that is gone), as tcpx_poll / tcpx_wait report. */

/* Copies `len` bytes from our registration `mem` at `offset` to the peer's region at
 * `remote_offset`. When `has_notif` is non-zero, the peer's application receives `notif`
 * (`notif_len` bytes, possibly 0; `notif` may be NULL when notif_len is 0) with our name, once all
 * the data is in place there (tcpx_get_notification). A peer with no room for it (its application
 * has not taken TCPX_P2P_MAX_QUEUED_NOTIFICATIONS of ours) refuses the write before any byte moves:
 * the transfer fails with TCPX_ERR_RESOURCE_EXHAUSTED. */
TCPX_C_API tcpx_status_t tcpx_write(tcpx_endpoint_t* ep, uint64_t peer, uint64_t mem,
                                    uint64_t offset, const void* remote_desc,
                                    size_t remote_desc_len, uint64_t remote_offset, uint64_t len,
                                    const void* notif, size_t notif_len, int has_notif,
                                    uint64_t* xfer);

/* Copies `len` bytes from the peer's region at `remote_offset` into our `mem` at `offset`. When
 * `has_notif` is non-zero, the peer's application receives `notif` (as in tcpx_write) with our
 * name, once all the data is in place here: this endpoint sends it when the read completes (its
 * progress thread, or tcpx_poll / tcpx_wait), before the read is reported done, and never if the
 * read fails. The peer holds room for it from the request on: with none, the read is refused as a
 * write is (TCPX_ERR_RESOURCE_EXHAUSTED, no byte moved). */
TCPX_C_API tcpx_status_t tcpx_read(tcpx_endpoint_t* ep, uint64_t peer, uint64_t mem,
                                   uint64_t offset, const void* remote_desc, size_t remote_desc_len,
                                   uint64_t remote_offset, uint64_t len, const void* notif,
                                   size_t notif_len, int has_notif, uint64_t* xfer);

/* One piece of a vector transfer: `len` bytes between our registration `mem` at `offset` and the
 * peer's region (`remote_desc`) at `remote_offset`. */
typedef struct tcpx_iov_t {
    uint64_t mem;
    uint64_t offset;
    const void* remote_desc;
    size_t remote_desc_len;
    uint64_t remote_offset;
    uint64_t len;
} tcpx_iov_t;

/* `count` pieces as one transfer: done when all are, failed if any fails; the notification (as in
 * tcpx_write) comes after all of them. `iov` may be NULL when count is 0. */
TCPX_C_API tcpx_status_t tcpx_writev(tcpx_endpoint_t* ep, uint64_t peer, const tcpx_iov_t* iov,
                                     size_t count, const void* notif, size_t notif_len,
                                     int has_notif, uint64_t* xfer);

/* The reading counterpart of tcpx_writev; the notification as in tcpx_read, after all pieces. */
TCPX_C_API tcpx_status_t tcpx_readv(tcpx_endpoint_t* ep, uint64_t peer, const tcpx_iov_t* iov,
                                    size_t count, const void* notif, size_t notif_len,
                                    int has_notif, uint64_t* xfer);

/* ---------------------------------------------------------------------------------------------
 * Notifications. */

/* Sends a notification on its own: `payload` (`len` bytes; NULL when len is 0).
 * TCPX_ERR_RESOURCE_EXHAUSTED while more than TCPX_P2P_MAX_QUEUED_NOTIFICATION_BYTES wait to go
 * out to the peer (a peer whose application has not taken TCPX_P2P_MAX_QUEUED_NOTIFICATIONS of
 * ours stops reading us until it does): try again once they have gone. A peer that makes no room
 * for TCPX_P2P_PEER_TIMEOUT_MS ends the connection. */
TCPX_C_API tcpx_status_t tcpx_notify(tcpx_endpoint_t* ep, uint64_t peer, const void* payload,
                                     size_t len);

/* Takes the oldest notification received and not yet returned (each is returned exactly once, in
 * arrival order); TCPX_ERR_NOT_FOUND when there is none. The sender's name goes to `peer_name`
 * (zero-terminated; `name_len` bytes; TCPX_NAME_MAX + 1 always suffice; both may be NULL/0 to
 * skip it), the payload to `payload` by the size-query convention. When either does not fit, the
 * result is TCPX_ERR_RESOURCE_EXHAUSTED, *payload_len is set to the payload's size, and the
 * notification stays first in line for the next call. */
TCPX_C_API tcpx_status_t tcpx_get_notification(tcpx_endpoint_t* ep, char* peer_name,
                                               size_t name_len, void* payload, size_t* payload_len);

/* The same, and the id of the connection it came on in `*peer` (when `peer` is not NULL). The
 * name is only the sender's claim: tcpx_peer_matches(ep, *peer, metadata) says whether that
 * connection is the endpoint a metadata describes (also for a sender that has disconnected since,
 * until the next call after the one that returned it). */
TCPX_C_API tcpx_status_t tcpx_get_notification_from(tcpx_endpoint_t* ep, uint64_t* peer,
                                                    char* peer_name, size_t name_len, void* payload,
                                                    size_t* payload_len);

/* ---------------------------------------------------------------------------------------------
 * Two-sided transfers: a send matches the peer's first posted receive of the same tag (in posting
 * order); the receive's length must be at least the send's (else both fail, OUT_OF_RANGE). The
 * send completes when its buffer may be reused, the receive when the data is in it. */

/* Sends `len` bytes of registration `mem` at `offset` with tag `tag`. */
TCPX_C_API tcpx_status_t tcpx_send(tcpx_endpoint_t* ep, uint64_t peer, uint64_t mem,
                                   uint64_t offset, uint64_t len, uint64_t tag, uint64_t* xfer);

/* Receives up to `len` bytes into registration `mem` at `offset` from a send with tag `tag`. */
TCPX_C_API tcpx_status_t tcpx_recv(tcpx_endpoint_t* ep, uint64_t peer, uint64_t mem,
                                   uint64_t offset, uint64_t len, uint64_t tag, uint64_t* xfer);

/* ---------------------------------------------------------------------------------------------
 * Completion. A finished transfer (done or failed) is reported once, by the tcpx_poll or
 * tcpx_wait that sees it finish; its id is unknown (TCPX_ERR_INVALID_ARGUMENT) afterwards. */

/* Checks on a transfer without blocking. *done = 0 while it is in flight (TCPX_OK). *done = 1
 * once it finished: TCPX_OK if it succeeded, its failure's code (and tcpx_last_error) if it
 * failed — an unknown id reads as a failed transfer (TCPX_ERR_INVALID_ARGUMENT, *done = 1), and
 * so does every other failure of the call itself (a NULL endpoint): *done is 1 whenever the
 * result is not TCPX_OK. */
TCPX_C_API tcpx_status_t tcpx_poll(tcpx_endpoint_t* ep, uint64_t xfer, int* done);

/* Blocks until the transfer finishes or `timeout_ms` milliseconds pass (negative: forever).
 * TCPX_OK when it succeeded; its failure's code when it failed; TCPX_ERR_TIMEOUT when the time
 * passed first (the transfer is still in flight and can be waited for again). A transfer whose
 * peer stopped answering (TCPX_P2P_PEER_TIMEOUT_MS) fails with TCPX_ERR_TIMEOUT too, and is then
 * reported: tcpx_poll tells the two apart (*done = 0 while in flight; TCPX_ERR_INVALID_ARGUMENT
 * once reported). With a negative timeout TCPX_ERR_TIMEOUT is always such a failure. */
TCPX_C_API tcpx_status_t tcpx_wait(tcpx_endpoint_t* ep, uint64_t xfer, int timeout_ms);

/* Cancels a transfer in progress. TCPX_OK: it is cancelled; it fails with TCPX_ERR_CANCELLED (as
 * tcpx_poll / tcpx_wait report), nothing of it touches our memory any more, and it lets go of
 * its regions. A receive (tcpx_recv) no send has matched: TCPX_OK; one already matched, and a
 * send: TCPX_ERR_FAILED_PRECONDITION (they end on their own). A read: what is not yet on its way
 * into our memory lands in scratch and the peer never gets its notification; TCPX_OK, or
 * TCPX_ERR_UNAVAILABLE while chunks already on their way land (it is cancelled all the same and
 * reports TCPX_ERR_CANCELLED once they have, or the connection's error). A write: dropped, nothing
 * sent, while its connection is being made; once its request is out its data is sent whole and
 * arrives with its notification: TCPX_OK once all of it has gone, else TCPX_ERR_UNAVAILABLE (it
 * reports TCPX_ERR_CANCELLED once it has). TCPX_ERR_FAILED_PRECONDITION for a finished transfer,
 * TCPX_ERR_INVALID_ARGUMENT for an unknown or reported id (Endpoint::cancel says more). */
TCPX_C_API tcpx_status_t tcpx_cancel(tcpx_endpoint_t* ep, uint64_t xfer);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* TCPX_TCPX_H_ */
