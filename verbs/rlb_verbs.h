/* RLB verbs path selector: what the library (librlbverbs.so, inside applications) and the host
 * agent (rlbhost/verbs/) must agree on. The one definition: the agent parses these #defines and
 * enums (rlbcommon/cheader.py), the library compiles them.
 *
 * The library talks to the agent over a local SOCK_SEQPACKET socket, one text message per packet
 * (fields separated by one space, addresses in IPv6 text form):
 *
 *   library -> agent
 *     HELLO <version> <pid> <kept[0]>,<kept[1]>,...   on connect; the counts are QPs the library
 *                                              kept on the application's addresses while it had
 *                                              no agent to tell (by enum rlbv_keep)
 *     INIT <dev> <port> <qpn>                   an RC/UC QP moved to INIT: it takes part (no answer)
 *     RTR <seq> <dev> <port> <qpn> <sgid_index> <sgid> <dgid> <dest_qpn> <deadline_ns> <timeout_ns>
 *                                              an RC/UC QP moves to RTR: which path?
 *     AH <seq> <dev> <port> <sgid_index> <sgid> <dgid> <deadline_ns> <timeout_ns>   a UD address
 *                                              handle: which path?
 *     USED <dev> <port> <qpn> <path> <keep> <dgid> <dest_qpn>   what the QP got (path 0: the
 *                                              application's own addresses, for reason <keep>)
 *     AHUSED <seq> <handle> <path> <keep>       the same for an address handle (no answer)
 *     GONE <dev> <port> <qpn>                   the QP was destroyed (no answer)
 *     AHGONE <handle>                           the address handle was destroyed (no answer)
 *   agent -> library
 *     HELLO <version> <dev>:<port>,... <table>  the RDMA ports this agent places QPs for, and the
 *                                              file of its decisions (below)
 *     PATH <seq> <path> <sgid_index> <saddr> <daddr>   use this GID index (whose address is saddr)
 *                                              and this destination address
 *     KEEP <seq> <keep>                         keep the application's addresses
 *     WAIT <seq> <deadline_ns>                  wait for the answer until this later deadline (at
 *                                              most rlbv_wait_ns() after asking): the
 *                                              other end of the QP may be on the path already and
 *                                              its agent's word is on its way; giving up now could
 *                                              leave the two ends apart
 *
 * QP numbers are per RDMA device (a server's eight NICs each number theirs from the same start), so
 * a QP is named by its device, port and number everywhere: in these messages, in the agent and in
 * the decision table below. Between hosts a QP end is its NIC's base address and its number: the
 * address names one RDMA port fabric-wide.
 *
 * deadline_ns is CLOCK_MONOTONIC: the agent does not start work for a question whose asker will
 * have given up; timeout_ns is how long the asker waits in all (a question that waited half of it
 * tells the agent it is behind). */
#ifndef RLB_VERBS_H
#define RLB_VERBS_H

#include <stdint.h>

#define RLBV_VERSION            3       /* 2: QPs named by device and port, IPv4 and other-NIC keeps;
                                         * 3: WAIT */
#define RLBV_MSG_MAX            512     /* bytes in one message, either way */
#define RLBV_TIMEOUT_MS         20      /* default: how long a question may take before the QP
                                         * keeps the application's addresses (RLB_VERBS_TIMEOUT_MS) */
#define RLBV_WAIT_MAX           4       /* WAIT extends a question to at most this many timeouts, */
#define RLBV_WAIT_MIN_MS        10000   /* and to this long if that is longer: the other end's
                                         * library may be on the path already, and its word comes
                                         * through two agents that a burst or a starved machine can
                                         * hold back for seconds (1 s left 1 pair in 4000 apart
                                         * under overload, and one in a VM lab starved for 7 s);
                                         * an RTR that waits longer once is cheaper than a QP
                                         * whose ends are apart for its life */
#define RLBV_SEND_WAIT_MS       5       /* a full socket (an agent not reading) is waited on this
                                         * long at most; then the agent counts as stalled */
#define RLBV_RECONNECT_MS       1000    /* a missing agent is looked for again at most this often */
#define RLBV_SNDBUF             1048576     /* the library's socket buffer (the kernel caps it at
                                             * net.core.wmem_max, and doubles it): a burst of INITs
                                             * fits, and the agent knows when it may not have */
#define RLBV_AH_HANDLE_BIT      0x1000000   /* address handles are accounted as QP number
                                             * RLBV_AH_HANDLE_BIT | id: above any 24-bit QPN */

