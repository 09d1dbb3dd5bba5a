/* An installed tcpx-p2p used from C (C11): two endpoints over loopback, a 1 MiB WRITE, every
 * byte checked. Exit code 0 and "consumer_c: ok" when it all worked. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <tcpx/tcpx.h>

#define CHECK(call)                                                            \
    do {                                                                       \
        if ((call) != TCPX_OK) {                                               \
            fprintf(stderr, "consumer_c: %s: %s\n", #call, tcpx_last_error()); \
            return 1;                                                          \
        }                                                                      \
    } while (0)

int main(void) {
    enum { kLen = 1 << 20 };
    tcpx_config_t* cfg = NULL;
    tcpx_endpoint_t* a = NULL;
    tcpx_endpoint_t* b = NULL;
    CHECK(tcpx_config_new(&cfg));
    CHECK(tcpx_config_set(cfg, "SOCKET_IFNAME", "=lo"));
    CHECK(tcpx_config_set(cfg, "NSOCKS", "2"));
    CHECK(tcpx_endpoint_create(cfg, "consumer-c-a", &a));
    CHECK(tcpx_endpoint_create(cfg, "consumer-c-b", &b));
    tcpx_config_free(cfg);

    char md[1024];
    size_t md_len = sizeof(md);
    CHECK(tcpx_endpoint_metadata(b, md, &md_len));
    uint64_t peer = 0;
    CHECK(tcpx_connect(a, md, md_len, &peer));

    uint8_t* src = malloc(kLen);
    uint8_t* dst = calloc(kLen, 1);
    if (src == NULL || dst == NULL) return 1;
    for (size_t i = 0; i < kLen; ++i) src[i] = (uint8_t)(i * 13 + 1);
    uint64_t src_mem = 0, dst_mem = 0, xfer = 0;
    CHECK(tcpx_reg(a, src, kLen, &src_mem));
    CHECK(tcpx_reg(b, dst, kLen, &dst_mem));
    char desc[256];
    size_t desc_len = sizeof(desc);
    CHECK(tcpx_mem_descriptor(b, dst_mem, desc, &desc_len));
    CHECK(tcpx_write(a, peer, src_mem, 0, desc, desc_len, 0, kLen, NULL, 0, 0, &xfer));
    CHECK(tcpx_wait(a, xfer, 30000));
    if (memcmp(src, dst, kLen) != 0) {
        fprintf(stderr, "consumer_c: the bytes differ\n");
        return 1;
    }
    tcpx_endpoint_destroy(a);
    tcpx_endpoint_destroy(b);
    free(src);
    free(dst);
    printf("consumer_c: ok\n");
    return 0;
}
