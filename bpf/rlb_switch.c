/* RLB switch: IPv6 forwarding in XDP from pinned BPF maps, per route pinned (BGP-DPF),
 * weighted or flowlet-DLB; reads as parse -> punt -> lookup -> select -> forward. */
#include <uapi/linux/bpf.h>
#include "rlb_switch.h"

#include "lib/pin.h"
#include "lib/parse.h"
#include "lib/hash.h"

BPF_TABLE_PINNED7("lpm_trie", struct rlb_lpm_key, struct rlb_route, routes, RLB_MAX_ROUTES,
                  PIN(routes), BPF_F_NO_PREALLOC);
BPF_TABLE_PINNED("array", u32, struct rlb_exact_set, exact64, 1 << RLB_EXACT_BITS, PIN(exact64));
BPF_TABLE_PINNED("array", u32, struct rlb_nexthop, nexthops, RLB_MAX_NEXTHOPS, PIN(nexthops));
BPF_TABLE_PINNED("array", u32, struct rlb_group, groups, RLB_MAX_GROUPS, PIN(groups));
BPF_TABLE_PINNED("array", u32, struct rlb_port, ports, RLB_MAX_PORTS, PIN(ports));
BPF_TABLE_PINNED("array", u32, struct rlb_port_load, port_load, RLB_MAX_PORTS, PIN(port_load));
BPF_TABLE_PINNED("hash", struct rlb_in6, struct rlb_neighbor, neighbors, RLB_MAX_NEIGHBORS,
                 PIN(neighbors));
BPF_TABLE_PINNED("array", u32, struct rlb_flowlet_set, flowlets, RLB_FLOWLET_SETS, PIN(flowlets));
BPF_TABLE_PINNED("array", u32, struct rlb_config, config, 1, PIN(config));
BPF_TABLE_PINNED("percpu_array", u32, struct rlb_port_stats, port_stats, RLB_MAX_PORTS,
                 PIN(port_stats));
BPF_TABLE_PINNED("percpu_array", u32, struct rlb_counter, nh_stats, RLB_MAX_NEXTHOPS,
                 PIN(nh_stats));
BPF_TABLE_PINNED("percpu_array", u32, u64, reasons, RLB_R_MAX, PIN(reasons));
BPF_TABLE_PINNED("percpu_array", u32, u32, spray_seq, 1, PIN(spray_seq));
BPF_XDP_REDIRECT_MAP("devmap:" PIN(tx_ports), int, tx_ports, RLB_MAX_PORTS);
BPF_TABLE_PINNED("hash", u32, u32, port_class, RLB_MAX_PORTS, PIN(port_class));
BPF_TABLE_PINNED("array", u32, struct rlb_police_cfg, police_cfg, RLB_P_MAX, PIN(police_cfg));
BPF_TABLE_PINNED("percpu_array", u32, struct rlb_police_state, police_port, RLB_MAX_PORTS * RLB_P_MAX,
                 PIN(police_port));
BPF_TABLE_PINNED("lru_hash", struct rlb_in6, u64, neigh_pending, RLB_NEIGH_PENDING, PIN(neigh_pending));

#include "lib/stats.h"

static __always_inline void count(u32 reason)
{
    bump(reasons.lookup(&reason));
}

/* The bucket a punted packet is charged to. */
static __always_inline u32 police_bucket(u32 reason, u32 edge)
{
    switch (reason) {
    case RLB_R_PASS_CONTROL:
    case RLB_R_PASS_LINK_LOCAL:
    case RLB_R_PASS_MULTICAST:
        return edge ? RLB_P_EDGE_CONTROL : RLB_P_FABRIC_CONTROL;
    case RLB_R_PASS_HOP_LIMIT:
        return RLB_P_HOP_LIMIT;
    case RLB_R_PASS_NEIGH_MISS:
        return RLB_P_NEIGH_MISS;
    default:
        return RLB_P_OTHER;
    }
}

/* 1: within the rate of the bucket of the port at `slot` (or the bucket does not police); 0: drop. */
static __always_inline int police_ok(u32 bucket, u32 slot)
{
    struct rlb_police_cfg *c = police_cfg.lookup(&bucket);
    if (!c || !c->interval_ns)
        return 1;
    u32 idx = (slot & (RLB_MAX_PORTS - 1)) * RLB_P_MAX + bucket;
    struct rlb_police_state *st = police_port.lookup(&idx);
    if (!st)
        return 1;
    u64 now = bpf_ktime_get_ns();
    u64 tat = st->tat_ns > now ? st->tat_ns : now;
    if (tat - now > c->tolerance_ns) {
        st->dropped++;
        return 0;
    }
    st->tat_ns = tat + c->interval_ns;
    return 1;
}

