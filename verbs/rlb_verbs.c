/* librlbverbs.so: puts each RC/UC QP (and UD address handle) of an unmodified application on its
 * own fabric path, where the RDMA NIC builds the packets and TC never sees them.
 *
 * Loaded with LD_PRELOAD. When a QP moves to RTR with an address vector towards a fabric peer, the
 * library asks the host agent (rlbhost, over a local socket) for the QP's path and replaces the
 * source GID index with this host's GID on that path and the destination GID with the peer's
 * address on it; the peer's library asks the same question for its end of the QP and gets the
 * same answer (the agents agree between them: rlbhost/verbs/). Whatever goes wrong (no agent, no
 * answer within RLB_VERBS_TIMEOUT_MS, a peer without the library, a device that refuses the new
 * addresses) the QP keeps the application's own addresses: it works as without RLB.
 *
 * Programs linked against libibverbs reach the wrappers below through symbol interposition (they
 * carry libibverbs' version, IBVERBS_1.1). Programs that dlopen libibverbs and resolve symbols
 * with dlsym/dlvsym (NCCL) are given librlbverbs-ibverbs.so instead: a library with no code that
 * needs this one and then libibverbs, so that a lookup in it finds these wrappers first and every
 * other verb in libibverbs. dlopen is wrapped for that and nothing else: every other call goes on
 * as a tail call, so the dynamic linker still sees the application as the caller.
 *
 * Environment: RLB_VERBS=0 turns it off; RLB_VERBS_SOCKET (default /run/rlb/verbs.sock);
 * RLB_VERBS_TIMEOUT_MS (default RLBV_TIMEOUT_MS); RLB_VERBS_LOG=0 (silent), 1 (default: one line
 * per cause of keeping the application's addresses), 2 (every decision). */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <dlfcn.h>
#include <errno.h>
#include <infiniband/verbs.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "rlb_verbs.h"

#define EXPORT __attribute__((visibility("default")))
#define IBV_VERSION "IBVERBS_1.1"

static const char *const keep_names[RLBV_KEEP_MAX] = {
    [RLBV_KEEP_NONE] = "none",
    [RLBV_KEEP_NOAGENT] = "no agent answers on the socket",
    [RLBV_KEEP_TIMEOUT] = "no answer in time",
    [RLBV_KEEP_NOTFABRIC] = "not fabric addresses of this host",
    [RLBV_KEEP_NOTROCEV2] = "the source GID is not RoCE v2",
    [RLBV_KEEP_NOPEER] = "the peer's agent did not answer",
    [RLBV_KEEP_PEERKEEPS] = "the peer's QP does not take part (no library or agent there)",
    [RLBV_KEEP_NOPATH] = "no path both hosts can use",
    [RLBV_KEEP_NOGID] = "no RoCE v2 GID for the path",
    [RLBV_KEEP_GIDCHANGED] = "the GID table changed under the answer",
    [RLBV_KEEP_REFUSED] = "the device refused the path's addresses",
    [RLBV_KEEP_BUSY] = "the agent is busy with this process",
    [RLBV_KEEP_PORTSMODE] = "the host's paths are ports, not addresses",
    [RLBV_KEEP_ERROR] = "a malformed message",
    [RLBV_KEEP_IPV4] = "its GIDs are IPv4 (RoCE v2 over IPv4); the fabric's paths are IPv6",
    [RLBV_KEEP_OTHERNIC] = "the RDMA port is not on a fabric NIC the agent serves",
    [RLBV_KEEP_LINKLOCAL] = "its GIDs are link-local, not routed across the fabric",
};
_Static_assert(sizeof(keep_names) / sizeof(keep_names[0]) == RLBV_KEEP_MAX, "one name per reason");

/* What would change it, in the one line a process logs per cause (NCCL's settings: the jobs this
 * is for; docs/operations.md has the whole list). */
static const char *const keep_hints[RLBV_KEEP_MAX] = {
    [RLBV_KEEP_NOAGENT] = "start the host agent (rlbhost attach) or set RLB_VERBS_SOCKET",
    [RLBV_KEEP_NOTFABRIC] = "use the GID of the NIC's fabric address (NCCL_IB_GID_INDEX: `rlbhost paths`)",
    [RLBV_KEEP_NOTROCEV2] = "use a RoCE v2 GID (NCCL_IB_ROCE_VERSION_NUM=2, NCCL_IB_GID_INDEX: `rlbhost paths`)",
    [RLBV_KEEP_IPV4] = "set NCCL_IB_ADDR_FAMILY=AF_INET6 (or NCCL_IB_GID_INDEX to the fabric IPv6 GID: "
                       "`rlbhost paths`)",
    [RLBV_KEEP_OTHERNIC] = "attach the agent to every fabric NIC (`rlbhost status` lists those it serves)",
    [RLBV_KEEP_LINKLOCAL] = "set NCCL_IB_ADDR_FAMILY=AF_INET6 (NCCL's AF_INET default takes GID 0 on a NIC "
                            "without IPv4)",
};

