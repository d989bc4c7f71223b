/* RLB host: TC programs that put each RoCEv2 QP on its own fabric path by rewriting addresses.
 *
 * egress:  base -> path addresses. The source becomes this host's address on the QP's path,
 *          the destination the peer's address on the same path (same interface ID, path field
 *          changed). A QP keeps its path in a connection-tracking table; a new or expired QP takes
 *          the coordinator's placement if it has one, else the path its peer started it on, else
 *          weighted least-active with ties broken from the host's rotation (rlbfabric/localrule.py);
 *          spray destinations choose per packet.
 * ingress: path -> base addresses, byte for byte except hop limit (RoCE's ICRC covers the
 *          addresses, so the stack must see what the sender's stack built), and the path is
 *          remembered so this side answers a peer-initiated QP on the same path.
 * ports mode (RLBH_F_PORTS, FARE scale-up): egress runs on the device the kernel routes the
 *          peers' loopbacks to and sends each packet out of its path's port (a plane's
 *          sub-port) with the link's MACs: QPs by the same conntrack and weights, other traffic
 *          by flow hash and weight. No address changes, so no ingress program on that device;
 *          each port's ingress has the echo, which answers the GPUs' plane probes.
 * Compiled by bcc with -DRLB_PIN_DIR="..." so both programs and every agent share the maps. */
#include <uapi/linux/bpf.h>
#include <uapi/linux/pkt_cls.h>
#include "rlb_host.h"
#include "lib/pin.h"
#include "lib/parse.h"
#include "lib/stats.h"
#include "lib/csum.h"
#include "lib/hash.h"
#include "lib/siphash.h"
#define IP6_OFF    ETH_HLEN
#define SADDR_OFF  (ETH_HLEN + 8)
#define DADDR_OFF  (ETH_HLEN + 24)
#define UDP_OFF    (ETH_HLEN + 40)
#define UCSUM_OFF  (UDP_OFF + 6)

BPF_TABLE_PINNED("array", u32, struct rlbh_config, config, 1, PIN(config));
BPF_TABLE_PINNED("array", u32, struct rlbh_path, paths, RLBH_MAX_PATHS, PIN(paths));
BPF_TABLE_PINNED7("lpm_trie", struct rlbh_lpm_key, struct rlbh_weights, weights, RLBH_MAX_WEIGHTS,
                  PIN(weights), BPF_F_NO_PREALLOC);
/* Active QPs per (weight entry, path) = active + active_adj. `active` is this program's own count
 * (atomic adds only, may go below 0 where user space moved a QP off the path it was counted on);
 * `active_adj` is written only by user space (the sweep's removals, moves and recount, verbs QPs).
 * One writer per word: a user-space rewrite of a word this program adds to lost the adds that
 * landed between its read and its write, and new QPs piled onto the path that looked emptier. */
BPF_TABLE_PINNED("array", u32, s32, active, RLBH_MAX_WEIGHTS * RLBH_MAX_PATHS, PIN(active));
BPF_TABLE_PINNED("array", u32, s32, active_adj, RLBH_MAX_WEIGHTS * RLBH_MAX_PATHS, PIN(active_adj));
BPF_TABLE_PINNED("lru_hash", struct rlbh_ct_key, struct rlbh_ct, conntrack, RLBH_CT_ENTRIES,
                 PIN(conntrack));
BPF_TABLE_PINNED("lru_hash", struct rlbh_rev_key, struct rlbh_rev, reverse, RLBH_REV_ENTRIES,
                 PIN(reverse));
BPF_TABLE_PINNED7("hash", struct rlbh_ct_key, u32, placed, RLBH_PLACEMENTS, PIN(placed),
                  BPF_F_NO_PREALLOC);
BPF_TABLE_PINNED7("hash", struct rlbh_verbs_key, struct rlbh_verbs, verbs, RLBH_VERBS_ENTRIES,
                  PIN(verbs), BPF_F_NO_PREALLOC);
BPF_TABLE_PINNED("percpu_array", u32, struct rlbh_path_stats, path_stats, RLBH_MAX_PATHS,
                 PIN(path_stats));
BPF_TABLE_PINNED("percpu_array", u32, u64, reasons, RLBH_R_MAX, PIN(reasons));
/* Ports mode: bit i set = path i's port has no carrier. Written only by the carrier watcher
 * (rlbhost/carrier.py), a small process that follows the kernel's link events, so a port that
 * loses carrier is out of use before the agent has even read the event. */
