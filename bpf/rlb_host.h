/* RLB host data plane: the one definition of every map key, value and constant.
 * Address mode: a host has one global address per fabric path (one SLAAC /64 each); the paths
 * differ in one hextet of the prefix (the path field). The application uses the base path's
 * address; egress moves each QP to its path's addresses, ingress restores the base addresses.
 * Ports mode (RLBH_F_PORTS, scale-up fabrics): a path is one egress port (a plane's sub-port);
 * applications address peers' loopbacks, the kernel routes them to the device egress runs on,
 * and egress sends each packet out of its path's port with that link's MACs. */
#ifndef RLB_HOST_H
#define RLB_HOST_H

#define RLBH_MAX_PATHS      16
#define RLBH_MAX_WEIGHTS    4096    /* weight entries (destination prefixes; a GPU per peer) */
#define RLBH_CT_ENTRIES     65536   /* connection tracking (QPs) */
#define RLBH_REV_ENTRIES    65536   /* paths learnt on ingress */
#define RLBH_ROCE_PORTS     4
#define RLBH_PLACEMENTS     65536   /* coordinator placements (QPs) */
#define RLBH_VERBS_ENTRIES  131072  /* QPs placed by the verbs library: two entries each */

#define RLBH_W_SPRAY        1       /* destination tolerates reordering: per-packet choice */
#define RLBH_F_PORTS        1       /* config flags: paths are egress ports, not addresses */

enum rlbh_reason {
    RLBH_R_REWRITTEN = 0,         /* egress: moved to a path's addresses */
    RLBH_R_ON_BASE_PATH,          /* egress: assigned the base path, nothing to rewrite */
    RLBH_R_RESTORED,              /* ingress: path addresses restored to base */
    RLBH_R_PASS_NOT_IPV6,
    RLBH_R_PASS_MALFORMED,
    RLBH_R_PASS_FRAGMENT,
    RLBH_R_PASS_NOT_ROCE,         /* not UDP to a RoCE port */
    RLBH_R_PASS_APP_CHOSE,        /* already on a non-base path address, or a QP whose
                                   * addresses the verbs library chose: left alone */
    RLBH_R_PASS_NOT_BASE,         /* source or destination outside the address plan */
    RLBH_R_PASS_NO_PATH,          /* no path with a positive weight */
    RLBH_R_PASS_NOT_PATH_ADDR,    /* ingress: not addressed to one of our path addresses */
    RLBH_R_EV_ASSIGN,             /* a QP got a path */
    RLBH_R_EV_EXPIRED,            /* ... because its entry had expired */
    RLBH_R_EV_FOLLOW_REVERSE,     /* ... the one its peer uses towards us */
    RLBH_R_EV_SPRAY,              /* per-packet choice */
    RLBH_R_EV_RELEASED,           /* QPs the agent moved to match new weights (user space) */
    RLBH_R_EV_PLACED,             /* a new or idle QP took the coordinator's placement */
    RLBH_R_SENT_ON_PORT,          /* ports mode: a QP's packet sent out of its path's port */
    RLBH_R_HASHED_ON_PORT,        /* ports mode: other traffic, a port by flow hash and weight */
    RLBH_R_MAX,
};

struct rlbh_config {
    u64 expiry_ns;                /* idle QP entries are re-assigned (default 1 s) */
    u32 field;                    /* hextet index 0..7 of the path field */
    u32 base;                     /* path index whose address the applications use */
    u32 flags;
    u16 roce_ports[RLBH_ROCE_PORTS]; /* 0 = unused; default 4791 */
    u16 rotation;                 /* path index where ties between paths start (the host's place) */
    u16 group_size;               /* consecutive paths forming one group (a plane's sub-ports),
                                   * which user space balances as one; 0 = 1 */
};

struct rlbh_path {
    u32 valid;                    /* ports mode: also 0 while the port has no carrier */
    u32 value;                    /* the path field's value, e.g. 3 in fc00:1:1:3::/64; ports
                                   * mode: (plane - 1) x sub-ports + sub-port */
    u8  addr[16];                 /* this host's address on the path (ports mode: the loopback) */
    u32 ifindex;                  /* ports mode: the egress port */
    u8  dmac[6];                  /* ports mode: the plane switch's MAC on that link, then */
    u8  smac[6];                  /* the port's own: one 12-byte store over the Ethernet header */
};

struct rlbh_lpm_key {
    u32 prefixlen;
    u8  addr[16];
};

struct rlbh_weights {
    u32 id;                       /* index into the active-QP counters */
    u32 flags;                    /* RLBH_W_* */
    u32 weight[RLBH_MAX_PATHS];   /* 0 = do not use; relative values */
};