typedef void *(*dlopen_fn)(const char *, int);
typedef int (*modify_qp_fn)(struct ibv_qp *, struct ibv_qp_attr *, int);
typedef int (*destroy_qp_fn)(struct ibv_qp *);
typedef struct ibv_ah *(*create_ah_fn)(struct ibv_pd *, struct ibv_ah_attr *);
typedef int (*destroy_ah_fn)(struct ibv_ah *);
typedef int (*query_gid_fn)(struct ibv_context *, uint8_t, int, union ibv_gid *);
typedef const char *(*device_name_fn)(struct ibv_device *);

static struct {
    int enabled, log;
    long long timeout_ns;
    char socket_path[sizeof(((struct sockaddr_un *)0)->sun_path)];
    char shim_path[4096];
} cfg = {.enabled = 1, .log = 1, .timeout_ns = RLBV_TIMEOUT_MS * 1000000LL};

/* The connection to the agent: one per process, used under `lock`. */
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static int agent_fd = -1;
static long long next_try_ns;           /* no connection attempt before this */
static long long slow_until_ns;         /* the agent let questions time out: none asked till then */
static int timeouts;                    /* questions in a row the agent did not answer in time */
static long long heard_ns;              /* when the agent last sent anything (a late answer too) */
static unsigned long long seq;
static unsigned long long kept_unreported[RLBV_KEEP_MAX];   /* told to the agent at HELLO */
static atomic_int logged[RLBV_KEEP_MAX];

static dlopen_fn real_dlopen_ptr;

/* The agent's decision table, mapped read-only (NULL until the agent names it). */
static const struct rlbv_table_head *table;

/* ---- small helpers ------------------------------------------------------------------------ */
static long long now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static void say(const char *fmt, ...)
{
    char line[RLBV_MSG_MAX + 128];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(line, sizeof(line), fmt, ap);
    va_end(ap);
    if (n > 0)
        dprintf(STDERR_FILENO, "rlbverbs[%d]: %s\n", (int)getpid(), line);
}

/* The first QP kept for each cause is logged (all of them with RLB_VERBS_LOG=2). */
static void log_keep(int why, const char *what, uint32_t qpn, const char *dev)
{
    if (!cfg.log || why <= RLBV_KEEP_NONE || why >= RLBV_KEEP_MAX)
        return;
    if (atomic_fetch_add(&logged[why], 1) && cfg.log < 2)
        return;
    say("%s 0x%x on %s keeps the application's addresses: %s%s%s%s", what, qpn, dev, keep_names[why],
        keep_hints[why] ? ": " : "", keep_hints[why] ? keep_hints[why] : "",
        cfg.log < 2 ? " (further QPs kept for this cause are counted by the agent, not logged)" : "");
}

enum gid_kind { GID_FABRIC, GID_IPV4, GID_LINKLOCAL, GID_OTHER };

static enum gid_kind gid_kind(const union ibv_gid *g)
{
    const uint8_t *b = g->raw;
    static const uint8_t v4mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
    static const uint8_t zero[16];
    if (!memcmp(b, v4mapped, 12))
        return GID_IPV4;                            /* RoCE v2 over IPv4 (NCCL's default family) */
    if (b[0] == 0xfe && (b[1] & 0xc0) == 0x80)
        return GID_LINKLOCAL;                       /* not routed: one link only */
    if (!memcmp(b, zero, 16) || b[0] == 0xff)
        return GID_OTHER;                           /* unset, multicast */
    return GID_FABRIC;
}

/* Why a QP between these GIDs is left alone without asking (0: ask). */
static int left_alone(const union ibv_gid *sgid, const union ibv_gid *dgid)
{
    if (gid_kind(sgid) == GID_IPV4 || gid_kind(dgid) == GID_IPV4)
        return RLBV_KEEP_IPV4;
    if (gid_kind(sgid) == GID_LINKLOCAL || gid_kind(dgid) == GID_LINKLOCAL)
        return RLBV_KEEP_LINKLOCAL;
    return 0;
}

static void gid_text(const union ibv_gid *g, char *out)
{
    inet_ntop(AF_INET6, g->raw, out, INET6_ADDRSTRLEN);
}

/* ---- the real functions ------------------------------------------------------------------- */
static void *real_dlopen(const char *file, int mode)
{
    dlopen_fn f = __atomic_load_n(&real_dlopen_ptr, __ATOMIC_ACQUIRE);
    if (!f) {
        f = (dlopen_fn)dlsym(RTLD_NEXT, "dlopen");
        __atomic_store_n(&real_dlopen_ptr, f, __ATOMIC_RELEASE);
    }
    return f ? f(file, mode) : NULL;
}

/* libibverbs' own definition: the next one after this library when the application is linked
 * against it, else the copy it dlopen'ed (found without loading anything). */
static void *real_verb(const char *name)
{
    void *p = dlvsym(RTLD_NEXT, name, IBV_VERSION);
    if (p)
        return p;
    void *h = real_dlopen("libibverbs.so.1", RTLD_NOW | RTLD_NOLOAD);
    if (h) {
        p = dlvsym(h, name, IBV_VERSION);
        dlclose(h);
    }
    return p;
}