BPF_TABLE_PINNED("array", u32, u32, port_down, 1, PIN(port_down));
BPF_TABLE_PINNED("array", u32, struct rlbh_echo_cfg, echo_cfg, 1, PIN(echo_cfg));
BPF_TABLE_PINNED7("lpm_trie", struct rlbh_lpm_key, struct rlbh_key, echo_keys, RLBH_ECHO_KEYS,
                  PIN(echo_keys), BPF_F_NO_PREALLOC);
#include "lib/echo.h"

struct parsed {
    u8  saddr[16] __attribute__((aligned(8)));
    u8  daddr[16] __attribute__((aligned(8)));
    u16 sport;
    u16 dport;
    u32 qp;
    u32 len;
    u32 proto;                    /* IPv6 next header (set for every IPv6 packet) */
};

static __always_inline void count(u32 reason)
{
    bump(reasons.lookup(&reason));
}

static __always_inline int pass(u32 reason)
{
    count(reason);
    return TC_ACT_OK;
}

static __always_inline int same16(const u8 *a, const u8 *b)
{
    return *(u64 *)a == *(u64 *)b && *(u64 *)(a + 8) == *(u64 *)(b + 8);
}

/* The path field (hextet) of an address, done on two 64-bit words in registers: byte
 * stores at a variable stack index get merged by clang into pointer arithmetic (an OR on
 * the frame pointer) that the verifier refuses. Addresses are 8-byte aligned. */
static __always_inline u32 field_value(const u8 *addr, u32 field)
{
    const u64 *w = (const u64 *)addr;
    u64 word = field < 4 ? w[0] : w[1];
    u16 raw = word >> ((field & 3) * 16);   /* little-endian load: network order inside */
    return ntohs(raw);
}

static __always_inline void set_field(u8 *addr, u32 field, u32 value)
{
    u64 *w = (u64 *)addr;
    u32 shift = (field & 3) * 16;
    u64 mask = ~(0xffffULL << shift);
    u64 v = (u64)htons((u16)value) << shift;
    if (field < 4)
        w[0] = (w[0] & mask) | v;
    else
        w[1] = (w[1] & mask) | v;
}

static __always_inline int is_roce_port(struct rlbh_config *cfg, u16 port)
{
#pragma unroll
    for (int i = 0; i < RLBH_ROCE_PORTS; i++)
        if (cfg->roce_ports[i] && cfg->roce_ports[i] == port)
            return 1;
    return 0;
}

/* Parse Ethernet/IPv6/UDP(/BTH); returns a reason >= 0 to pass, or -1 when it is RoCE. The
 * addresses, protocol and (UDP/TCP) ports are filled in for every IPv6 packet: ports mode
 * places the rest of the traffic by them. */
static __always_inline int parse(struct __sk_buff *skb, struct rlbh_config *cfg, struct parsed *p)
{
    void *data = (void *)(long)skb->data;
    void *data_end = (void *)(long)skb->data_end;
    struct rlb_l3 l3;
    int r = parse_ipv6(data, data_end, &l3);
    if (r == RLB_PARSE_NOT_IPV6)
        return RLBH_R_PASS_NOT_IPV6;
    if (r != RLB_PARSE_OK)
        return RLBH_R_PASS_MALFORMED;
    __builtin_memcpy(p->saddr, l3.ip6->saddr.in6_u.u6_addr8, 16);
    __builtin_memcpy(p->daddr, l3.ip6->daddr.in6_u.u6_addr8, 16);
    p->proto = l3.proto;
    p->len = skb->len;
    if (l3.proto == IPPROTO_FRAGMENT)
        return RLBH_R_PASS_FRAGMENT;
    if (l3.proto != IPPROTO_UDP && l3.proto != IPPROTO_TCP)
        return RLBH_R_PASS_NOT_ROCE;
    struct udphdr *uh = l3.l4;    /* TCP's ports sit where UDP's do */
    if ((void *)(uh + 1) > data_end)
        return RLBH_R_PASS_MALFORMED;
    p->sport = ntohs(uh->source);
    p->dport = ntohs(uh->dest);
    if (l3.proto != IPPROTO_UDP || !is_roce_port(cfg, p->dport))
        return RLBH_R_PASS_NOT_ROCE;
    s32 qp = bth_dest_qp((u8 *)(uh + 1), data_end);
    if (qp < 0)
        return RLBH_R_PASS_MALFORMED;
    p->qp = qp;
    return -1;
}

