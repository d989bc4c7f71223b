/* RLB switch data plane: the one definition of every map key, value and constant.
 * Python reads struct layouts from bcc and constants/enums by parsing this file,
 * so nothing here is copied by hand anywhere else. */
#ifndef RLB_SWITCH_H
#define RLB_SWITCH_H

#define RLB_MAX_ROUTES      262144  /* a spine of 256 leaves x 64 hosts x 8 paths = 131072, twice over */
#define RLB_MAX_NEXTHOPS    4096    /* id 0 is "none" */
#define RLB_MAX_GROUPS      1024    /* id 0 is "none"; shared by identical member sets */
#define RLB_MAX_MEMBERS     64      /* next hops per group */
#define RLB_SLOTS           4096    /* weighted slot table per group, power of two */
#define RLB_MAX_PORTS       256     /* devmap slots */
#define RLB_MAX_NEIGHBORS   16384   /* directly connected hosts */
#define RLB_EXACT_BITS      16      /* exact /64 table: 2^16 sets of RLB_EXACT_WAYS routes */
#define RLB_EXACT_WAYS      4
#define RLB_EXACT_MULT      0x9E3779B97F4A7C15  /* set = (key * MULT) >> (64 - BITS) */
#define RLB_FLOWLET_SETS    16384   /* DLB flowlet table: sets of RLB_FLOWLET_WAYS, power of two */
#define RLB_FLOWLET_WAYS    4       /* flows sharing a set each keep their entry (tagged) */
#define RLB_LOAD_BANDS      8       /* port quality bands 0 (idle) .. 7 (full) */

/* Per-route forwarding mode. */
enum rlb_mode {
    RLB_MODE_NONE      = 0,
    RLB_MODE_PINNED    = 1,  /* BGP-DPF: primary next hop, DLB over backup group when it is down */
    RLB_MODE_WEIGHTED  = 2,  /* slot table built in user space (minimal disruption) */
    RLB_MODE_DLB       = 3,  /* flowlet switching on port quality */
    RLB_MODE_CONNECTED = 4,  /* last hop: neighbour MAC from the neighbours map */
    RLB_MODE_LOCAL     = 5,  /* addressed to this router: hand to the kernel */
    RLB_MODE_SPRAY     = 6,  /* per packet over the group's slot table (reorder-tolerant peers) */
};

/* Spray walks the slot table with this odd stride (a permutation of the slots every
 * RLB_SLOTS packets per CPU: each member gets exactly its share, and consecutive packets
 * land far apart in the table, so on different members). */
#define RLB_SPRAY_STRIDE    2531

/* Why a packet was handed to the kernel, plus load-balancing events. Indexes of the per-CPU
 * reasons counter array. Forwarded packets are counted per egress port only (port_stats):
 * user space reports "forwarded" as their sum. */
enum rlb_reason {
    RLB_R_FORWARDED = 0,      /* never counted by the program: the sum of port_stats */
    RLB_R_PASS_NOT_IPV6,
    RLB_R_PASS_MALFORMED,
    RLB_R_PASS_LINK_LOCAL,
    RLB_R_PASS_MULTICAST,
    RLB_R_PASS_CONTROL,       /* ND/RA/redirect, BGP, hop-by-hop options */
    RLB_R_PASS_HOP_LIMIT,     /* kernel sends ICMPv6 time exceeded */
    RLB_R_PASS_NO_ROUTE,
    RLB_R_PASS_LOCAL,
    RLB_R_PASS_NEIGH_MISS,    /* kernel resolves the neighbour */
    RLB_R_PASS_NO_NEXTHOP,    /* every member down or unresolved */
    RLB_R_PASS_NO_PORT,       /* egress port not registered, removed, or its devmap slot empty */
    RLB_R_PASS_TOO_BIG,       /* larger than the egress MTU: the kernel sends Packet Too Big */
    RLB_R_EV_FAILOVER,        /* pinned primary down: went to backup group */
    RLB_R_EV_WEIGHTED_FALLBACK, /* weighted slot's member down: DLB among live members */
    RLB_R_EV_DLB_ASSIGN,      /* new flowlet assigned */
    RLB_R_EV_DLB_REASSIGN,    /* a known flow placed again (its flowlet ended or its member went) */
    RLB_R_EV_DLB_COLLISION,   /* flowlet set full of live flows: placed without an entry */
    RLB_R_EV_SPRAY_FALLBACK,  /* spray slot's member down: per-packet DLB among live members */
    RLB_R_EV_HEARTBEAT,       /* a neighbouring switch's heartbeat answered (XDP_TX) */
    RLB_R_DROP_GTSM,          /* BGP to a link-local address below hop limit 255 (RLB_CFG_GTSM) */
    RLB_R_MAX,
};