/* What the stages pass along. The flow hash, and the L4 ports and QP it reads, are computed
 * only by the modes that need them (a pinned route whose primary is up never does). */
struct pkt {
    struct rlb_l3 l3;
    u32 in;            /* ingress ifindex: classify() turns it into edge and slot */
    u32 edge;          /* came in on a host port (port_class): its punts have buckets of their own */
    u32 slot;          /* the port it came in on (port_class): whose buckets its punts spend */
    struct rlb_config *cfg;
    u64 now;
    u32 len;
    u32 ports;         /* L4 source and dest ports as one word (wire order), 0 when none */
    u32 qp;            /* RoCEv2 destination QP (bth_dest_qp) in wire order, 0 when none */
    u32 hash;
    u32 spray;         /* per-packet choice: DLB without flowlets, ties by the packet's seq */
    u32 seq;
};

/* The ingress port's class and slot (port_class, a hash map): looked up only for packets that
 * go to the kernel, so forwarded ones never pay for it. */
static __always_inline void classify(struct pkt *pk)
{
    u32 *cls = port_class.lookup(&pk->in);
    if (cls) {
        pk->edge = (*cls & RLB_CLASS_MASK) == RLB_PORT_EDGE;
        u32 s = *cls >> RLB_CLASS_SLOT_SHIFT;
        pk->slot = s ? s - 1 : 0;
    }
}

/* Hand the packet to the kernel, within the rate of its bucket on port `slot`. */
static __always_inline int pass_at(u32 reason, struct pkt *pk, u32 slot)
{
    if (!police_ok(police_bucket(reason, pk->edge), slot))
        return XDP_DROP;
    count(reason);
    return XDP_PASS;
}

/* Hand the packet to the kernel, charged to the port it came in by. */
static __always_inline int pass(u32 reason, struct pkt *pk)
{
    classify(pk);
    return pass_at(reason, pk, pk->slot);
}

/* The flow's L4 ports, and its RoCEv2 destination QP: only the modes that hash read them. */
static __always_inline void flow_fields(struct pkt *pk, void *data_end)
{
    if (pk->l3.proto == IPPROTO_TCP) {
        struct tcphdr *th = pk->l3.l4;
        if ((void *)(th + 1) <= data_end)
            pk->ports = *(u32 *)th;        /* hashed only: byte order does not matter */
    } else if (pk->l3.proto == IPPROTO_UDP) {
        struct udphdr *uh = pk->l3.l4;
        if ((void *)(uh + 1) > data_end)
            return;
        pk->ports = *(u32 *)uh;
        if (uh->dest == htons(pk->cfg->roce_port)) {
            s32 qp = bth_dest_qp((u8 *)(uh + 1), data_end);
            if (qp >= 0)
                pk->qp = htonl(qp);     /* hashed as the wire's BTH word, reserved byte zero */
        }
    }
}

static __always_inline void hash_packet(struct pkt *pk, void *data_end)
{
    struct ipv6hdr *ip6 = pk->l3.ip6;
    flow_fields(pk, data_end);
    pk->hash = flow_hash(pk->cfg->hash_seed, ip6->saddr.in6_u.u6_addr8, ip6->daddr.in6_u.u6_addr8,
                         proto_label(ip6), pk->ports, pk->qp);
}