/* Replace a 16-byte address and fix the UDP checksum (lib/csum.h). */
static __always_inline int store_addr(struct __sk_buff *skb, u32 off, u8 *old, u8 *new)
{
    return replace_addr(skb, off, UCSUM_OFF, old, new);
}

/* Index of the valid path whose address this is (RLBH_MAX_PATHS if none), and its value. */
static __always_inline u32 path_of_addr(const u8 *addr, u32 *value)
{
    u32 found = RLBH_MAX_PATHS;
#pragma unroll
    for (u32 i = 0; i < RLBH_MAX_PATHS; i++) {
        u32 k = i;
        struct rlbh_path *pp = paths.lookup(&k);
        if (pp && pp->valid && same16(addr, pp->addr)) {
            found = i;
            *value = pp->value;
        }
    }
    return found;
}

static __always_inline u32 ports_down(void)
{
    u32 zero = 0;
    u32 *m = port_down.lookup(&zero);
    return m ? *m : 0;
}

/* A path's weight in w, 0 when the path is invalid or its port is down (`down`: ports_down()). */
static __always_inline u32 eff_weight(struct rlbh_weights *w, u32 i, u32 down)
{
    struct rlbh_path *p = paths.lookup(&i);
    if (!p || !p->valid || (down >> (i & (RLBH_MAX_PATHS - 1))) & 1)
        return 0;
    return w->weight[i & (RLBH_MAX_PATHS - 1)];
}

static __always_inline u64 active_of(u32 wid, u32 path)
{
    u32 idx = wid * RLBH_MAX_PATHS + (path & (RLBH_MAX_PATHS - 1));
    s32 *a = active.lookup(&idx), *adj = active_adj.lookup(&idx);
    s64 n = (s64)(a ? *a : 0) + (adj ? *adj : 0);
    return n > 0 ? n : 0;
}

/* Weighted least-active: the path minimising (active + 1/2) / weight (Webster's divisors: with
 * unequal weights (active + 1) / weight favoured the heavier path, 2 QPs over a 10 and a 5 Gb/s
 * path both went on the 10; equal weights choose as before); ties go to the first path
 * from `start` on, so hosts that start at different places spread before they meet. Paths in
 * groups (a plane's sub-ports) are chosen flat here, by per-path weights that are the plane's
 * path bandwidth over its live sub-ports; the agent's sweep keeps each plane within one QP of
 * its share (a two-level choice here is more than the verifier will walk). */
static __always_inline u32 least_active(struct rlbh_weights *w, u32 start, u32 down)
{
    u32 best = RLBH_MAX_PATHS;
    u64 best_a = 0, best_w = 1;
#pragma clang loop unroll(disable)
    for (u32 j = 0; j < RLBH_MAX_PATHS; j++) {
        u32 i = (start + j) & (RLBH_MAX_PATHS - 1);
        u32 wt = eff_weight(w, i, down);
        if (!wt)
            continue;
        u64 act = active_of(w->id, i);
        if (best == RLBH_MAX_PATHS || (2 * act + 1) * best_w < (2 * best_a + 1) * wt) {
            best = i;
            best_a = act;
            best_w = wt;
        }
    }
    return best;
}

/* The path whose share of the summed weights `r` falls in (r taken modulo the sum). */
static __always_inline u32 weighted_pick(struct rlbh_weights *w, u64 r, u32 down)
{
    u64 total = 0;     /* 16 u32 weights cannot overflow it */
#pragma clang loop unroll(disable)
    for (u32 i = 0; i < RLBH_MAX_PATHS; i++)
        total += eff_weight(w, i, down);
    if (!total)
        return RLBH_MAX_PATHS;
    r %= total;
#pragma clang loop unroll(disable)
    for (u32 i = 0; i < RLBH_MAX_PATHS; i++) {
        u32 wt = eff_weight(w, i, down);
        if (r < wt)
            return i;
        r -= wt;
    }
    return RLBH_MAX_PATHS;
}