#define REAL(type, name)                                                    \
    static type real_##name(void)                                           \
    {                                                                       \
        static type cached;                                                 \
        type f = __atomic_load_n(&cached, __ATOMIC_ACQUIRE);                \
        if (!f) {                                                           \
            f = (type)real_verb("ibv_" #name);                              \
            __atomic_store_n(&cached, f, __ATOMIC_RELEASE);                 \
        }                                                                   \
        return f;                                                           \
    }
REAL(modify_qp_fn, modify_qp)
REAL(destroy_qp_fn, destroy_qp)
REAL(create_ah_fn, create_ah)
REAL(destroy_ah_fn, destroy_ah)
REAL(query_gid_fn, query_gid)
REAL(device_name_fn, get_device_name)

static const char *dev_name(struct ibv_context *ctx)
{
    device_name_fn f = real_get_device_name();
    const char *n = ctx && ctx->device && f ? f(ctx->device) : NULL;
    return n && *n ? n : "?";
}

/* ---- the agent's decision table --------------------------------------------------------- */
/* Map the agent's decision table (read-only; the same file for the agent's life and its
 * restarts, so a mapping stays good). Without it every QP asks. */
static void map_table(const char *path)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) || st.st_size < (off_t)sizeof(struct rlbv_table_head)) {
        if (fd >= 0)
            close(fd);
        return;
    }
    void *m = mmap(NULL, st.st_size, PROT_READ, MAP_SHARED, fd, 0);
    close(fd);
    if (m == MAP_FAILED)
        return;
    const struct rlbv_table_head *h = m;
    if (h->magic != RLBV_TABLE_MAGIC || h->version != RLBV_VERSION || h->record_size != sizeof(struct rlbv_record) ||
        st.st_size < (off_t)(sizeof(*h) + (size_t)h->slots * sizeof(struct rlbv_record)) || !h->slots) {
        munmap(m, st.st_size);
        return;
    }
    __atomic_store_n(&table, h, __ATOMIC_RELEASE);
}

/* The agent's decision for this QP pair, if it made one: 1 and a copy in *out (2: pending). */
static int table_find(uint32_t device, uint32_t local_qpn, uint32_t remote_qpn, const union ibv_gid *peer,
                      struct rlbv_record *out)
{
    const struct rlbv_table_head *h = __atomic_load_n(&table, __ATOMIC_ACQUIRE);
    if (!h)
        return 0;
    const uint8_t *iid = peer->raw + 8;
    const struct rlbv_record *recs = (const void *)(h + 1);
    uint32_t first = rlbv_slot(device, local_qpn, remote_qpn, iid) % h->slots;
    for (uint32_t i = 0; i < RLBV_TABLE_PROBE; i++) {
        const struct rlbv_record *r = &recs[(first + i) % h->slots];
        int tries;
        for (tries = 0; tries < 64; tries++) {
            uint32_t s1 = __atomic_load_n(&r->seq, __ATOMIC_ACQUIRE);
            if (s1 & 1) {
                if (tries >= 8)
                    sched_yield();                  /* the agent is in the middle of writing it */
                continue;
            }
            memcpy(out, (const void *)r, sizeof(*out));
            __atomic_thread_fence(__ATOMIC_ACQUIRE);
            if (__atomic_load_n(&r->seq, __ATOMIC_RELAXED) != s1)
                continue;
            if (out->state == RLBV_SLOT_EMPTY)
                return 0;
            if ((out->state == RLBV_SLOT_LIVE || out->state == RLBV_SLOT_PENDING) && out->device == device &&
                out->local_qpn == local_qpn && out->remote_qpn == remote_qpn && !memcmp(out->peer_iid, iid, 8))
                return out->state == RLBV_SLOT_LIVE ? 1 : 2;
            break;                                  /* another pair's, or removed: the next slot */
        }
        if (tries == 64)
            return 3;           /* never read whole: this pair's may be the one being written */
    }
    return 0;
}

/* ---- the agent connection (call with `lock` held) ---------------------------------------- */
static void disconnect(void)
{
    if (agent_fd >= 0)
        close(agent_fd);
    agent_fd = -1;
}

/* The agent is stalled: ask it nothing (one try, no wait) for a while, or until it is heard again. */
static void go_slow(void)
{
    slow_until_ns = now_ns() + RLBV_RECONNECT_MS * 1000000LL;
}

/* Send before the deadline: a burst (a thousand QPs' INITs) may fill the socket faster than the
 * agent reads it, so a full socket is waited on, but for RLBV_SEND_WAIT_MS at most: an agent that
 * does not read is a stalled one (asked nothing for a while, as when it does not answer; a QP it
 * never heard of keeps its addresses at both ends). */
static int send_msg(const char *msg, long long deadline)
{
    if (agent_fd < 0)
        return -1;
    long long now = now_ns();
    if (now < slow_until_ns)
        deadline = now;                             /* one try, no wait */
    else if (deadline > now + RLBV_SEND_WAIT_MS * 1000000LL)
        deadline = now + RLBV_SEND_WAIT_MS * 1000000LL;
    for (;;) {
        ssize_t n = send(agent_fd, msg, strlen(msg), MSG_DONTWAIT | MSG_NOSIGNAL);
        if (n >= 0)
            return 0;
        if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
            disconnect();                           /* the agent went away */
            return -1;
        }
        long long left = deadline - now_ns();
        if (left <= 0) {
            if (now_ns() >= slow_until_ns)
                go_slow();
            return -1;
        }
        struct pollfd p = {.fd = agent_fd, .events = POLLOUT};
        poll(&p, 1, (int)((left + 999999) / 1000000));
    }
}