/* ---- punt: what the kernel must see (returns a reason, or -1 to forward) ---------------- */
static __always_inline int punt(struct pkt *pk, void *data_end)
{
    struct ipv6hdr *ip6 = pk->l3.ip6;
    u8 *dst = ip6->daddr.in6_u.u6_addr8;
    if (dst[0] == 0xff)
        return RLB_R_PASS_MULTICAST;
    if (is_link_local(dst) || is_link_local(ip6->saddr.in6_u.u6_addr8))
        return RLB_R_PASS_LINK_LOCAL;  /* never routed off-link */
    switch (pk->l3.proto) {
    case IPPROTO_HOPOPTS:
        return RLB_R_PASS_CONTROL;     /* router alert & co. need the kernel */
    case IPPROTO_ICMPV6: {
        struct icmp6hdr *ic = pk->l3.l4;
        if ((void *)(ic + 1) > data_end)
            return RLB_R_PASS_MALFORMED;
        if (ic->icmp6_type >= 133 && ic->icmp6_type <= 137)
            return RLB_R_PASS_CONTROL; /* RS, RA, NS, NA, redirect */
        break;
    }
    case IPPROTO_TCP: {
        struct tcphdr *th = pk->l3.l4;
        if ((void *)(th + 1) > data_end)
            return RLB_R_PASS_MALFORMED;
        if (th->source == htons(179) || th->dest == htons(179))
            return RLB_R_PASS_CONTROL; /* BGP */
        break;
    }
    case IPPROTO_UDP:
        if (pk->l3.l4 + sizeof(struct udphdr) > data_end)
            return RLB_R_PASS_MALFORMED;
        break;
    }
    if (ip6->hop_limit <= 1)
        return RLB_R_PASS_HOP_LIMIT;   /* the kernel sends Time Exceeded */
    return -1;
}

/* ---- heartbeat: a neighbouring switch asks whether this data plane runs ------------------ */
/* The ask goes back out of the port it came in by as an answer: MACs, addresses and UDP ports
 * swapped (fields of one size at even offsets: the checksum stays), the kind changed (a
 * checksum, if the ask carried one, updated for that one word, RFC 1624). Called only for link-local packets from fabric
 * ports, which are punted anyway: forwarded packets never pay for it. -1: not an ask. */
static __always_inline int heartbeat_answer(struct pkt *pk, void *data_end)
{
    if (pk->l3.proto != IPPROTO_UDP || !is_link_local(pk->l3.ip6->daddr.in6_u.u6_addr8))
        return -1;
    struct udphdr *uh = pk->l3.l4;
    struct rlb_heartbeat *hb = (void *)(uh + 1);
    if ((void *)(hb + 1) > data_end || uh->dest != htons(RLB_HEARTBEAT_PORT) ||
        hb->magic != htonl(RLB_HEARTBEAT_MAGIC) || hb->kind != RLB_HEARTBEAT_ASK ||
        pk->l3.ip6->hop_limit != 255)   /* from one hop away only (GTSM) */
        return -1;
    struct ipv6hdr *ip6 = pk->l3.ip6;
    struct ethhdr *eth = pk->l3.eth;
    u8 mac[ETH_ALEN], addr[16];
    __builtin_memcpy(mac, eth->h_dest, ETH_ALEN);
    __builtin_memcpy(eth->h_dest, eth->h_source, ETH_ALEN);
    __builtin_memcpy(eth->h_source, mac, ETH_ALEN);
    __builtin_memcpy(addr, ip6->daddr.in6_u.u6_addr8, 16);
    __builtin_memcpy(ip6->daddr.in6_u.u6_addr8, ip6->saddr.in6_u.u6_addr8, 16);
    __builtin_memcpy(ip6->saddr.in6_u.u6_addr8, addr, 16);
    u16 sport = uh->source;
    uh->source = uh->dest;
    uh->dest = sport;
    u16 *word = (u16 *)&hb->kind, old = *word;
    hb->kind = RLB_HEARTBEAT_ANSWER;
    if (uh->check) {   /* the prober sends none (RFC 6936): a checksum left partial by a NIC's
                        * offload would be wrong here; one that came complete is kept right */
        u32 sum = (u16)~uh->check + (u16)~old + *word;
        sum = (sum & 0xffff) + (sum >> 16);
        sum = (sum & 0xffff) + (sum >> 16);
        uh->check = (u16)~sum ? (u16)~sum : 0xffff;   /* a computed zero goes as 0xffff (RFC 8200) */
    }
    ip6->hop_limit = 255;                          /* one hop only: the prober checks it (GTSM) */
    count(RLB_R_EV_HEARTBEAT);
    return XDP_TX;
}

/* BGP (TCP 179 either way) to a link-local address from further than one hop, with GTSM on. */
static __always_inline int gtsm_refuses(struct pkt *pk, void *data_end)
{
    if (!(pk->cfg->flags & RLB_CFG_GTSM) || pk->l3.proto != IPPROTO_TCP || pk->l3.ip6->hop_limit == 255)
        return 0;
    struct tcphdr *th = pk->l3.l4;
    if ((void *)(th + 1) > data_end)
        return 0;
    return th->source == htons(179) || th->dest == htons(179);
}