/* Why a QP keeps the application's addresses (USED/KEEP). */
enum rlbv_keep {
    RLBV_KEEP_NONE = 0,           /* not kept: on a path */
    RLBV_KEEP_NOAGENT,            /* no agent socket, or it closed */
    RLBV_KEEP_TIMEOUT,            /* no answer in time (agent or peer agent) */
    RLBV_KEEP_NOTFABRIC,          /* addresses outside this host's fabric paths */
    RLBV_KEEP_NOTROCEV2,          /* the source GID is not a RoCE v2 GID */
    RLBV_KEEP_NOPEER,             /* the peer's agent did not answer */
    RLBV_KEEP_PEERKEEPS,          /* the peer's QP does not take part (no library there) */
    RLBV_KEEP_NOPATH,             /* no path both hosts can use */
    RLBV_KEEP_NOGID,              /* this host has no RoCE v2 GID for the chosen path */
    RLBV_KEEP_GIDCHANGED,         /* the GID table no longer held the address the agent named */
    RLBV_KEEP_REFUSED,            /* the device refused the new addresses (the QP was moved
                                   * to RTR with the application's own) */
    RLBV_KEEP_BUSY,               /* the agent refused more work from this process */
    RLBV_KEEP_PORTSMODE,          /* this host's paths are ports (scale-up), not addresses */
    RLBV_KEEP_ERROR,              /* a malformed question or answer */
    RLBV_KEEP_IPV4,               /* the GIDs are IPv4 (RoCE v2 over IPv4): the fabric's paths are
                                   * IPv6 prefixes (NCCL: NCCL_IB_ADDR_FAMILY=AF_INET6) */
    RLBV_KEEP_OTHERNIC,           /* the RDMA port's netdev is not a fabric NIC the agent serves */
    RLBV_KEEP_LINKLOCAL,          /* the GIDs are link-local: not routed across the fabric (NCCL
                                   * with AF_INET on a NIC that has no IPv4 address takes GID 0) */
    RLBV_KEEP_MAX,
};

/* The agent's decisions, in a file every process of the host maps read-only: a QP pair decided
 * before this end's library asks (the other end asked first, or the rendezvous proposed it) is read
 * here, with no question to the agent, so the second end of a QP never waits on a busy agent.
 * Open addressing (RLBV_TABLE_PROBE slots from rlbv_slot()); each record under a sequence count
 * (odd while the agent writes it: a reader takes a copy between two equal even counts; the
 * agent's stores are ordered by the count, the library's loads acquire it). */
#define RLBV_TABLE_MAGIC        0x524c4254  /* "RLBT" */
#define RLBV_TABLE_SLOTS        65536
#define RLBV_TABLE_PROBE        16
#define RLBV_SLOT_EMPTY         0           /* never used: a lookup stops here */
#define RLBV_SLOT_LIVE          1
#define RLBV_SLOT_REMOVED       2           /* was used: a lookup goes on past it */
#define RLBV_SLOT_PENDING       3           /* the pair's path, not this end's yet: the other end's
                                             * library goes first and its agent's word is awaited
                                             * (a library that finds it asks, and may wait up to
                                             * rlbv_wait_ns(): giving up could leave the two ends
                                             * apart) */

struct rlbv_table_head {
    uint32_t magic;
    uint32_t version;                       /* RLBV_VERSION */
    uint32_t slots;
    uint32_t record_size;                   /* sizeof(struct rlbv_record) */
};

struct rlbv_record {
    uint32_t seq;
    uint32_t state;                         /* RLBV_SLOT_* */
    uint32_t device;                        /* key: this end's RDMA port (rlbv_device()), */
    uint32_t local_qpn;                     /* its QP, */
    uint32_t remote_qpn;                    /* the peer's, */
    uint8_t  peer_iid[8];                   /* and the peer's interface identifier (the low 64 bits
                                             * of any of its path addresses: the path field is in
                                             * the /64 prefix) */
    uint16_t path;                          /* 0: keep the application's addresses */
    uint16_t gid_index;                     /* this end's RoCE v2 GID on the path */
    uint32_t keep;                          /* enum rlbv_keep, when path is 0 */
    uint8_t  saddr[16];                     /* the address at gid_index */
    uint8_t  daddr[16];                     /* the peer's address on the path */
};

/* An RDMA port as the table names it: FNV-1a over the device's name, then the port number (the
 * agent computes the same: rlbhost/verbs/table.py). */
static inline uint32_t rlbv_device(const char *dev, uint8_t port)
{
    uint32_t h = 2166136261u;
    for (const unsigned char *p = (const unsigned char *)dev; *p; p++)
        h = (h ^ *p) * 16777619u;
    return (h ^ port) * 16777619u;
}

/* How long after asking a library waits on a pair the other end may be on already (the agent
 * parks the question as long: rlbhost/verbs/protocol.py wait_ns). */
static inline long long rlbv_wait_ns(long long timeout_ns)
{
    long long n = RLBV_WAIT_MAX * timeout_ns, floor = RLBV_WAIT_MIN_MS * 1000000LL;
    return n > floor ? n : floor;
}

/* FNV-1a over the key. */
static inline uint32_t rlbv_slot(uint32_t device, uint32_t local_qpn, uint32_t remote_qpn, const uint8_t iid[8])
{
    uint32_t h = 2166136261u;
    uint8_t key[20];
    for (int i = 0; i < 4; i++) {
        key[i] = (uint8_t)(device >> (8 * i));
        key[4 + i] = (uint8_t)(local_qpn >> (8 * i));
        key[8 + i] = (uint8_t)(remote_qpn >> (8 * i));
    }
    for (int i = 0; i < 8; i++)
        key[12 + i] = iid[i];
    for (int i = 0; i < 20; i++)
        h = (h ^ key[i]) * 16777619u;
    return h % RLBV_TABLE_SLOTS;
}

#endif