/* Per-packet weighted choice for destinations that tolerate reordering. */
static __always_inline u32 spray(struct rlbh_weights *w, u32 down)
{
    return weighted_pick(w, ((u64)bpf_get_prandom_u32() << 32) | bpf_get_prandom_u32(), down);
}

static __always_inline void active_add(u32 wid, u32 path, int delta)
{
    u32 idx = wid * RLBH_MAX_PATHS + (path & (RLBH_MAX_PATHS - 1));
    s32 *a = active.lookup(&idx);
    if (a)
        __sync_fetch_and_add(a, delta > 0 ? 1 : -1);   /* no floor: see the maps above */
}

static __always_inline u32 choose_path(struct parsed *p, struct rlbh_weights *w,
                                       struct rlbh_config *cfg, u32 down)
{
    if (w->flags & RLBH_W_SPRAY) {
        count(RLBH_R_EV_SPRAY);
        return spray(w, down);
    }
    u64 now = bpf_ktime_get_ns();
    struct rlbh_ct_key key = {};
    __builtin_memcpy(key.peer, p->daddr, 16);
    key.sport = p->sport;
    key.qp = p->qp;
    struct rlbh_ct *ct = conntrack.lookup(&key);
    if (ct && ct->wid == w->id && ct->path < RLBH_MAX_PATHS && eff_weight(w, ct->path, down)) {
        if (now - ct->last_ns < cfg->expiry_ns) {
            ct->last_ns = now;
            ct->bytes += p->len;
            return ct->path;
        }
        count(RLBH_R_EV_EXPIRED);
    }
    if (ct)
        active_add(ct->wid, ct->path, -1);

    u32 path = RLBH_MAX_PATHS;
    u32 *placement = placed.lookup(&key);
    struct rlbh_rev_key rkey = {};
    __builtin_memcpy(rkey.peer, p->daddr, 16);
    rkey.sport = p->sport;
    struct rlbh_rev *rev = reverse.lookup(&rkey);
    if (placement && *placement < RLBH_MAX_PATHS && eff_weight(w, *placement, down)) {
        path = *placement;  /* the coordinator's choice: new and idle QPs only, never in flight */
        count(RLBH_R_EV_PLACED);
    } else if (rev && now - rev->last_ns < cfg->expiry_ns && rev->path < RLBH_MAX_PATHS &&
               eff_weight(w, rev->path, down)) {
        path = rev->path;  /* the peer started this QP on that path: answer on it */
        count(RLBH_R_EV_FOLLOW_REVERSE);
    } else {
        path = least_active(w, cfg->rotation, down);
    }
    if (path >= RLBH_MAX_PATHS) {
        if (ct)
            conntrack.delete(&key);
        return path;
    }
    struct rlbh_ct entry = {.last_ns = now, .created_ns = now, .path = path, .wid = w->id,
                            .bytes = p->len};
    conntrack.update(&key, &entry);
    active_add(w->id, path, 1);
    count(RLBH_R_EV_ASSIGN);
    return path;
}

/* Config, parse, base path: returns a reason >= 0 to pass the packet, -1 to go on. */
static __always_inline int prologue(struct __sk_buff *skb, struct rlbh_config **cfgp,
                                    struct parsed *p, struct rlbh_path **basep)
{
    u32 zero = 0;
    struct rlbh_config *cfg = config.lookup(&zero);
    if (!cfg)
        return RLBH_R_PASS_NO_PATH;
    *cfgp = cfg;
    int r = parse(skb, cfg, p);
    if (r >= 0)
        return r;
    if (cfg->flags & RLBH_F_PORTS)
        return -1;                /* no base path: every port carries the loopback as it is */
    u32 base_idx = cfg->base;
    struct rlbh_path *base = paths.lookup(&base_idx);
    if (!base || !base->valid)
        return RLBH_R_PASS_NO_PATH;
    *basep = base;
    return -1;
}

/* A QP the verbs library placed (its packets carry the addresses its QP was given)? */
static __always_inline int verbs_qp(const u8 *peer, u32 qpn, u32 dir)
{
    struct rlbh_verbs_key k = {.qpn = qpn, .dir = dir};
    __builtin_memcpy(k.peer, peer, 16);
    return verbs.lookup(&k) != 0;
}