/* ---- lookup: the exact /64 first, the trie for everything else ------------------------- */
static __always_inline struct rlb_route *lookup(struct pkt *pk)
{
    u8 *dst = pk->l3.ip6->daddr.in6_u.u6_addr8;
    u64 key;
    __builtin_memcpy(&key, dst, 8);
    u32 idx = (key * RLB_EXACT_MULT) >> (64 - RLB_EXACT_BITS);
    struct rlb_exact_set *set = exact64.lookup(&idx);
    if (set) {
#pragma unroll
        for (int w = 0; w < RLB_EXACT_WAYS; w++)
            if (set->way[w].key == key && set->way[w].route.mode)
                return &set->way[w].route;
    }
    struct rlb_lpm_key lpm = {.prefixlen = 128};
    __builtin_memcpy(lpm.addr, dst, 16);
    return routes.lookup(&lpm);
}

/* ---- ports and their load ------------------------------------------------------------- */
static __always_inline struct rlb_port *live_port(u32 slot, u32 ifindex)
{
    struct rlb_port *port = ports.lookup(&slot);
    if (!port || !port->up || port->ifindex != ifindex || !ifindex)
        return 0;   /* down, removed, or the slot now belongs to another port */
    return port;
}

/* Bytes of decayed load per quality band of a port (its own, from its speed, or the default). */
static __always_inline u32 band_unit(struct rlb_port *port, struct pkt *pk)
{
    return port->band_bytes ? port->band_bytes : pk->cfg->default_band_bytes;
}

/* A port's recent tx bytes, decayed to now, quantised into a quality band (0 = idle). Bytes
 * sent since the last look count as recent; after a gap longer than the half-life only the
 * share that fell in the last half-life does. Racing readers write the same kind of value. */
static __always_inline u32 port_band(u32 slot, struct rlb_port *port, struct pkt *pk)
{
    struct rlb_port_load *ld = port_load.lookup(&slot);
    if (!ld)
        return RLB_LOAD_BANDS - 1;
    u64 now = pk->now, half = pk->cfg->load_halflife_ns;
    u64 recent = ld->recent_bytes, last = ld->seen_ns, total = ld->tx_bytes;
    if (half && now > last) {
        u64 dt = now - last, shifts = dt / half;
        if (shifts) {
            recent = shifts >= 63 ? 0 : recent >> shifts;
            ld->seen_ns = shifts >= 63 ? now : last + shifts * half;
        }
        u64 delta = total - ld->seen_bytes;
        if (dt > half)
            delta = delta / (dt / half);
        recent += delta;
        ld->recent_bytes = recent;
        ld->seen_bytes = total;
    }
    u32 unit = band_unit(port, pk);
    u64 band = recent / (unit ? unit : 1);
    return band >= RLB_LOAD_BANDS ? RLB_LOAD_BANDS - 1 : (u32)band;
}

/* The port's load gets this CPU's bytes once they make a share of its band (rlb_port_load). */
static __always_inline void port_add_load(u32 slot, struct rlb_port *port, struct rlb_port_stats *ps,
                                          struct pkt *pk)
{
    u64 held = ps->load_held + pk->len;
    if (held < (band_unit(port, pk) >> RLB_LOAD_HOLD_SHIFT)) {
        ps->load_held = held;
        return;
    }
    ps->load_held = 0;
    struct rlb_port_load *ld = port_load.lookup(&slot);
    if (ld)
        __sync_fetch_and_add(&ld->tx_bytes, held);
}

/* A next hop is usable only with a resolved MAC on a live port. */
static __always_inline struct rlb_nexthop *usable_nh(u32 id, struct rlb_port **portp)
{
    if (!id)
        return 0;
    struct rlb_nexthop *nh = nexthops.lookup(&id);
    if (!nh || (nh->flags & (RLB_NH_VALID | RLB_NH_RESOLVED)) != (RLB_NH_VALID | RLB_NH_RESOLVED))
        return 0;
    struct rlb_port *port = live_port(nh->port, nh->ifindex);
    if (!port)
        return 0;
    *portp = port;
    return nh;
}

/* ---- select ---------------------------------------------------------------------------- */
/* The next hop owning a slot of the group's weighted table. */
static __always_inline u32 slot_member(struct rlb_group *g, u32 slot)
{
    return g->member_nh[g->slot[slot & (RLB_SLOTS - 1)] & (RLB_MAX_MEMBERS - 1)];
}

