/* A verbs program that moves real data the way NCCL loads verbs: libibverbs is dlopen'ed and every
 * verb resolved with dlvsym(..., "IBVERBS_1.1"). N RC QPs between two hosts; QP numbers, PSNs and
 * GIDs are exchanged over TCP (the application's own channel), each side moves its QPs to RTR with
 * the peer's GID, then the client sends M messages of S bytes on every QP and the server checks
 * every byte. Run by the VM lab over Soft-RoCE with librlbverbs.so preloaded on both sides.
 *
 *   server: rdma_pingpong -d rxe0 -x GID_INDEX [-q QPS] [-n MSGS] [-s SIZE] [-t DEPTH] [-p PORT]
 *   client: rdma_pingpong -d rxe0 -x GID_INDEX [-q QPS] [-n MSGS] [-s SIZE] [-t DEPTH] [-p PORT] SERVER
 * Prints one line per QP (its number and the source GID index it was given) and a last line,
 * "pingpong: ok ...", exit 0; anything else is a failure with a message. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <dlfcn.h>
#include <infiniband/verbs.h>
#include <netdb.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

static int DEPTH = 16;               /* sends outstanding per QP (-t): the VM lab's emulated links lose
                                      * bursts, and rxe on 6.1 fails QPs under heavy loss */

static void *h;
static void *sym(const char *name)
{
    void *f = dlvsym(h, name, "IBVERBS_1.1");
    if (!f) {
        fprintf(stderr, "pingpong: dlvsym %s: %s\n", name, dlerror());
        exit(3);
    }
    return f;
}

#define DIE(...) do { fprintf(stderr, "pingpong: " __VA_ARGS__); fputc('\n', stderr); exit(1); } while (0)

struct wire {                        /* one QP, as exchanged (network order) */
    uint32_t qpn, psn;
    uint8_t gid[16];
};

static int tcp(const char *server, const char *port)
{
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE}, *ai;
    if (getaddrinfo(server, port, &hints, &ai))
        DIE("cannot resolve %s", server ? server : "listen address");
    int fd = socket(ai->ai_family, SOCK_STREAM, 0), one = 1;
    if (server) {
        for (int i = 0; connect(fd, ai->ai_addr, ai->ai_addrlen); i++) {
            if (i == 300)
                DIE("cannot connect to %s:%s", server, port);
            usleep(100000);
            close(fd);
            fd = socket(ai->ai_family, SOCK_STREAM, 0);
        }
        return fd;
    }
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(fd, ai->ai_addr, ai->ai_addrlen) || listen(fd, 1))
        DIE("cannot listen on %s", port);
    int c = accept(fd, NULL, NULL);
    close(fd);
    return c;
}

static void full(int fd, void *buf, size_t n, int out)
{
    for (size_t done = 0; done < n;) {
        ssize_t r = out ? write(fd, (char *)buf + done, n - done) : read(fd, (char *)buf + done, n - done);
        if (r <= 0)
            DIE("the peer closed the exchange");
        done += r;
    }
}