/* One message into buf (NUL-terminated) before the deadline: 1, or 0 on timeout, -1 on error. */
static int recv_msg(char *buf, size_t size, long long deadline)
{
    for (;;) {
        ssize_t n = recv(agent_fd, buf, size - 1, MSG_DONTWAIT);
        if (n > 0) {
            buf[n] = 0;
            heard_ns = now_ns();
            return 1;
        }
        if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
            disconnect();
            return -1;
        }
        long long left = deadline - now_ns();
        if (left <= 0)
            return 0;                               /* a last look was taken just above */
        struct pollfd p = {.fd = agent_fd, .events = POLLIN};
        int ms = (int)((left + 999999) / 1000000);
        if (poll(&p, 1, ms) < 0 && errno != EINTR) {
            disconnect();
            return -1;
        }
    }
}

/* Connected to the agent (and greeted) before the deadline? Returns a keep reason or 0. */
static int ensure_agent(long long deadline)
{
    if (agent_fd >= 0)
        return RLBV_KEEP_NONE;
    long long now = now_ns();
    if (now < next_try_ns)
        return RLBV_KEEP_NOAGENT;
    next_try_ns = now + RLBV_RECONNECT_MS * 1000000LL;
    int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0)
        return RLBV_KEEP_NOAGENT;
    int sndbuf = RLBV_SNDBUF;                       /* a burst of INITs fits (as the kernel allows) */
    setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &sndbuf, sizeof(sndbuf));
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    memcpy(sa.sun_path, cfg.socket_path, sizeof(sa.sun_path));
    if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
        close(fd);
        return RLBV_KEEP_NOAGENT;
    }
    agent_fd = fd;
    char msg[RLBV_MSG_MAX];
    int off = snprintf(msg, sizeof(msg), "HELLO %d %d ", RLBV_VERSION, (int)getpid());
    for (int i = 0; i < RLBV_KEEP_MAX && off < (int)sizeof(msg); i++)
        off += snprintf(msg + off, sizeof(msg) - off, "%s%llu", i ? "," : "", kept_unreported[i]);
    if (send_msg(msg, deadline) < 0) {
        disconnect();
        return RLBV_KEEP_NOAGENT;
    }
    int r = recv_msg(msg, sizeof(msg), deadline);
    int version = 0;
    char ports[RLBV_MSG_MAX], path[RLBV_MSG_MAX];
    int fields = r > 0 ? sscanf(msg, "HELLO %d %511s %511s", &version, ports, path) : 0;
    if (r <= 0 || fields < 1 || version != RLBV_VERSION) {
        if (r > 0 && cfg.log)
            say("agent at %s speaks another protocol (%.60s): not using it", cfg.socket_path, msg);
        disconnect();
        return r == 0 ? RLBV_KEEP_TIMEOUT : RLBV_KEEP_NOAGENT;
    }
    if (fields == 3 && !table)
        map_table(path);
    memset(kept_unreported, 0, sizeof(kept_unreported));
    next_try_ns = 0;
    return RLBV_KEEP_NONE;
}

/* The lock, if it comes before the deadline (CLOCK_MONOTONIC). pthread_mutex_clocklock is glibc
 * 2.30's; older ones (RHEL 8: 2.28) wait on the wall clock for the same length of time. */
#if !defined(RLBV_NO_CLOCKLOCK) && defined(__GLIBC__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 30))
static int lock_until(long long deadline)
{
    struct timespec ts = {.tv_sec = deadline / 1000000000LL, .tv_nsec = deadline % 1000000000LL};
    return pthread_mutex_clocklock(&lock, CLOCK_MONOTONIC, &ts) == 0;
}
#else
static int lock_until(long long deadline)
{
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    long long left = deadline - now_ns();
    long long at = now.tv_sec * 1000000000LL + now.tv_nsec + (left > 0 ? left : 0);
    struct timespec ts = {.tv_sec = at / 1000000000LL, .tv_nsec = at % 1000000000LL};
    return pthread_mutex_timedlock(&lock, &ts) == 0;
}
#endif

/* Send, connecting if need be; a connection found dead (the agent restarted) is made again once
 * at once. 0 when sent. */
static int deliver(const char *msg, long long deadline)
{
    int had = agent_fd >= 0;
    if (ensure_agent(deadline) == RLBV_KEEP_NONE && send_msg(msg, deadline) == 0)
        return 0;
    if (!had || agent_fd >= 0)
        return -1;
    next_try_ns = 0;
    return ensure_agent(deadline) == RLBV_KEEP_NONE && send_msg(msg, deadline) == 0 ? 0 : -1;
}