struct rlbh_ct_key {
    u8  peer[16];                 /* the peer's base address */
    u16 sport;                    /* UDP source port */
    u16 pad;
    u32 qp;                       /* BTH destination QP */
};

struct rlbh_ct {
    u64 last_ns;
    u64 created_ns;
    u32 path;
    u32 wid;                      /* weight entry the path was counted under */
    u64 bytes;                    /* sent on this QP (reported to the coordinator) */
};

/* QPs whose addresses the verbs library chose (rlbhost/verbs/, verbs/rlb_verbs.c): the NIC (or
 * Soft-RoCE) builds their packets with the path's addresses already, so egress must not place
 * them again and ingress must not restore them (the QP expects exactly those addresses). Each QP
 * has one entry per direction, keyed as its packets carry it. Written only by the agent. */
#define RLBH_V_TX           1       /* key: the peer's address and QP number (our packets) */
#define RLBH_V_RX           2       /* key: the peer's address and our QP number (its packets) */
#define RLBH_VF_DECIDED     1       /* flags: this host's agent chose the path (the pair's rendezvous) */
#define RLBH_VF_AH          2       /* flags: a UD address handle, not a QP */

struct rlbh_verbs_key {
    u8  peer[16];                 /* the peer's address on the QP's path */
    u32 qpn;                      /* RLBH_V_TX: the peer's QP number; RLBH_V_RX: ours */
    u32 dir;
};

struct rlbh_verbs {
    u64 created_ns;
    u8  peer_base[16];            /* the peer's base address (accounting and reports) */
    u32 path;                     /* path index */
    u32 wid;                      /* weight entry it counts under */
    u32 local_qpn;                /* ours (an address handle: RLBV_AH_HANDLE_BIT | id) */
    u32 remote_qpn;
    u32 pid;                      /* the process that owns it: gone with it */
    u32 flags;                    /* RLBH_VF_* */
};

struct rlbh_rev_key {
    u8  peer[16];
    u16 sport;
    u16 pad;
};

struct rlbh_rev {
    u64 last_ns;
    u32 path;
    u32 pad;
};

/* Ports mode: the GPUs' per-plane health probes (rlbhost/probes.py), UDP to RLBH_PROBE_PORT on
 * a GPU's loopback. rlb_host_echo answers them in the kernel, on the port they arrive at. */
#define RLBH_PROBE_PORT     4799
#define RLBH_PROBE_MAGIC    0x524c4250   /* "RLBP" */
#define RLBH_PROBE_ASK      1
#define RLBH_PROBE_ANSWER   2

struct rlbh_probe {               /* a probe's UDP payload (network order) */
    u32 magic;
    u8  kind;                     /* RLBH_PROBE_ASK or RLBH_PROBE_ANSWER */
    u8  plane;                    /* the plane the probe tests */
    u16 sender;                   /* the prober's GPU number */
    u32 seq;                      /* the prober's round */
    u32 t_ns[2];                  /* the prober's send time (u64, network order) */
    u8  mac[8];                   /* the answer's SipHash-2-4 tag (little-endian u64), 0 in a probe */
};

/* The echo's settings: answer only probes addressed to this GPU's loopback, and sign answers
 * with the key shared with the prober, else the fabric's probe key (tag over seq, send time, plane, sender, then the probe's
 * destination and source addresses: 48 bytes), so a spoofed answer cannot keep a dead plane up.
 * Two keys: the prober accepts either while a new one rolls out; the echo signs with key 0. */
#define RLBH_ECHO_OWN_ADDR  1
#define RLBH_ECHO_SIGN      2
/* Keys shared with one prober each (echo_keys: its prefix -> key), from the GPU's key file
 * (rlbfabric host-keys): an answer to a prober with a key of its own is signed with that key, so a
 * GPU whose file leaked can answer only as itself; one without, with echo_cfg's fabric-wide key. */
#define RLBH_ECHO_KEYS      4096    /* one per peer GPU, as weight entries */
struct rlbh_key {
    u64 k0;                       /* as two little-endian words */
    u64 k1;
};
struct rlbh_echo_cfg {
    u8  addr[16];                 /* this GPU's loopback */
    u64 k0;                       /* the signing key, as two little-endian words */
    u64 k1;
    u32 flags;                    /* RLBH_ECHO_* */
    u32 pad;
};

struct rlbh_path_stats {
    u64 tx_packets;
    u64 tx_bytes;
    u64 rx_packets;
    u64 rx_bytes;
};

#endif
