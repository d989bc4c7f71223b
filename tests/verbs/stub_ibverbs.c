/* A stand-in libibverbs.so.1 for the verbs library's tests: no device, no kernel. It has the
 * verbs a program needs to create QPs and move them to RTR, with libibverbs' symbol version, and
 * records what it is given: one line per call in $STUB_LOG.
 *   STUB_SYSFS   a tree laid out as /sys/class/infiniband (the device's GID table is read there)
 *   STUB_DEVICE  the device's name (default stub0)
 *   STUB_QPN     the first QP number (default 0x100)
 *   STUB_REFUSE  a GID index the device refuses at RTR (EINVAL), as hardware may
 *   STUB_RES     the kernel's QP table as the agent reads it in tests (RLB_RDMA_RES_DIR): each QP
 *                made is <STUB_RES>/<device>/<QP number in hex> holding the creating thread's id
 *                (the task rdma netlink names), removed when it is destroyed */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <infiniband/verbs.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static unsigned next_qpn;

static void record(const char *fmt, ...)
{
    const char *path = getenv("STUB_LOG");
    if (!path)
        return;
    char line[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(line, sizeof(line) - 1, fmt, ap);
    va_end(ap);
    line[n++] = '\n';
    /* opened once (a device's calls cost the application little; an open per line made this
     * stand-in a third of a many-process bench's CPU), again only if STUB_LOG changes */
    static int fd = -1;
    static char opened[512];
    if (fd < 0 || strcmp(opened, path)) {
        if (fd >= 0)
            close(fd);
        fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
        snprintf(opened, sizeof(opened), "%s", path);
    }
    if (fd >= 0)
        (void)!write(fd, line, n);
}

struct ibv_device **ibv_get_device_list(int *num)
{
    struct ibv_device **list = calloc(2, sizeof(*list));
    list[0] = calloc(1, sizeof(struct ibv_device));
    const char *name = getenv("STUB_DEVICE");
    snprintf(list[0]->name, sizeof(list[0]->name), "%s", name ? name : "stub0");
    if (num)
        *num = 1;
    return list;
}

void ibv_free_device_list(struct ibv_device **list)
{
    free(list);
}

const char *ibv_get_device_name(struct ibv_device *device)
{
    return device->name;
}

struct ibv_context *ibv_open_device(struct ibv_device *device)
{
    struct ibv_context *ctx = calloc(1, sizeof(*ctx));
    ctx->device = device;
    if (!next_qpn) {
        const char *q = getenv("STUB_QPN");
        next_qpn = q ? strtoul(q, NULL, 0) : 0x100;
    }
    return ctx;
}

int ibv_close_device(struct ibv_context *ctx)
{
    free(ctx);
    return 0;
}

struct ibv_pd *ibv_alloc_pd(struct ibv_context *ctx)
{
    struct ibv_pd *pd = calloc(1, sizeof(*pd));
    pd->context = ctx;
    return pd;
}

int ibv_dealloc_pd(struct ibv_pd *pd)
{
    free(pd);
    return 0;
}

/* The QP's entry in the kernel's table (STUB_RES); 0: no table kept */
static int res_path(struct ibv_qp *qp, char *out, size_t n)
{
    const char *root = getenv("STUB_RES");
    if (!root)
        return 0;
    snprintf(out, n, "%s/%s/%x", root, qp->context->device->name, qp->qp_num);
    return 1;
}

struct ibv_qp *ibv_create_qp(struct ibv_pd *pd, struct ibv_qp_init_attr *attr)
{
    struct ibv_qp *qp = calloc(1, sizeof(*qp));
    qp->context = pd->context;
    qp->pd = pd;
    qp->qp_num = next_qpn++;
    qp->qp_type = attr->qp_type;
    qp->state = IBV_QPS_RESET;
    char path[512];
    if (res_path(qp, path, sizeof(path))) {
        int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd >= 0) {
            dprintf(fd, "%d\n", gettid());
            close(fd);
        }
    }
    return qp;
}

int ibv_query_gid(struct ibv_context *ctx, uint8_t port, int index, union ibv_gid *gid)
{
    const char *root = getenv("STUB_SYSFS");
    char path[512], text[64];
    snprintf(path, sizeof(path), "%s/%s/ports/%u/gids/%d", root ? root : "/nonexistent",
             ctx->device->name, port, index);
    FILE *f = fopen(path, "r");
    if (!f)
        return -1;
    int ok = fscanf(f, "%63s", text) == 1 && inet_pton(AF_INET6, text, gid->raw) == 1;
    fclose(f);
    return ok ? 0 : -1;
}

static void gid_text(const union ibv_gid *g, char *out)
{
    inet_ntop(AF_INET6, g->raw, out, INET6_ADDRSTRLEN);
}

int ibv_modify_qp(struct ibv_qp *qp, struct ibv_qp_attr *attr, int mask)
{
    char d[INET6_ADDRSTRLEN];
    gid_text(&attr->ah_attr.grh.dgid, d);
    const char *refuse = getenv("STUB_REFUSE");
    int refused = attr->qp_state == IBV_QPS_RTR && (mask & IBV_QP_AV) && refuse &&
                  atoi(refuse) == attr->ah_attr.grh.sgid_index;
    record("MODIFY qpn=%u state=%d mask=%d sgid_index=%d dgid=%s dest_qpn=%u rc=%d", qp->qp_num,
           attr->qp_state, mask, attr->ah_attr.grh.sgid_index, d, attr->dest_qp_num, refused ? EINVAL : 0);
    if (refused)
        return EINVAL;
    if (mask & IBV_QP_STATE)
        qp->state = attr->qp_state;
    return 0;
}

int ibv_destroy_qp(struct ibv_qp *qp)
{
    record("DESTROY qpn=%u", qp->qp_num);
    char path[512];
    if (res_path(qp, path, sizeof(path)))
        unlink(path);
    free(qp);
    return 0;
}

struct ibv_ah *ibv_create_ah(struct ibv_pd *pd, struct ibv_ah_attr *attr)
{
    char d[INET6_ADDRSTRLEN];
    gid_text(&attr->grh.dgid, d);
    struct ibv_ah *ah = calloc(1, sizeof(*ah));
    ah->context = pd->context;
    ah->pd = pd;
    record("AH ah=%lu sgid_index=%d dgid=%s", (unsigned long)ah, attr->grh.sgid_index, d);
    return ah;
}

int ibv_destroy_ah(struct ibv_ah *ah)
{
    record("AHDESTROY ah=%lu", (unsigned long)ah);
    free(ah);
    return 0;
}