/* A message that needs no answer (connecting if need be, within the timeout): 0 when sent. */
static int tell(const char *fmt, ...)
{
    char msg[RLBV_MSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    long long deadline = now_ns() + cfg.timeout_ns;
    if (!lock_until(deadline))
        return -1;
    int r = deliver(msg, deadline);
    pthread_mutex_unlock(&lock);
    return r;
}

/* A kept QP's cause, counted where the agent will see it (USED, or the next HELLO). */
static void count_kept(int why, int told)
{
    if (told || why <= RLBV_KEEP_NONE || why >= RLBV_KEEP_MAX)
        return;
    pthread_mutex_lock(&lock);
    kept_unreported[why]++;
    pthread_mutex_unlock(&lock);
}

struct answer {
    unsigned long long seq;         /* the question's number */
    int path, gid_index, keep;
    union ibv_gid saddr, daddr;
};

/* A QP pair as the decision table names it. */
struct pair {
    uint32_t device, local_qpn, remote_qpn;
    const union ibv_gid *peer;
};

/* The decision table's answer: -1 when the pair is not there, -2 while it is pending (the other
 * end goes first), else 0 (a path in *a) or a keep reason. */
static int from_table(const struct pair *k, struct answer *a)
{
    struct rlbv_record r;
    int found = table_find(k->device, k->local_qpn, k->remote_qpn, k->peer, &r);
    if (!found)
        return -1;
    if (found >= 2)
        return -2;                              /* pending, or being written: waited on as pending */
    a->path = r.path;
    a->gid_index = r.gid_index;
    a->keep = r.path ? RLBV_KEEP_NONE : (r.keep > RLBV_KEEP_NONE && r.keep < RLBV_KEEP_MAX ? (int)r.keep
                                                                                          : RLBV_KEEP_ERROR);
    memcpy(a->saddr.raw, r.saddr, 16);
    memcpy(a->daddr.raw, r.daddr, 16);
    return a->keep;
}

/* The table's word on a pair, a pending one waited on until `latest` (the agent's own bound for
 * it): the other end may be on the path already, and whether this end follows is the agent's to
 * say (the path confirmed, or withdrawn because this end's question came too late). Returns as
 * from_table. */
static int settled(const struct pair *k, struct answer *a, long long latest)
{
    int t = from_table(k, a);
    long pause_ns = 200000;         /* 0.2 ms, doubling to 5: a burst's hundreds of waiting */
    while (t == -2 && now_ns() < latest) {      /* processes must not take the agents' CPU */
        struct timespec pause = {0, pause_ns};
        nanosleep(&pause, NULL);
        pause_ns = pause_ns < 2500000 ? 2 * pause_ns : 5000000;
        t = from_table(k, a);
    }
    return t;
}

/* A question whose pair is pending in the table (called with `lock` held): the agent's word lands
 * in the table (the path confirmed, or the pair kept), so it is waited for there, after letting go
 * of the lock: a wait this long (up to rlbv_wait_ns()) must not hold up the questions of the
 * process's other threads, which would keep their QPs without a word to the agent. */
static int pending(const struct pair *k, struct answer *a, long long latest)
{
    pthread_mutex_unlock(&lock);
    int t = settled(k, a, latest);
    return t >= 0 ? t : RLBV_KEEP_TIMEOUT;
}

/* Ask (the question is formatted after "<kind> <seq> "); 0 and the answer, or a keep reason. A
 * QP's pair (k) pending in the table when the time is up, or when the agent says WAIT, is waited
 * for longer, up to rlbv_wait_ns(), in the table (pending()): its other end may be on the path
 * already, and a slow agent here must not leave the two apart. */
static int ask(struct answer *a, const struct pair *k, const char *kind, const char *fmt, ...)
{
    long long deadline = now_ns() + cfg.timeout_ns;
    if (!lock_until(deadline))
        return RLBV_KEEP_TIMEOUT;                   /* other threads' questions took the time */
    /* answers to questions given up on may still wait in the socket: they are told apart by
     * number, so every question gets a new one */
    unsigned long long my = a->seq = ++seq;
    char msg[RLBV_MSG_MAX];
    int off = snprintf(msg, sizeof(msg), "%s %llu ", kind, my);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg + off, sizeof(msg) - off, fmt, ap);
    va_end(ap);
    off = strlen(msg);
    if (now_ns() < slow_until_ns && agent_fd >= 0) {
        /* A word from the agent since it was judged stalled (the answers to the questions sent
         * meanwhile, late ones): it was busy for a moment, not stalled, and is asked again now
         * rather than up to a second later (a 40 ms silence kept every QP a process readied in
         * the next second on its addresses). What is read here answers questions given up on. */
        char late[RLBV_MSG_MAX];
        while (recv_msg(late, sizeof(late), 0) > 0)
            ;
        if (heard_ns > slow_until_ns - RLBV_RECONNECT_MS * 1000000LL) {     /* since go_slow() */
            slow_until_ns = 0;
            timeouts = 0;
        }
    }
    if (now_ns() < slow_until_ns) {
        /* A stalled agent costs one wait a second, not one per QP. The question still goes, its
         * time already up (one try, no wait): an agent that catches up then answers its pair keep
         * to the peer, rather than give the peer a path this end never saw. */
        if (agent_fd >= 0) {
            snprintf(msg + off, sizeof(msg) - off, " %lld %lld", now_ns(), cfg.timeout_ns);
            send_msg(msg, 0);
        }
        pthread_mutex_unlock(&lock);
        return RLBV_KEEP_TIMEOUT;
    }
    int why = ensure_agent(deadline);
    if (why) {
        pthread_mutex_unlock(&lock);
        return why;
    }
    snprintf(msg + off, sizeof(msg) - off, " %lld %lld", deadline, cfg.timeout_ns);
    if (deliver(msg, deadline) < 0) {
        pthread_mutex_unlock(&lock);
        return agent_fd < 0 ? RLBV_KEEP_NOAGENT : RLBV_KEEP_BUSY;
    }
    why = RLBV_KEEP_TIMEOUT;
    long long latest = deadline - cfg.timeout_ns + rlbv_wait_ns(cfg.timeout_ns);
    for (;;) {
        int r = recv_msg(msg, sizeof(msg), deadline);
        if (r == 0 && k) {
            int t = from_table(k, a);
            if (t == -2)
                return pending(k, a, latest);       /* (lets go of the lock) */
            if (t >= 0) {
                why = t;                            /* decided, the answer still on its way */
                break;
            }
        }
        if (r <= 0) {
            why = r == 0 ? RLBV_KEEP_TIMEOUT : RLBV_KEEP_NOAGENT;
            /* a stalled agent (two questions in a row and not a word since the first): stop asking
             * for a while; a busy one, still answering late, is asked on */
            if (r == 0 && ++timeouts >= 2 && now_ns() - heard_ns > 2 * cfg.timeout_ns)
                go_slow();
            break;
        }
        unsigned long long s;
        char src[INET6_ADDRSTRLEN + 1], dst[INET6_ADDRSTRLEN + 1];
        int keep;
        long long later;
        if (sscanf(msg, "WAIT %llu %lld", &s, &later) == 2) {
            if (s == my && k && from_table(k, a) == -2)
                return pending(k, a, latest);       /* (lets go of the lock) */
            if (s == my && later > deadline)        /* the other end may have the path: its word */
                deadline = later < latest ? later : latest;     /* is worth a bounded wait */
            continue;
        }
        if (sscanf(msg, "PATH %llu %d %d %46s %46s", &s, &a->path, &a->gid_index, src, dst) == 5) {
            if (s != my)
                continue;                           /* the late answer to a question given up */
            timeouts = 0;
            why = a->path > 0 && a->gid_index >= 0 && inet_pton(AF_INET6, src, a->saddr.raw) == 1 &&
                          inet_pton(AF_INET6, dst, a->daddr.raw) == 1
                      ? RLBV_KEEP_NONE
                      : RLBV_KEEP_ERROR;
            break;
        }
        if (sscanf(msg, "KEEP %llu %d", &s, &keep) == 2) {
            if (s != my)
                continue;
            timeouts = 0;
            why = keep > RLBV_KEEP_NONE && keep < RLBV_KEEP_MAX ? keep : RLBV_KEEP_ERROR;
            break;
        }
        why = RLBV_KEEP_ERROR;
        break;
    }
    pthread_mutex_unlock(&lock);
    return why;
}