int main(int argc, char **argv)
{
    const char *dev = "rxe0", *port = "18515", *server = NULL;
    int gid_index = 1, nqp = 4, msgs = 100, size = 16384, c;
    while ((c = getopt(argc, argv, "d:x:q:n:s:p:t:")) != -1) {
        if (c == 'd') dev = optarg;
        else if (c == 'x') gid_index = atoi(optarg);
        else if (c == 'q') nqp = atoi(optarg);
        else if (c == 'n') msgs = atoi(optarg);
        else if (c == 's') size = atoi(optarg);
        else if (c == 'p') port = optarg;
        else if (c == 't') DEPTH = atoi(optarg) > 0 ? atoi(optarg) : 1;
        else return 2;
    }
    if (optind < argc)
        server = argv[optind];
    h = dlopen("libibverbs.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!h)
        DIE("dlopen libibverbs.so.1: %s", dlerror());
    struct ibv_device **(*get_list)(int *) = sym("ibv_get_device_list");
    const char *(*dev_name)(struct ibv_device *) = sym("ibv_get_device_name");
    struct ibv_context *(*open_dev)(struct ibv_device *) = sym("ibv_open_device");
    struct ibv_pd *(*alloc_pd)(struct ibv_context *) = sym("ibv_alloc_pd");
    struct ibv_mr *(*reg_mr)(struct ibv_pd *, void *, size_t, int) = sym("ibv_reg_mr");
    struct ibv_cq *(*create_cq)(struct ibv_context *, int, void *, struct ibv_comp_channel *, int) =
        sym("ibv_create_cq");
    struct ibv_qp *(*create_qp)(struct ibv_pd *, struct ibv_qp_init_attr *) = sym("ibv_create_qp");
    int (*modify_qp)(struct ibv_qp *, struct ibv_qp_attr *, int) = sym("ibv_modify_qp");
    int (*query_gid)(struct ibv_context *, uint8_t, int, union ibv_gid *) = sym("ibv_query_gid");
    int (*destroy_qp)(struct ibv_qp *) = sym("ibv_destroy_qp");
    const char *(*wc_status)(enum ibv_wc_status) = sym("ibv_wc_status_str");

    struct ibv_device **list = get_list(NULL), *d = NULL;
    for (int i = 0; list && list[i]; i++)
        if (!strcmp(dev_name(list[i]), dev))
            d = list[i];
    if (!d)
        DIE("no RDMA device %s", dev);
    struct ibv_context *ctx = open_dev(d);
    struct ibv_pd *pd = alloc_pd(ctx);
    size_t bytes = server ? (size_t)nqp * msgs * size : (size_t)nqp * DEPTH * size;   /* client sends */
    char *buf = calloc(1, bytes);
    struct ibv_mr *mr = reg_mr(pd, buf, bytes, IBV_ACCESS_LOCAL_WRITE);
    struct ibv_cq *cq = create_cq(ctx, nqp * (msgs + DEPTH) + 16, NULL, NULL, 0);
    if (!ctx || !pd || !buf || !mr || !cq)
        DIE("cannot set up %s", dev);
    struct ibv_qp **qp = calloc(nqp, sizeof(*qp));
    struct wire *mine = calloc(nqp, sizeof(*mine)), *peer = calloc(nqp, sizeof(*peer));
    union ibv_gid gid;
    if (query_gid(ctx, 1, gid_index, &gid))
        DIE("no GID %d on %s", gid_index, dev);
    srand(getpid());
    for (int i = 0; i < nqp; i++) {
        struct ibv_qp_init_attr ia = {.send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC,
                                      .cap = {.max_send_wr = DEPTH, .max_recv_wr = msgs + 1,
                                              .max_send_sge = 1, .max_recv_sge = 1}};
        qp[i] = create_qp(pd, &ia);
        struct ibv_qp_attr a = {.qp_state = IBV_QPS_INIT, .port_num = 1};
        if (!qp[i] || modify_qp(qp[i], &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS))
            DIE("cannot make QP %d", i);
        mine[i] = (struct wire){htonl(qp[i]->qp_num), htonl(rand() & 0xffffff)};
        memcpy(mine[i].gid, gid.raw, 16);
    }
    int fd = tcp(server, port);
    full(fd, mine, nqp * sizeof(*mine), 1);
    full(fd, peer, nqp * sizeof(*peer), 0);
    for (int i = 0; i < nqp; i++) {
        struct ibv_qp_attr a = {.qp_state = IBV_QPS_RTR, .path_mtu = IBV_MTU_1024, .dest_qp_num = ntohl(peer[i].qpn),
                                .rq_psn = ntohl(peer[i].psn), .max_dest_rd_atomic = 1, .min_rnr_timer = 12};
        a.ah_attr.is_global = 1;
        a.ah_attr.port_num = 1;
        a.ah_attr.grh.sgid_index = gid_index;
        a.ah_attr.grh.hop_limit = 64;
        memcpy(a.ah_attr.grh.dgid.raw, peer[i].gid, 16);
        if (modify_qp(qp[i], &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                                     IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER))
            DIE("RTR of QP 0x%x failed", qp[i]->qp_num);
        struct ibv_qp_attr r = {.qp_state = IBV_QPS_RTS, .timeout = 14, .retry_cnt = 7, .rnr_retry = 7,
                                .sq_psn = ntohl(mine[i].psn), .max_rd_atomic = 1};
        if (modify_qp(qp[i], &r, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                                     IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC))
            DIE("RTS of QP 0x%x failed", qp[i]->qp_num);
        printf("qp 0x%x peer 0x%x\n", qp[i]->qp_num, ntohl(peer[i].qpn));
    }
    long ok = 0, bad = 0;
    char byte;
    if (server) {                    /* the client, once the server has posted its receives: send */
        full(fd, &byte, 1, 0);
        int *inflight = calloc(nqp, sizeof(int)), *sent = calloc(nqp, sizeof(int)), left = nqp * msgs;
        for (int i = 0; i < nqp; i++)
            for (int m = 0; m < msgs; m++) {
                char *p = buf + ((size_t)i * msgs + m) * size;
                memset(p, (i * 31 + m) & 0xff, size);
                memcpy(p, &i, sizeof(i));
                memcpy(p + sizeof(i), &m, sizeof(m));
            }
        time_t quiet_since = time(NULL);
        while (left) {
            if (time(NULL) - quiet_since > 120)
                DIE("no send completed for 120 s, %d short", left);
            for (int i = 0; i < nqp; i++)
                while (inflight[i] < DEPTH && sent[i] < msgs) {
                    struct ibv_sge sge = {(uintptr_t)(buf + ((size_t)i * msgs + sent[i]) * size), size, mr->lkey};
                    struct ibv_send_wr wr = {.wr_id = i, .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_SEND,
                                             .send_flags = IBV_SEND_SIGNALED}, *badwr;
                    if (ibv_post_send(qp[i], &wr, &badwr))
                        DIE("post_send on QP %d", i);
                    inflight[i]++, sent[i]++;
                }
            struct ibv_wc wc[32];
            int n = ibv_poll_cq(cq, 32, wc);
            if (n > 0)
                quiet_since = time(NULL);
            for (int k = 0; k < n; k++) {
                if (wc[k].status != IBV_WC_SUCCESS)
                    DIE("send on QP %lu: %s", (unsigned long)wc[k].wr_id, wc_status(wc[k].status));
                inflight[wc[k].wr_id]--, left--;
            }
        }
        full(fd, &ok, sizeof(ok), 0);
        full(fd, &bad, sizeof(bad), 0);
    } else {
        int *got = calloc(nqp, sizeof(int));
        for (int i = 0; i < nqp; i++)
            for (int s = 0; s < DEPTH && s < msgs; s++) {
                struct ibv_sge sge = {(uintptr_t)(buf + ((size_t)i * DEPTH + s) * size), size, mr->lkey};
                struct ibv_recv_wr wr = {.wr_id = (uint64_t)i * DEPTH + s, .sg_list = &sge, .num_sge = 1}, *badwr;
                if (ibv_post_recv(qp[i], &wr, &badwr))
                    DIE("post_recv on QP %d", i);
            }
        full(fd, &byte, 1, 1);
        time_t quiet_since = time(NULL);
        for (long left = (long)nqp * msgs; left;) {
            struct ibv_wc wc[32];
            int n = ibv_poll_cq(cq, 32, wc);
            if (n > 0)
                quiet_since = time(NULL);
            else if (time(NULL) - quiet_since > 120)
                DIE("nothing received for 120 s, %ld messages short", left);
            for (int k = 0; k < n; k++, left--) {
                int i = wc[k].wr_id / DEPTH;
                char *p = buf + wc[k].wr_id * size;
                int qi, m;
                memcpy(&qi, p, sizeof(qi));
                memcpy(&m, p + sizeof(qi), sizeof(m));
                int good = wc[k].status == IBV_WC_SUCCESS && (int)wc[k].byte_len == size && qi == i && m == got[i];
                for (int b = 8; good && b < size; b++)
                    good = (unsigned char)p[b] == ((i * 31 + m) & 0xff);
                good ? ok++ : bad++;
                if (++got[i] + DEPTH - 1 < msgs) {       /* the slot takes the next message */
                    struct ibv_sge sge = {(uintptr_t)p, size, mr->lkey};
                    struct ibv_recv_wr wr = {.wr_id = wc[k].wr_id, .sg_list = &sge, .num_sge = 1}, *badwr;
                    if (ibv_post_recv(qp[i], &wr, &badwr))
                        DIE("post_recv on QP %d", i);
                }
            }
        }
        full(fd, &ok, sizeof(ok), 1);
        full(fd, &bad, sizeof(bad), 1);
    }
    for (int i = 0; i < nqp; i++)
        destroy_qp(qp[i]);
    printf("pingpong: %s: %d QPs, %d messages of %d bytes each, %ld checked good, %ld bad\n",
           bad || ok != (long)nqp * msgs ? "FAILED" : "ok", nqp, msgs, size, ok, bad);
    return bad || ok != (long)nqp * msgs;
}