/* The live member a new flowlet takes: lowest quality band, ties by a per-member rendezvous
 * hash so flows spread evenly and a member change moves only the flows that preferred it.
 * Only the first RLB_DLB_SCAN members are scanned: the verifier walks the loop member by
 * member, and Debian 12's 6.1 kernel gives up (a million instructions) past 16 of them, where
 * newer kernels take all 64. The loader builds it as wide as the kernel accepts
 * (rlbswitch/dataplane.py) and the route model refuses wider groups for the modes that scan. */
#ifndef RLB_DLB_SCAN
#define RLB_DLB_SCAN RLB_MAX_MEMBERS
#endif
static __always_inline u32 dlb_pick(struct rlb_group *g, struct pkt *pk, u32 *memberp)
{
    u32 member = RLB_MAX_MEMBERS, chosen = 0;
    u64 best = ~0ULL;
    u32 h = pk->hash;
    struct rlb_port *port = 0;
#pragma clang loop unroll(disable)
    for (u32 i = 0; i < RLB_DLB_SCAN; i++) {
        /* A volatile read each time: hoisted, clang turns the two bounds into one
         * `i != min(n, 64)` exit, which kernels before ~6.8 cannot bound (they do not narrow
         * a range on !=) and reject as "sequence of 8193 jumps is too complex". */
        if (i >= *(volatile u32 *)&g->n_members)
            break;
        u32 id = g->member_nh[i];
        struct rlb_nexthop *nh = usable_nh(id, &port);
        if (!nh)
            continue;
        u64 score = ((u64)port_band(nh->port, port, pk) << 32) | fmix(h ^ ((i + 1) * 0x9e3779b1));
        if (score < best) {  /* member and chosen are only stored, so states prune */
            best = score;
            member = i;
            chosen = id;
        }
    }
    *memberp = member;
    return chosen;
}

/* Flowlet DLB: a flow keeps its member while its packets come within the flowlet timeout.
 * Entries sit in sets of RLB_FLOWLET_WAYS (one cache line), tagged by the full hash: a new flow
 * takes a free or expired way; when all are live it goes by the group's slot table without an
 * entry (stable while that member lives; counted). The set is scanned again after the member
 * loop rather than carrying a pointer across it: one verifier state into the loop, not one per
 * way. Returns the next hop usable now (and its port), or 0. */
static __always_inline struct rlb_nexthop *dlb_select(struct rlb_group *g, struct pkt *pk,
                                                      struct rlb_port **portp, u32 *idp)
{
    u32 h = pk->hash;
    if (pk->spray) {          /* per packet: the least loaded live member, no flowlet */
        pk->hash = fmix(pk->seq * 0x9e3779b1);
        u32 m = 0, id = dlb_pick(g, pk, &m);
        *idp = id;
        return usable_nh(id, portp);
    }
    u32 idx = (h >> 8) & (RLB_FLOWLET_SETS - 1);
    struct rlb_flowlet_set *set = flowlets.lookup(&idx);
    if (!set)
        return 0;
    u32 now = (u32)(pk->now >> RLB_FLOWLET_TICK_SHIFT) | 1;
    u32 timeout = pk->cfg->flowlet_timeout_ns >> RLB_FLOWLET_TICK_SHIFT;
    struct rlb_nexthop *nh;
    int known = 0, room = 0;
#pragma unroll
    for (int w = 0; w < RLB_FLOWLET_WAYS; w++) {
        struct rlb_flowlet *e = &set->way[w];
        if (e->last && e->hash == h) {
            known = 1;
            if (now - e->last < timeout &&
                g->member_nh[e->member & (RLB_MAX_MEMBERS - 1)] == e->nexthop &&
                (nh = usable_nh(e->nexthop, portp))) {
                e->last = now;
                *idp = e->nexthop;
                return nh;
            }
        } else if (!e->last || now - e->last >= timeout) {
            room = 1;
        }
    }
    if (!known && !room) {
        count(RLB_R_EV_DLB_COLLISION);
        u32 id = slot_member(g, h);
        if ((nh = usable_nh(id, portp))) {
            *idp = id;
            return nh;
        }
    }
    /* counted before the member loop so that nothing decided here is live across it */
    count(known ? RLB_R_EV_DLB_REASSIGN : RLB_R_EV_DLB_ASSIGN);
    u32 member = 0;
    u32 chosen = dlb_pick(g, pk, &member);
    if (!chosen)
        return 0;
    /* The flow's own way if it has one, else the first free or expired way. */
    int target = -1;
#pragma unroll
    for (int w = 0; w < RLB_FLOWLET_WAYS; w++) {
        struct rlb_flowlet *e = &set->way[w];
        if (e->last && e->hash == h)
            target = w;
    }
    if (target < 0) {
#pragma unroll
        for (int w = RLB_FLOWLET_WAYS - 1; w >= 0; w--) {
            struct rlb_flowlet *e = &set->way[w];
            if (!e->last || now - e->last >= timeout)
                target = w;
        }
    }
    if (target >= 0) {       /* else a collision whose slot member is dead: no entry either */
        struct rlb_flowlet *fl = &set->way[target & (RLB_FLOWLET_WAYS - 1)];
        fl->last = now;
        fl->hash = h;
        fl->member = member;
        fl->nexthop = chosen;
    }
    *idp = chosen;
    return usable_nh(chosen, portp);
}