/* Data-plane liveness between neighbouring switches (rlbswitch/heartbeat.py): a heartbeat is UDP
 * to RLB_HEARTBEAT_PORT at the neighbour's link-local address, by a fabric port; the neighbour's
 * rlb_switch answers it in XDP, out of the port it came in by. An answer says the program runs
 * and the port moves packets, whatever bird and the agent are doing: a switch that keeps carrier
 * but forwards nothing (hung) stops answering, while one whose bird restarts does not. */
#define RLB_HEARTBEAT_PORT    4796
#define RLB_HEARTBEAT_MAGIC   0x524c4248   /* "RLBH" */
#define RLB_HEARTBEAT_ASK     1
#define RLB_HEARTBEAT_ANSWER  2

struct rlb_heartbeat {            /* a heartbeat's UDP payload (network order) */
    u32 magic;
    u8  kind;                     /* RLB_HEARTBEAT_ASK or RLB_HEARTBEAT_ANSWER */
    u8  pad;
    u16 port;                     /* the prober's port slot: which of its ports asked */
    u32 seq;
    u32 t_ns[2];                  /* the prober's send time (u64, network order) */
};

/* The slow path's policer: every packet handed to the kernel is charged to one bucket by its
 * reason, the class of the port it came in on and that port itself, so a flood from a host (TTL-1
 * packets, TCP 179 to any address, traffic to unresolved neighbours) is dropped here, in XDP,
 * before it can starve the switch's BGP, BFD and ND with its fabric neighbours (buckets of their
 * own) or the other hosts' control traffic (each port its own budget). A packet for a neighbour
 * not resolved yet is charged to the port it leads to, not the one it came by: a flood of made-up
 * addresses in one host's /64 (from anywhere in the fabric) spends that host port's budget. Per CPU
 * (no atomics): a bucket lets through `rate` packets a second on each CPU and port, bursts of
 * `burst` (GCRA: a theoretical arrival time advanced by 1/rate per packet). */
enum rlb_police {
    RLB_P_FABRIC_CONTROL = 0, /* BGP, BFD, ND, link-local from fabric ports: protected */
    RLB_P_EDGE_CONTROL,       /* the same kinds from host ports */
    RLB_P_HOP_LIMIT,          /* hop limit expired: the kernel answers Time Exceeded */
    RLB_P_NEIGH_MISS,         /* to a neighbour being resolved: the kernel holds the packet */
    RLB_P_OTHER,              /* everything else the kernel must see */
    RLB_P_NEIGH_NEW,          /* to an address not being resolved yet: a new neighbour entry */
    RLB_P_MAX,
};

/* Addresses the kernel was handed a packet for, to resolve, recently (neigh_pending): further
 * packets to one are charged to its port's miss bucket; a new one costs the kernel a neighbour
 * entry for the resolution's seconds (3 solicitations 1 s apart), so it is charged to the port's
 * new-neighbour bucket too. The table is machine-wide in Linux (every namespace's entries count
 * towards gc_thresh3): made-up addresses must not fill it. */
#define RLB_NEIGH_PENDING     8192
#define RLB_NEIGH_PENDING_NS  3000000000ULL

enum rlb_port_class {
    RLB_PORT_FABRIC = 0,      /* towards another switch (the default: no entry) */
    RLB_PORT_EDGE   = 1,      /* towards a host */
};
/* port_class values: the class in the low byte, the port's slot + 1 above it (0: not known, an
 * entry written before slots were: its punts are charged to slot 0's buckets) */
#define RLB_CLASS_MASK        0xff
#define RLB_CLASS_SLOT_SHIFT  8

struct rlb_police_cfg {
    u64 interval_ns;          /* 1e9 / rate; 0: this bucket does not police */
    u64 tolerance_ns;         /* burst x interval */
};

struct rlb_police_state {
    u64 tat_ns;               /* theoretical arrival time of the next packet */
    u64 dropped;              /* packets this bucket dropped on this CPU */
};

/* Next-hop flags */
#define RLB_NH_VALID     1
#define RLB_NH_RESOLVED  2   /* dmac is known */
#define RLB_NH_STATIC    4   /* dmac given by the operator, not from the neighbour table */

struct rlb_lpm_key {
    u32 prefixlen;
    u8  addr[16];
};

/* Who programmed a route (user space only): survives agent restarts with the route itself. */
enum rlb_owner {
    RLB_OWNER_UNKNOWN  = 0,
    RLB_OWNER_AGENT    = 1,  /* the bird-fed agent: bird's routes, compiled by policy */
    RLB_OWNER_OPERATOR = 2,  /* rlbswitch route add/apply: never touched by the agent */
    RLB_OWNER_KERNEL   = 3,  /* connected and local routes from interface addresses */
};

struct rlb_route {
    u32 mode;      /* enum rlb_mode */
    u32 nexthop;   /* PINNED: primary next hop id */
    u32 group;     /* PINNED: backup group; WEIGHTED, DLB, SPRAY: the group */
    u32 ifindex;   /* CONNECTED: egress port */
    u32 port;      /* CONNECTED: its slot in ports */
    u32 owner;     /* enum rlb_owner */
};