/* Address mode: only QPs from the base path's address to a peer's base address are placed;
 * returns a reason >= 0 to pass the packet, -1 to go on. */
static __always_inline int addresses_to_place(struct rlbh_config *cfg, struct rlbh_path *base,
                                              struct parsed *p)
{
    if (!same16(p->saddr, base->addr)) {
        /* an application (or NCCL plugin) that picked a path address itself is left alone */
        u32 unused;
        if (path_of_addr(p->saddr, &unused) < RLBH_MAX_PATHS)
            return RLBH_R_PASS_APP_CHOSE;
        return RLBH_R_PASS_NOT_BASE;
    }
    if (field_value(p->daddr, cfg->field) != base->value)
        return RLBH_R_PASS_APP_CHOSE;  /* addressed to one of the peer's path addresses */
    if (verbs_qp(p->daddr, p->qp, RLBH_V_TX))
        return RLBH_R_PASS_APP_CHOSE;  /* the verbs library put it on the base path */
    return -1;
}

/* Address mode rewrites a QP's addresses to its path's; ports mode (RLBH_F_PORTS) sends RoCE by
 * QP and any other IPv6 packet by flow hash and weight out of the chosen path's port with that
 * link's MACs, and drops (counted) what has no usable path: its device delivers nothing itself.
 * One call site for the choice: each inlined copy of it costs the verifier dearly. */
int rlb_host_egress(struct __sk_buff *skb)
{
    struct rlbh_config *cfg;
    struct rlbh_path *base;
    struct parsed p = {};
    cfg = 0;
    base = 0;
    int r = prologue(skb, &cfg, &p, &base);
    if (!cfg)
        return pass(r);
    int ports = cfg->flags & RLBH_F_PORTS;
    int no_path = ports ? TC_ACT_SHOT : TC_ACT_OK;
    if (ports) {
        if (r >= 0 && r != RLBH_R_PASS_NOT_ROCE && r != RLBH_R_PASS_FRAGMENT)
            return pass(r);
    } else {
        if (r >= 0 || !base)
            return pass(r >= 0 ? r : RLBH_R_PASS_NO_PATH);
        int why = addresses_to_place(cfg, base, &p);
        if (why >= 0)
            return pass(why);
    }

    struct rlbh_lpm_key wkey = {.prefixlen = 128};
    __builtin_memcpy(wkey.addr, p.daddr, 16);
    struct rlbh_weights *w = weights.lookup(&wkey);
    if (!w) {
        count(RLBH_R_PASS_NO_PATH);
        return no_path;
    }
    u32 down = ports ? ports_down() : 0;
    u32 path;
    if (r < 0)
        path = choose_path(&p, w, cfg, down);
    else    /* by flow hash: a flow stays on one path while the weights stand */
        path = weighted_pick(w, flow_hash(0, p.saddr, p.daddr, p.proto,
                                          ((u32)p.sport << 16) | p.dport, 0), down);
    struct rlbh_path *pp = path < RLBH_MAX_PATHS ? paths.lookup(&path) : 0;
    if (!pp || !pp->valid) {
        count(RLBH_R_PASS_NO_PATH);
        return no_path;
    }
    struct rlbh_path_stats *st = path_stats.lookup(&path);
    if (st) {
        st->tx_packets++;
        st->tx_bytes += p.len;
    }
    if (ports) {
        if (bpf_skb_store_bytes(skb, 0, pp->dmac, 12, 0))
            return pass(RLBH_R_PASS_MALFORMED);
        count(r < 0 ? RLBH_R_SENT_ON_PORT : RLBH_R_HASHED_ON_PORT);
        return bpf_redirect(pp->ifindex, 0);
    }
    if (path == cfg->base)
        return pass(RLBH_R_ON_BASE_PATH);

    u8 new_src[16] __attribute__((aligned(8)));
    u8 new_dst[16] __attribute__((aligned(8)));
    __builtin_memcpy(new_src, pp->addr, 16);
    __builtin_memcpy(new_dst, p.daddr, 16);
    set_field(new_dst, cfg->field, pp->value);
    if (store_addr(skb, SADDR_OFF, p.saddr, new_src) || store_addr(skb, DADDR_OFF, p.daddr, new_dst))
        return pass(RLBH_R_PASS_MALFORMED);
    return pass(RLBH_R_REWRITTEN);
}