static __always_inline struct rlb_nexthop *group_dlb(u32 gid, struct pkt *pk,
                                                     struct rlb_port **portp, u32 *idp)
{
    struct rlb_group *g = groups.lookup(&gid);
    if (!gid || !g)
        return 0;
    return dlb_select(g, pk, portp, idp);
}

/* The slot table's member for this flow (0 if the group is empty). */
static __always_inline u32 weighted_select(u32 gid, struct pkt *pk)
{
    struct rlb_group *g = groups.lookup(&gid);
    if (!gid || !g || !g->n_members)
        return 0;
    return slot_member(g, pk->hash);
}

/* The member of the next slot in this CPU's walk of the table (0 if the group is empty). */
static __always_inline u32 spray_select(u32 gid, struct pkt *pk)
{
    struct rlb_group *g = groups.lookup(&gid);
    u32 zero = 0;
    u32 *seq = spray_seq.lookup(&zero);
    if (!gid || !g || !g->n_members || !seq)
        return 0;
    pk->seq = *seq;
    *seq += 1;
    return slot_member(g, pk->seq * RLB_SPRAY_STRIDE);
}

/* ---- forward: MTU, devmap, then the rewrite (a failed redirect leaves the frame intact) -- */
static __always_inline int forward(struct pkt *pk, u32 slot, struct rlb_port *port,
                                   const u8 *dmac, const u8 *smac, u32 nh_id)
{
    if (port->mtu && pk->len - ETH_HLEN > port->mtu)
        return pass(RLB_R_PASS_TOO_BIG, pk);
    if (tx_ports.redirect_map(slot, XDP_PASS) != XDP_REDIRECT)
        return pass(RLB_R_PASS_NO_PORT, pk);    /* the interface went away under us */
    struct ethhdr *eth = pk->l3.eth;
    __builtin_memcpy(eth->h_dest, dmac, ETH_ALEN);
    __builtin_memcpy(eth->h_source, smac, ETH_ALEN);
    pk->l3.ip6->hop_limit--;

    struct rlb_port_stats *ps = port_stats.lookup(&slot);
    if (ps) {
        bump_bytes(&ps->tx_packets, &ps->tx_bytes, pk->len);
        port_add_load(slot, port, ps, pk);
    }
    if (nh_id) {
        struct rlb_counter *c = nh_stats.lookup(&nh_id);
        if (c)
            bump_bytes(&c->packets, &c->bytes, pk->len);
    }
    return XDP_REDIRECT;
}

/* For a neighbour not resolved yet: the kernel resolves it (an NS) and holds the packet. Charged
 * to the port it leads to; a new address to that port's new-neighbour bucket as well. */
static __always_inline int neigh_miss(struct pkt *pk, u32 port_slot, struct rlb_in6 *dst)
{
    classify(pk);
    u64 now = bpf_ktime_get_ns();
    u64 *since = neigh_pending.lookup(dst);
    if (!since || now - *since > RLB_NEIGH_PENDING_NS) {
        if (!police_ok(RLB_P_NEIGH_NEW, port_slot))
            return XDP_DROP;
        neigh_pending.update(dst, &now);
    }
    return pass_at(RLB_R_PASS_NEIGH_MISS, pk, port_slot);
}