/* The exact /64 table in front of the trie: every /64 route with no longer prefix inside it,
 * when its set has room (else the trie answers, as for any other prefix). An array, so the
 * lookup is one multiply and one inlined index, not a hash-map walk. key is the /64's first
 * 8 bytes loaded as a native u64; a way counts only while route.mode is non-zero. User space
 * writes a way in steps that each change only bytes no reader can misuse: mode to 0, then key
 * and route, then mode (see rlbswitch/exact.py). */
struct rlb_exact_way {
    u64 key;
    struct rlb_route route;
};

struct rlb_exact_set {
    struct rlb_exact_way way[RLB_EXACT_WAYS];
};

struct rlb_nexthop {
    u32 ifindex;
    u32 port;        /* the port's slot in ports (checked against ifindex on use) */
    u32 flags;       /* RLB_NH_* */
    u8  dmac[6];
    u8  smac[6];
    u8  gateway[16]; /* user space only: the neighbour whose MAC is dmac */
};

struct rlb_group {
    u32 n_members;
    u32 generation;  /* bumped by user space on every rebuild */
    u32 member_nh[RLB_MAX_MEMBERS];
    u32 weight[RLB_MAX_MEMBERS];
    u8  slot[RLB_SLOTS];   /* index into member_nh */
};

/* Indexed by the port's slot (its key in the devmap and the per-port arrays); ifindex 0 is a
 * free slot. Written by user space only. */
struct rlb_port {
    u32 ifindex;
    u32 up;          /* carrier and admin up */
    u32 band_bytes;  /* decayed tx bytes per quality band (from link speed) */
    u32 speed_mbps;  /* the capacity the bands were sized for (status, metrics) */
    u32 mtu;         /* larger packets go to the kernel (Packet Too Big) */
    u8  mac[6];
    u8  pad[2];
};

/* Shared by all CPUs: DLB must see every CPU's load on a port. Forwarding adds bytes without a
 * clock read, and not one packet at a time: each CPU holds its bytes back (rlb_port_stats) and
 * adds them in one atomic add once they reach 1/2^RLB_LOAD_HOLD_SHIFT of the port's quality band,
 * so CPUs forwarding to one port do not fight over this cache line for every packet, and DLB
 * misjudges a port by less than that share of a band per CPU. DLB decisions, which read the
 * clock anyway, fold the bytes since their last look into the decayed figure. */
#define RLB_LOAD_HOLD_SHIFT  4
struct rlb_port_load {
    u64 tx_bytes;      /* cumulative, atomic adds */
    u64 seen_bytes;    /* tx_bytes when last folded in */
    u64 seen_ns;       /* decay applied up to here */
    u64 recent_bytes;  /* halves every load_halflife_ns */
};

/* Per CPU: transmitted by the program (received is the kernel's interface counter). */
struct rlb_port_stats {
    u64 tx_packets;
    u64 tx_bytes;
    u64 load_held;     /* bytes not added to rlb_port_load yet (see there) */
};

struct rlb_counter {
    u64 packets;
    u64 bytes;
};

/* One flow's flowlet, 16 bytes, so a set of RLB_FLOWLET_WAYS is one 64-byte cache line. Tagged
 * with its full hash, so flows sharing a set never take each other's entry; not tied to a group
 * id, so a route rewrite keeps flows whose member stays. Time in ticks of 2^RLB_FLOWLET_TICK_SHIFT
 * ns (about a microsecond), compared modulo 2^32 (wraps every 73 minutes: the timeout is capped
 * far below that). */
#define RLB_FLOWLET_TICK_SHIFT   10
#define RLB_FLOWLET_MAX_TIMEOUT_NS 600000000000   /* 10 minutes */
struct rlb_flowlet {
    u32 hash;
    u32 last;        /* tick of the flow's last packet, never 0; 0: free */
    u32 nexthop;
    u32 member;      /* index in the group, checked against nexthop on use */
};

struct rlb_flowlet_set {
    struct rlb_flowlet way[RLB_FLOWLET_WAYS];
};

struct rlb_in6 {
    u8 addr[16];
};

struct rlb_neighbor {
    u32 ifindex;
    u8  dmac[6];
    u8  pad[2];
};

struct rlb_config {
    u64 flowlet_timeout_ns;   /* default 256 us */
    u64 load_halflife_ns;     /* port-load decay, default 100 us */
    u32 hash_seed;
    u32 roce_port;            /* UDP port whose BTH dest QP enters the hash, default 4791 */
    u32 default_band_bytes;   /* used when a port has none */
    u32 flags;                /* RLB_CFG_* */
};

/* GTSM (RFC 5082) in the data plane: BGP to a link-local address arrives only at hop limit 255.
 * bird sets the minimum hop count on a passive session's socket after accepting it, and a
 * peer's first segments queued before that were read (tested: an OPEN at hop limit 254 reached
 * bird); here no such packet reaches the kernel. Set from the fabric's ttl_security. */
#define RLB_CFG_GTSM  1

#endif
