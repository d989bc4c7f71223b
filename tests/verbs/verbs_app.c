/* A verbs program as applications are written: N RC QPs (or UD address handles) moved to INIT and
 * RTR towards one peer GID. Built twice by the tests: linked against libibverbs, and (with
 * -DUSE_DLOPEN) loading it with dlopen and resolving every verb with dlvsym(..., "IBVERBS_1.1")
 * as NCCL does. Prints one line per QP: its number, the RTR call's duration and result, and the
 * application's own attribute struct after the call (which must be left as it was).
 *
 *   verbs_app <qps> <sgid_index> <dgid> <dest_qpn> [ah] [sync] [hold] [threads]
 * sync: after INIT, print READY and wait for a line on stdin (the exchange of QP numbers an
 * application makes with its peer) before the RTRs; hold: keep the QPs until stdin closes;
 * threads: each QP's RTR in a thread of its own (as NCCL's threads connect), QP i's started
 * i x 50 ms after the first's. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <dlfcn.h>
#include <infiniband/verbs.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#ifdef USE_DLOPEN
static void *h;
#define VERB(name) ((__typeof__(&name))resolve(#name))
static void *resolve(const char *name)
{
    void *f = dlvsym(h, name, "IBVERBS_1.1");
    if (!f) {
        fprintf(stderr, "dlvsym %s: %s\n", name, dlerror());
        exit(3);
    }
    return f;
}
#else
#define VERB(name) (&name)
#endif

static long long now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

struct rtr {
    struct ibv_qp *qp;
    unsigned dest;
    union ibv_gid dgid;
    int sgid_index;
    int after_ms;                       /* a pause before the RTR */
};

/* One QP to RTR, timed, and its line printed (one printf: whole lines from every thread). */
static void *rtr(void *arg)
{
    struct rtr *r = arg;
    struct timespec pause = {r->after_ms / 1000, (r->after_ms % 1000) * 1000000L};
    nanosleep(&pause, NULL);
    long long t0 = now_ns();
    struct ibv_qp_attr a = {.qp_state = IBV_QPS_RTR, .path_mtu = IBV_MTU_1024, .dest_qp_num = r->dest,
                            .max_dest_rd_atomic = 1, .min_rnr_timer = 12};
    a.ah_attr.is_global = 1;
    a.ah_attr.port_num = 1;
    a.ah_attr.grh.dgid = r->dgid;
    a.ah_attr.grh.sgid_index = r->sgid_index;
    a.ah_attr.grh.hop_limit = 64;
    int rc = VERB(ibv_modify_qp)(r->qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
                                              IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
    char text[INET6_ADDRSTRLEN];
    inet_ntop(AF_INET6, a.ah_attr.grh.dgid.raw, text, sizeof(text));
    printf("QP %u ns=%lld rc=%d app_sgid_index=%d app_dgid=%s\n", r->qp->qp_num, now_ns() - t0, rc,
           a.ah_attr.grh.sgid_index, text);
    return NULL;
}

int main(int argc, char **argv)
{
    if (argc < 5) {
        fprintf(stderr, "usage: %s qps sgid_index dgid dest_qpn [ah] [hold] [sync] [threads] [paced]\n", argv[0]);
        return 2;
    }
#ifdef USE_DLOPEN
    h = dlopen("libibverbs.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        fprintf(stderr, "dlopen: %s\n", dlerror());
        return 3;
    }
#endif
    int n = atoi(argv[1]), sgid_index = atoi(argv[2]);
    unsigned dest = strtoul(argv[4], NULL, 0);
    int ah = 0, hold = 0, sync = 0, threads = 0, paced = 0;
    for (int i = 5; i < argc; i++) {
        threads |= !strcmp(argv[i], "threads");
        paced |= !strcmp(argv[i], "paced");         /* one RTR every 20 ms, in order */
        ah |= !strcmp(argv[i], "ah");
        hold |= !strcmp(argv[i], "hold");
        sync |= !strcmp(argv[i], "sync");
    }
    union ibv_gid dgid;
    if (inet_pton(AF_INET6, argv[3], dgid.raw) != 1)
        return 2;
    struct ibv_device **devs = VERB(ibv_get_device_list)(NULL);
    struct ibv_context *ctx = VERB(ibv_open_device)(devs[0]);
    struct ibv_pd *pd = VERB(ibv_alloc_pd)(ctx);
    struct ibv_qp **qps = calloc(n, sizeof(*qps));
    struct ibv_ah **ahs = calloc(n, sizeof(*ahs));
    for (int i = 0; i < n && !ah; i++) {
        struct ibv_qp_init_attr ia = {.qp_type = IBV_QPT_RC, .cap = {.max_send_wr = 1, .max_recv_wr = 1}};
        qps[i] = VERB(ibv_create_qp)(pd, &ia);
        struct ibv_qp_attr a = {.qp_state = IBV_QPS_INIT, .port_num = 1};
        if (VERB(ibv_modify_qp)(qps[i], &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS))
            return 4;
    }
    char text[INET6_ADDRSTRLEN], line[64];
    if (sync) {
        printf("READY\n");
        fflush(stdout);
        if (!fgets(line, sizeof(line), stdin))
            return 5;
    }
    int threaded = threads && !ah;          /* address handles are made in order, as before */
    struct rtr *rs = calloc(n, sizeof(*rs));
    for (int i = 0; i < n; i++)
        rs[i] = (struct rtr){qps[i], dest + i, dgid, sgid_index, threaded ? 50 * i : paced && i ? 20 : 0};
    if (threaded) {
        pthread_t *ts = calloc(n, sizeof(*ts));
        for (int i = 0; i < n; i++)
            pthread_create(&ts[i], NULL, rtr, &rs[i]);
        for (int i = 0; i < n; i++)
            pthread_join(ts[i], NULL);
    }
    for (int i = 0; i < n && !threaded; i++) {
        long long t0 = now_ns();
        int rc;
        if (ah) {
            struct ibv_ah_attr aa = {.is_global = 1, .port_num = 1};
            aa.grh.dgid = dgid;
            aa.grh.sgid_index = sgid_index;
            ahs[i] = VERB(ibv_create_ah)(pd, &aa);
            rc = ahs[i] ? 0 : -1;
            inet_ntop(AF_INET6, aa.grh.dgid.raw, text, sizeof(text));
            printf("AH %d ns=%lld rc=%d app_sgid_index=%d app_dgid=%s\n", i, now_ns() - t0, rc,
                   aa.grh.sgid_index, text);
            continue;
        }
        rtr(&rs[i]);
    }
    fflush(stdout);
    if (hold)
        while (fgets(line, sizeof(line), stdin))
            ;
    for (int i = 0; i < n; i++) {
        if (qps[i])
            VERB(ibv_destroy_qp)(qps[i]);
        if (ahs[i])
            VERB(ibv_destroy_ah)(ahs[i]);
    }
    return 0;
}