static __always_inline int forward_connected(struct pkt *pk, struct rlb_route *rt)
{
    struct rlb_in6 dkey;
    __builtin_memcpy(dkey.addr, pk->l3.ip6->daddr.in6_u.u6_addr8, 16);
    struct rlb_neighbor *n = neighbors.lookup(&dkey);
    if (!n || n->ifindex != rt->ifindex)
        return neigh_miss(pk, rt->port, &dkey);
    u32 slot = rt->port;
    struct rlb_port *port = ports.lookup(&slot);
    if (!port || port->ifindex != rt->ifindex || !rt->ifindex)
        return pass(RLB_R_PASS_NO_PORT, pk);
    if (!port->up)
        return pass(RLB_R_PASS_NO_NEXTHOP, pk);
    u8 dmac[6], smac[6];
    __builtin_memcpy(dmac, n->dmac, 6);
    __builtin_memcpy(smac, port->mac, 6);
    return forward(pk, slot, port, dmac, smac, 0);
}

int rlb_switch(struct xdp_md *ctx)
{
    void *data = (void *)(long)ctx->data;
    void *data_end = (void *)(long)ctx->data_end;
    struct pkt pk = {};
    pk.len = data_end - data;
    pk.in = ctx->ingress_ifindex;

    /* parse */
    int r = parse_ipv6(data, data_end, &pk.l3);
    if (r == RLB_PARSE_NOT_IPV6)
        return pass(RLB_R_PASS_NOT_IPV6, &pk);  /* IPv4, ARP, VLANs: the kernel's business */
    if (r != RLB_PARSE_OK)
        return pass(RLB_R_PASS_MALFORMED, &pk);
    u32 zero = 0;
    pk.cfg = config.lookup(&zero);
    if (!pk.cfg)
        return pass(RLB_R_PASS_NO_ROUTE, &pk);

    /* punt */
    r = punt(&pk, data_end);
    if (r >= 0) {
        classify(&pk);
        if (r == RLB_R_PASS_LINK_LOCAL) {
            if (!pk.edge) {
                int a = heartbeat_answer(&pk, data_end);
                if (a >= 0)
                    return a;
            }
            if (gtsm_refuses(&pk, data_end)) {
                count(RLB_R_DROP_GTSM);
                return XDP_DROP;
            }
        }
        return pass_at(r, &pk, pk.slot);
    }

    /* lookup */
    struct rlb_route *rt = lookup(&pk);
    if (!rt)
        return pass(RLB_R_PASS_NO_ROUTE, &pk);

    /* select */
    u32 nh = 0, dlb_group = 0;
    struct rlb_port *port = 0;
    struct rlb_nexthop *nhp = 0;
    switch (rt->mode) {
    case RLB_MODE_LOCAL:
        return pass(RLB_R_PASS_LOCAL, &pk);
    case RLB_MODE_CONNECTED:
        return forward_connected(&pk, rt);
    case RLB_MODE_PINNED:
        nh = rt->nexthop;
        nhp = usable_nh(nh, &port);
        if (!nhp) {
            count(RLB_R_EV_FAILOVER);  /* no wait for BGP: DLB over the backups */
            dlb_group = rt->group;
        }
        break;
    case RLB_MODE_WEIGHTED:
        hash_packet(&pk, data_end);
        nh = weighted_select(rt->group, &pk);
        nhp = usable_nh(nh, &port);
        if (!nhp) {
            count(RLB_R_EV_WEIGHTED_FALLBACK);
            dlb_group = rt->group;
        }
        break;
    case RLB_MODE_DLB:
        dlb_group = rt->group;
        break;
    case RLB_MODE_SPRAY:
        nh = spray_select(rt->group, &pk);
        nhp = usable_nh(nh, &port);
        if (!nhp) {
            count(RLB_R_EV_SPRAY_FALLBACK);
            dlb_group = rt->group;
            pk.spray = 1;
        }
        break;
    default:
        return pass(RLB_R_PASS_NO_ROUTE, &pk);
    }
    if (dlb_group) {
        hash_packet(&pk, data_end);   /* again after weighted: one path for the verifier */
        pk.now = bpf_ktime_get_ns();   /* flowlets and load: only DLB reads the clock */
        nhp = group_dlb(dlb_group, &pk, &port, &nh);
    }
    if (!nhp || !port)
        return pass(RLB_R_PASS_NO_NEXTHOP, &pk);

    /* forward */
    return forward(&pk, nhp->port, port, nhp->dmac, nhp->smac, nh);
}