/* The agent's answer holds if the GID it named is still at that index (addresses can change
 * between its reading of the table and ours). */
static int check_gid(struct ibv_context *ctx, int port, const struct answer *a)
{
    union ibv_gid g;
    query_gid_fn q = real_query_gid();
    if (!q || q(ctx, port, a->gid_index, &g) || memcmp(g.raw, a->saddr.raw, 16))
        return RLBV_KEEP_GIDCHANGED;
    return RLBV_KEEP_NONE;
}

/* ---- the wrapped verbs ------------------------------------------------------------------- */
static int takes_part(struct ibv_qp *qp)
{
    return cfg.enabled && qp && (qp->qp_type == IBV_QPT_RC || qp->qp_type == IBV_QPT_UC);
}

EXPORT int ibv_modify_qp(struct ibv_qp *qp, struct ibv_qp_attr *attr, int mask)
{
    modify_qp_fn real = real_modify_qp();
    if (!real)
        return ENOSYS;
    if (!takes_part(qp) || !attr || !(mask & IBV_QP_STATE))
        return real(qp, attr, mask);
    const char *dev = dev_name(qp->context);
    if (attr->qp_state == IBV_QPS_INIT) {
        /* before the application can hand the QP number to its peer: the QP takes part */
        int rc = real(qp, attr, mask);
        if (!rc)
            tell("INIT %s %d %u", dev, (mask & IBV_QP_PORT) && attr->port_num ? attr->port_num : 1, qp->qp_num);
        return rc;
    }
    struct ibv_ah_attr *av = &attr->ah_attr;
    if (attr->qp_state != IBV_QPS_RTR || (mask & (IBV_QP_AV | IBV_QP_DEST_QPN)) !=
        (IBV_QP_AV | IBV_QP_DEST_QPN) || !av->is_global || gid_kind(&av->grh.dgid) == GID_OTHER)
        return real(qp, attr, mask);

    int port = av->port_num ? av->port_num : 1;
    union ibv_gid sgid;
    query_gid_fn q = real_query_gid();
    if (!q || q(qp->context, port, av->grh.sgid_index, &sgid) || gid_kind(&sgid) == GID_OTHER)
        return real(qp, attr, mask);                /* a source this library cannot read */
    char s[INET6_ADDRSTRLEN], d[INET6_ADDRSTRLEN];
    gid_text(&sgid, s);
    gid_text(&av->grh.dgid, d);
    struct answer a = {0};
    struct pair key = {rlbv_device(dev, port), qp->qp_num, attr->dest_qp_num, &av->grh.dgid};
    int why = left_alone(&sgid, &av->grh.dgid);     /* left alone, but counted and said once */
    if (!why)
        why = from_table(&key, &a);
    if (why < 0) {                                  /* not decided yet, or pending: ask */
        long long latest = now_ns() + rlbv_wait_ns(cfg.timeout_ns);
        why = ask(&a, &key, "RTR", "%s %d %u %d %s %s %u", dev, port, qp->qp_num, av->grh.sgid_index, s, d,
                  attr->dest_qp_num);
        if (why > RLBV_KEEP_NONE && settled(&key, &a, latest) >= 0)
            why = a.path ? RLBV_KEEP_NONE : a.keep;   /* the decision landed as the time ran out */
    }
    if (!why)
        why = check_gid(qp->context, port, &a);
    int rc;
    if (!why) {
        struct ibv_qp_attr mine = *attr;            /* never the application's own struct */
        mine.ah_attr.grh.sgid_index = a.gid_index;
        mine.ah_attr.grh.dgid = a.daddr;
        rc = real(qp, &mine, mask);
        if (rc) {
            int rc0 = real(qp, attr, mask);
            if (!rc0)
                why = RLBV_KEEP_REFUSED;            /* the QP works, on the application's addresses */
            rc = rc0;
        } else if (cfg.log >= 2) {
            char n[INET6_ADDRSTRLEN];
            gid_text(&a.daddr, n);
            say("QP 0x%x on %s: path %d, GID index %d, peer %s (QP 0x%x)", qp->qp_num, dev, a.path,
                a.gid_index, n, attr->dest_qp_num);
        }
    } else {
        rc = real(qp, attr, mask);
    }
    if (rc)
        return rc;                                  /* the application sees its own failure */
    int told = tell("USED %s %d %u %d %d %s %u", dev, port, qp->qp_num, why ? 0 : a.path, why, d,
                    attr->dest_qp_num) == 0;
    count_kept(why, told);
    log_keep(why, "QP", qp->qp_num, dev);
    return rc;
}