int rlb_host_ingress(struct __sk_buff *skb)
{
    struct rlbh_config *cfg;
    struct rlbh_path *base;
    struct parsed p = {};
    cfg = 0;
    base = 0;
    int r = prologue(skb, &cfg, &p, &base);
    if (r >= 0)
        return pass(r);
    if (!base)
        return pass(RLBH_R_PASS_NOT_PATH_ADDR);   /* ports mode: nothing to restore */
    u32 base_idx = cfg->base;
    u32 value = 0;
    u32 path = path_of_addr(p.daddr, &value);
    if (path >= RLBH_MAX_PATHS)
        return pass(RLBH_R_PASS_NOT_PATH_ADDR);
    struct rlbh_path_stats *st = path_stats.lookup(&path);
    if (st) {
        st->rx_packets++;
        st->rx_bytes += p.len;
    }
    if (path != base_idx && verbs_qp(p.saddr, p.qp, RLBH_V_RX))
        return pass(RLBH_R_PASS_APP_CHOSE);   /* its QP was given these addresses: keep them */

    u8 new_src[16] __attribute__((aligned(8)));
    u8 new_dst[16] __attribute__((aligned(8)));
    __builtin_memcpy(new_src, p.saddr, 16);
    __builtin_memcpy(new_dst, base->addr, 16);
    int src_on_path = field_value(p.saddr, cfg->field) == value;
    if (src_on_path)
        set_field(new_src, cfg->field, base->value);
    /* remember the peer's choice so our answers on this QP take the same path */
    struct rlbh_rev_key rkey = {};
    __builtin_memcpy(rkey.peer, new_src, 16);
    rkey.sport = p.sport;
    u64 now = bpf_ktime_get_ns();
    struct rlbh_rev *known = reverse.lookup(&rkey);
    if (known && known->path == path) {
        known->last_ns = now;   /* in place: an LRU update per packet costs far more */
    } else {
        struct rlbh_rev rev = {.last_ns = now, .path = path};
        reverse.update(&rkey, &rev);
    }

    if (path == base_idx)
        return TC_ACT_OK;  /* already base addresses */
    if (store_addr(skb, DADDR_OFF, p.daddr, new_dst))
        return pass(RLBH_R_PASS_MALFORMED);
    if (src_on_path && store_addr(skb, SADDR_OFF, p.saddr, new_src))
        return pass(RLBH_R_PASS_MALFORMED);
    return pass(RLBH_R_RESTORED);
}

/* The plane of the port a packet came in by, from the paths (ports mode: one a port, a plane's
 * sub-ports consecutive); 0 for a port that is no path. */
static __always_inline u8 port_plane(u32 ifindex)
{
    u32 zero = 0;
    struct rlbh_config *cfg = config.lookup(&zero);
    u32 group = cfg && cfg->group_size ? cfg->group_size : 1;
#pragma unroll
    for (u32 i = 0; i < RLBH_MAX_PATHS; i++) {
        u32 k = i;
        struct rlbh_path *p = paths.lookup(&k);
        if (p && p->value && p->ifindex == ifindex)
            return (p->value - 1) / group + 1;
    }
    return 0;
}

/* Ports mode, each port's TC ingress: plane probes answered in the kernel (lib/echo.h), for the
 * plane of the port they came in by. */
int rlb_host_echo(struct __sk_buff *skb)
{
    u32 zero = 0;
    u8 plane = port_plane(skb->ifindex);
    struct rlbh_echo_cfg *ec = echo_cfg.lookup(&zero);
    struct rlb_l3 l3 = {};
    struct rlbh_probe *pr = probe_to_answer(skb, ec, plane, &l3);
    if (!pr)
        return TC_ACT_UNSPEC;   /* on to the hook's next filter */
    struct rlbh_lpm_key who = {.prefixlen = 128};
    __builtin_memcpy(who.addr, &l3.ip6->saddr, 16);
    struct rlbh_key fabric_wide, *key = echo_keys.lookup(&who);
    if (!key && ec && (ec->flags & RLBH_ECHO_SIGN)) {
        fabric_wide.k0 = ec->k0;
        fabric_wide.k1 = ec->k1;
        key = &fabric_wide;
    }
    return probe_answer(skb, &l3, pr, plane, key);
}