EXPORT int ibv_destroy_qp(struct ibv_qp *qp)
{
    destroy_qp_fn real = real_destroy_qp();
    if (!real)
        return ENOSYS;
    if (!takes_part(qp))
        return real(qp);
    char dev[64];
    snprintf(dev, sizeof(dev), "%s", dev_name(qp->context));
    uint32_t qpn = qp->qp_num;
    int rc = real(qp);
    if (!rc)
        tell("GONE %s %u", dev, qpn);
    return rc;
}

EXPORT struct ibv_ah *ibv_create_ah(struct ibv_pd *pd, struct ibv_ah_attr *attr)
{
    create_ah_fn real = real_create_ah();
    if (!real) {
        errno = ENOSYS;
        return NULL;
    }
    if (!cfg.enabled || !pd || !attr || !attr->is_global || gid_kind(&attr->grh.dgid) == GID_OTHER)
        return real(pd, attr);
    int port = attr->port_num ? attr->port_num : 1;
    const char *dev = dev_name(pd->context);
    union ibv_gid sgid;
    query_gid_fn q = real_query_gid();
    if (!q || q(pd->context, port, attr->grh.sgid_index, &sgid) || gid_kind(&sgid) == GID_OTHER)
        return real(pd, attr);
    char s[INET6_ADDRSTRLEN], d[INET6_ADDRSTRLEN];
    gid_text(&sgid, s);
    gid_text(&attr->grh.dgid, d);
    struct answer a = {0};
    int why = left_alone(&sgid, &attr->grh.dgid);
    if (!why)
        why = ask(&a, NULL, "AH", "%s %d %d %s %s", dev, port, attr->grh.sgid_index, s, d);
    if (!why)
        why = check_gid(pd->context, port, &a);
    struct ibv_ah *ah = NULL;
    if (!why) {
        struct ibv_ah_attr mine = *attr;
        mine.grh.sgid_index = a.gid_index;
        mine.grh.dgid = a.daddr;
        ah = real(pd, &mine);
        if (!ah)
            why = RLBV_KEEP_REFUSED;
    }
    if (!ah)
        ah = real(pd, attr);
    if (!ah)
        return NULL;
    int told = tell("AHUSED %llu %lu %d %d", a.seq, (unsigned long)(uintptr_t)ah, why ? 0 : a.path, why) == 0;
    count_kept(why, told);
    log_keep(why, "address handle", 0, dev);
    return ah;
}

EXPORT int ibv_destroy_ah(struct ibv_ah *ah)
{
    destroy_ah_fn real = real_destroy_ah();
    if (!real)
        return ENOSYS;
    int rc = real(ah);
    if (!rc && cfg.enabled && agent_fd >= 0)
        tell("AHGONE %lu", (unsigned long)(uintptr_t)ah);
    return rc;
}

/* ---- dlopen: programs that load libibverbs themselves get the library that finds these ---- */
static int is_libibverbs(const char *file)
{
    const char *base = strrchr(file, '/');
    base = base ? base + 1 : file;
    return !strncmp(base, "libibverbs.so", 13);
}

static void *shim_dlopen(const char *file, int mode)
{
    if (!file || !cfg.enabled || !cfg.shim_path[0] || (mode & RTLD_NOLOAD) || !is_libibverbs(file))
        return NULL;
    return real_dlopen(cfg.shim_path, mode);
}

/* Exported as dlopen in both of glibc's versions (rlb_verbs.map, built by rlbhost/verbs/build.py);
 * the last call is a tail call so that glibc sees the application's return address (its RUNPATH,
 * its namespace), as if this library were not there. */
EXPORT void *rlb_dlopen(const char *file, int mode)
{
    void *h = shim_dlopen(file, mode);
    if (h)
        return h;
    dlopen_fn f = __atomic_load_n(&real_dlopen_ptr, __ATOMIC_ACQUIRE);
    if (!f) {
        f = (dlopen_fn)dlsym(RTLD_NEXT, "dlopen");
        __atomic_store_n(&real_dlopen_ptr, f, __ATOMIC_RELEASE);
    }
    return f(file, mode);
}
EXPORT void *rlb_dlopen_compat(const char *file, int mode) __attribute__((alias("rlb_dlopen")));
__asm__(".symver rlb_dlopen, dlopen@@" RLB_DLOPEN_DEFAULT);
__asm__(".symver rlb_dlopen_compat, dlopen@" RLB_DLOPEN_COMPAT);

/* What a test or an operator can ask of the loaded library: the name of a keep reason, the
 * decision table's slot of a key and its record's layout (the agent writes them from Python). */
EXPORT const char *rlb_verbs_keep_name(int why)
{
    return why >= 0 && why < RLBV_KEEP_MAX ? keep_names[why] : NULL;
}

EXPORT uint32_t rlb_verbs_device(const char *dev, int port)
{
    return rlbv_device(dev, (uint8_t)port);
}

EXPORT uint32_t rlb_verbs_slot(uint32_t device, uint32_t local_qpn, uint32_t remote_qpn, const uint8_t *iid)
{
    return rlbv_slot(device, local_qpn, remote_qpn, iid);
}

EXPORT const char *rlb_verbs_record_layout(void)
{
    static char out[160];
    snprintf(out, sizeof(out), "%zu %zu %zu %zu %zu %zu %zu %zu %zu %zu %zu %zu %zu", sizeof(struct rlbv_table_head),
             sizeof(struct rlbv_record), offsetof(struct rlbv_record, seq), offsetof(struct rlbv_record, state),
             offsetof(struct rlbv_record, device), offsetof(struct rlbv_record, local_qpn), offsetof(struct rlbv_record, remote_qpn),
             offsetof(struct rlbv_record, peer_iid), offsetof(struct rlbv_record, path),
             offsetof(struct rlbv_record, gid_index), offsetof(struct rlbv_record, keep),
             offsetof(struct rlbv_record, saddr), offsetof(struct rlbv_record, daddr));
    return out;
}

/* ---- set-up ------------------------------------------------------------------------------ */
static void after_fork_child(void)
{
    pthread_mutex_init(&lock, NULL);
    if (agent_fd >= 0)
        close(agent_fd);                            /* the parent's connection, not ours */
    agent_fd = -1;
    next_try_ns = 0;
}

__attribute__((constructor)) static void init(void)
{
    const char *v = getenv("RLB_VERBS");
    cfg.enabled = !(v && (!strcmp(v, "0") || !strcasecmp(v, "off") || !strcasecmp(v, "no")));
    v = getenv("RLB_VERBS_LOG");
    if (v && *v)
        cfg.log = atoi(v);
    v = getenv("RLB_VERBS_TIMEOUT_MS");
    if (v && *v) {
        double ms = atof(v);
        if (ms > 0 && ms <= 60000)
            cfg.timeout_ns = (long long)(ms * 1e6);
        else if (cfg.log)
            say("RLB_VERBS_TIMEOUT_MS=%s is not 0-60000: using %d ms", v, RLBV_TIMEOUT_MS);
    }
    v = getenv("RLB_VERBS_SOCKET");
    snprintf(cfg.socket_path, sizeof(cfg.socket_path), "%s", v && *v ? v : "/run/rlb/verbs.sock");
    /* the dlopen shim lies beside this library */
    Dl_info info;
    if (dladdr((void *)init, &info) && info.dli_fname) {
        const char *slash = strrchr(info.dli_fname, '/');
        int dir = slash ? (int)(slash - info.dli_fname) : 1;
        snprintf(cfg.shim_path, sizeof(cfg.shim_path), "%.*s/librlbverbs-ibverbs.so", dir,
                 slash ? info.dli_fname : ".");
    }
    pthread_atfork(NULL, NULL, after_fork_child);
}
