/* RLB switch: IPv6 forwarding in XDP from BPF maps, with per-route pinned (BGP-DPF),
 * weighted and flowlet-DLB next-hop selection. Compiled by bcc with -DRLB_PIN_DIR="..."
 * so every map is pinned and a restarted agent (or a new program) reuses the same state. */
#include <uapi/linux/bpf.h>
#include <uapi/linux/if_ether.h>
#include <uapi/linux/ipv6.h>
#include <uapi/linux/in.h>
#include <uapi/linux/udp.h>
#include <uapi/linux/tcp.h>
#include <uapi/linux/icmpv6.h>
#include "rlb_switch.h"

#define PIN(name) RLB_PIN_DIR "/" #name

BPF_TABLE_PINNED7("lpm_trie", struct rlb_lpm_key, struct rlb_route, routes, RLB_MAX_ROUTES,
                  PIN(routes), BPF_F_NO_PREALLOC);
BPF_TABLE_PINNED("array", u32, struct rlb_nexthop, nexthops, RLB_MAX_NEXTHOPS, PIN(nexthops));
BPF_TABLE_PINNED("array", u32, struct rlb_group, groups, RLB_MAX_GROUPS, PIN(groups));
BPF_TABLE_PINNED("hash", u32, struct rlb_port, ports, RLB_MAX_PORTS, PIN(ports));
BPF_TABLE_PINNED("array", u32, struct rlb_port_load, port_load, RLB_MAX_PORTS, PIN(port_load));
BPF_TABLE_PINNED("hash", struct rlb_in6, struct rlb_neighbor, neighbors, RLB_MAX_NEIGHBORS,
                 PIN(neighbors));
BPF_TABLE_PINNED("array", u32, struct rlb_flowlet, flowlets, RLB_FLOWLETS, PIN(flowlets));
BPF_TABLE_PINNED("array", u32, struct rlb_config, config, 1, PIN(config));
BPF_TABLE_PINNED("percpu_array", u32, struct rlb_port_stats, port_stats, RLB_MAX_PORTS,
                 PIN(port_stats));
BPF_TABLE_PINNED("percpu_array", u32, struct rlb_counter, nh_stats, RLB_MAX_NEXTHOPS,
                 PIN(nh_stats));
BPF_TABLE_PINNED("percpu_array", u32, u64, reasons, RLB_R_MAX, PIN(reasons));
BPF_XDP_REDIRECT_MAP("devmap:" PIN(tx_ports), int, tx_ports, RLB_MAX_PORTS);

struct pkt {
    u32 hash;
    u32 len;
    u64 now;
    struct rlb_config *cfg;
};

static __always_inline void count(u32 reason)
{
    u64 *c = reasons.lookup(&reason);
    if (c)
        *c += 1;
}

static __always_inline int pass(u32 reason)
{
    count(reason);
    return XDP_PASS;
}

/* murmur3 rounds: cheap, well mixed, and seedable so switches do not polarise. */
static __always_inline u32 mix(u32 h, u32 k)
{
    k *= 0xcc9e2d51;
    k = (k << 15) | (k >> 17);
    k *= 0x1b873593;
    h ^= k;
    h = (h << 13) | (h >> 19);
    return h * 5 + 0xe6546b64;
}

static __always_inline u32 fmix(u32 h)
{
    h ^= h >> 16;
    h *= 0x85ebca6b;
    h ^= h >> 13;
    h *= 0xc2b2ae35;
    h ^= h >> 16;
    return h;
}

static __always_inline u32 load32(const u8 *p)
{
    return ((u32)p[0] << 24) | ((u32)p[1] << 16) | ((u32)p[2] << 8) | p[3];
}

/* Decayed recent tx bytes of a port, quantised into a quality band (0 = idle). */
static __always_inline u32 port_band(struct rlb_port *port, struct pkt *pk)
{
    u32 slot = port->tx_slot;
    struct rlb_port_load *ld = port_load.lookup(&slot);
    if (!ld)
        return RLB_LOAD_BANDS - 1;
    u64 recent = ld->recent_bytes;
    u64 half = pk->cfg->load_halflife_ns;
    if (half && pk->now > ld->last_ns) {
        u64 shifts = (pk->now - ld->last_ns) / half;
        recent = shifts >= 63 ? 0 : recent >> shifts;
    }
    u32 unit = port->band_bytes ? port->band_bytes : pk->cfg->default_band_bytes;
    if (!unit)
        unit = 1;
    u64 band = recent / unit;
    return band >= RLB_LOAD_BANDS ? RLB_LOAD_BANDS - 1 : (u32)band;
}

static __always_inline void port_add_load(struct rlb_port *port, struct pkt *pk)
{
    u32 slot = port->tx_slot;
    struct rlb_port_load *ld = port_load.lookup(&slot);
    if (!ld)
        return;
    u64 half = pk->cfg->load_halflife_ns;
    if (half && pk->now > ld->last_ns) {
        u64 shifts = (pk->now - ld->last_ns) / half;
        if (shifts) {
            ld->recent_bytes = shifts >= 63 ? 0 : ld->recent_bytes >> shifts;
            ld->last_ns = pk->now;
        }
    }
    ld->recent_bytes += pk->len;
}

/* A next hop is usable only with a resolved MAC on a registered port that is up. */
static __always_inline struct rlb_nexthop *usable_nh(u32 id, struct rlb_port **portp)
{
    if (!id)
        return 0;
    struct rlb_nexthop *nh = nexthops.lookup(&id);
    if (!nh || (nh->flags & (RLB_NH_VALID | RLB_NH_RESOLVED)) != (RLB_NH_VALID | RLB_NH_RESOLVED))
        return 0;
    u32 ifindex = nh->ifindex;
    struct rlb_port *port = ports.lookup(&ifindex);
    if (!port || !port->up)
        return 0;
    *portp = port;
    return nh;
}

/* Flowlet DLB over a group: keep the flow's member while its packets arrive within the
 * flowlet timeout; otherwise pick the live member in the lowest quality band, ties by hash. */
static __always_inline u32 dlb_select(u32 gid, struct rlb_group *g, struct pkt *pk)
{
    u32 idx = pk->hash & (RLB_FLOWLETS - 1);
    struct rlb_flowlet *fl = flowlets.lookup(&idx);
    if (!fl)
        return 0;
    struct rlb_port *port = 0;
    int same_flow = fl->hash == pk->hash && fl->group == gid && fl->last_ns;
    if (same_flow && fl->generation == g->generation &&
        pk->now - fl->last_ns < pk->cfg->flowlet_timeout_ns && fl->member < RLB_MAX_MEMBERS &&
        g->member_nh[fl->member & (RLB_MAX_MEMBERS - 1)] == fl->nexthop &&
        usable_nh(fl->nexthop, &port)) {
        fl->last_ns = pk->now;
        return fl->nexthop;
    }

    /* One pass: score = quality band, then a per-member rendezvous hash so ties spread
     * flows evenly and a member change only moves the flows that preferred that member. */
    u32 member = RLB_MAX_MEMBERS, chosen = 0;
    u64 best = ~0ULL;
#pragma clang loop unroll(disable)
    for (u32 i = 0; i < RLB_MAX_MEMBERS; i++) {
        /* A volatile read each time: hoisted, clang turns the two bounds into one
         * `i != min(n, 64)` exit, which kernels before ~6.8 cannot bound (they do not narrow
         * a range on !=) and reject as "sequence of 8193 jumps is too complex". */
        if (i >= *(volatile u32 *)&g->n_members)
            break;
        if (!usable_nh(g->member_nh[i], &port))
            continue;
        u64 score = ((u64)port_band(port, pk) << 32) | fmix(pk->hash ^ mix(0x5bd1e995, i));
        if (score < best) {  /* member and chosen are only stored, so states prune */
            best = score;
            member = i;
            chosen = g->member_nh[i];
        }
    }
    if (!chosen)
        return 0;
    if (same_flow && fl->nexthop != chosen)
        count(RLB_R_EV_DLB_REASSIGN);
    else if (!same_flow)
        count(RLB_R_EV_DLB_ASSIGN);
    fl->last_ns = pk->now;
    fl->hash = pk->hash;
    fl->group = gid;
    fl->generation = g->generation;
    fl->member = member;
    fl->nexthop = chosen;
    return chosen;
}

static __always_inline u32 group_dlb(u32 gid, struct pkt *pk)
{
    struct rlb_group *g = groups.lookup(&gid);
    if (!gid || !g)
        return 0;
    return dlb_select(gid, g, pk);
}

/* The slot table's member for this flow (0 if the group is empty). */
static __always_inline u32 weighted_select(u32 gid, struct pkt *pk)
{
    struct rlb_group *g = groups.lookup(&gid);
    if (!gid || !g || !g->n_members)
        return 0;
    u32 member = g->slot[pk->hash & (RLB_SLOTS - 1)];
    return g->member_nh[member & (RLB_MAX_MEMBERS - 1)];
}

/* Rewrite and redirect through an egress port already known to be registered and up. */
static __always_inline int forward(struct ethhdr *eth, struct ipv6hdr *ip6, struct rlb_port *port,
                                   const u8 *dmac, const u8 *smac, u32 nh_id, struct pkt *pk)
{
    __builtin_memcpy(eth->h_dest, dmac, ETH_ALEN);
    __builtin_memcpy(eth->h_source, smac, ETH_ALEN);
    ip6->hop_limit--;

    u32 slot = port->tx_slot;
    struct rlb_port_stats *ps = port_stats.lookup(&slot);
    if (ps) {
        ps->tx_packets++;
        ps->tx_bytes += pk->len;
    }
    if (nh_id) {
        struct rlb_counter *c = nh_stats.lookup(&nh_id);
        if (c) {
            c->packets++;
            c->bytes += pk->len;
        }
    }
    port_add_load(port, pk);
    count(RLB_R_FORWARDED);
    return tx_ports.redirect_map(slot, 0);
}

int rlb_switch(struct xdp_md *ctx)
{
    void *data = (void *)(long)ctx->data;
    void *data_end = (void *)(long)ctx->data_end;
    struct pkt pk = {};
    pk.len = data_end - data;

    u32 in_ifindex = ctx->ingress_ifindex;
    struct rlb_port *in_port = ports.lookup(&in_ifindex);
    if (in_port) {
        u32 slot = in_port->tx_slot;
        struct rlb_port_stats *ps = port_stats.lookup(&slot);
        if (ps) {
            ps->rx_packets++;
            ps->rx_bytes += pk.len;
        }
    }

    struct ethhdr *eth = data;
    if ((void *)(eth + 1) > data_end)
        return pass(RLB_R_PASS_MALFORMED);
    if (eth->h_proto != htons(ETH_P_IPV6))
        return pass(RLB_R_PASS_NOT_IPV6);  /* IPv4, ARP, VLANs: the kernel's business */
    struct ipv6hdr *ip6 = (void *)(eth + 1);
    if ((void *)(ip6 + 1) > data_end || ip6->version != 6)
        return pass(RLB_R_PASS_MALFORMED);

    u8 *dst = ip6->daddr.in6_u.u6_addr8;
    u8 *src = ip6->saddr.in6_u.u6_addr8;
    if (dst[0] == 0xff)
        return pass(RLB_R_PASS_MULTICAST);
    if ((dst[0] == 0xfe && (dst[1] & 0xc0) == 0x80) || (src[0] == 0xfe && (src[1] & 0xc0) == 0x80))
        return pass(RLB_R_PASS_LINK_LOCAL);  /* never routed off-link */

    u32 key0 = 0;
    pk.cfg = config.lookup(&key0);
    if (!pk.cfg)
        return pass(RLB_R_PASS_NO_ROUTE);

    /* Flow hash: addresses, next header, flow label, L4 ports and, for RoCEv2, the BTH dest QP. */
    u32 h = pk.cfg->hash_seed;
#pragma unroll
    for (int i = 0; i < 16; i += 4)
        h = mix(h, load32(src + i));
#pragma unroll
    for (int i = 0; i < 16; i += 4)
        h = mix(h, load32(dst + i));
    u32 flowlabel = ((u32)(ip6->flow_lbl[0] & 0x0f) << 16) | ((u32)ip6->flow_lbl[1] << 8) |
                    ip6->flow_lbl[2];
    h = mix(h, ((u32)ip6->nexthdr << 24) | flowlabel);

    void *l4 = (void *)(ip6 + 1);
    u8 proto = ip6->nexthdr;
    if (proto == IPPROTO_HOPOPTS)
        return pass(RLB_R_PASS_CONTROL);  /* router alert & co. need the kernel */
    if (proto == IPPROTO_ICMPV6) {
        struct icmp6hdr *ic = l4;
        if ((void *)(ic + 1) > data_end)
            return pass(RLB_R_PASS_MALFORMED);
        if (ic->icmp6_type >= 133 && ic->icmp6_type <= 137)
            return pass(RLB_R_PASS_CONTROL);  /* RS, RA, NS, NA, redirect */
    } else if (proto == IPPROTO_TCP) {
        struct tcphdr *th = l4;
        if ((void *)(th + 1) > data_end)
            return pass(RLB_R_PASS_MALFORMED);
        if (th->source == htons(179) || th->dest == htons(179))
            return pass(RLB_R_PASS_CONTROL);  /* BGP */
        h = mix(h, ((u32)ntohs(th->source) << 16) | ntohs(th->dest));
    } else if (proto == IPPROTO_UDP) {
        struct udphdr *uh = l4;
        if ((void *)(uh + 1) > data_end)
            return pass(RLB_R_PASS_MALFORMED);
        h = mix(h, ((u32)ntohs(uh->source) << 16) | ntohs(uh->dest));
        if (uh->dest == htons(pk.cfg->roce_port)) {
            u8 *bth = (void *)(uh + 1);
            if ((void *)(bth + 12) <= data_end)
                h = mix(h, ((u32)bth[5] << 16) | ((u32)bth[6] << 8) | bth[7]);
        }
    }
    pk.hash = fmix(h);

    if (ip6->hop_limit <= 1)
        return pass(RLB_R_PASS_HOP_LIMIT);

    struct rlb_lpm_key key = {.prefixlen = 128};
    __builtin_memcpy(key.addr, dst, 16);
    struct rlb_route *rt = routes.lookup(&key);
    if (!rt)
        return pass(RLB_R_PASS_NO_ROUTE);
    pk.now = bpf_ktime_get_ns();

    u32 nh = 0, dlb_group = 0;
    struct rlb_port *port = 0;
    struct rlb_nexthop *nhp = 0;
    switch (rt->mode) {
    case RLB_MODE_LOCAL:
        return pass(RLB_R_PASS_LOCAL);
    case RLB_MODE_CONNECTED: {
        struct rlb_in6 dkey;
        __builtin_memcpy(dkey.addr, dst, 16);
        struct rlb_neighbor *n = neighbors.lookup(&dkey);
        if (!n || n->ifindex != rt->ifindex)
            return pass(RLB_R_PASS_NEIGH_MISS);
        u32 ifindex = rt->ifindex;
        port = ports.lookup(&ifindex);
        if (!port)
            return pass(RLB_R_PASS_NO_PORT);
        if (!port->up)
            return pass(RLB_R_PASS_NO_NEXTHOP);
        u8 dmac[6], smac[6];
        __builtin_memcpy(dmac, n->dmac, 6);
        __builtin_memcpy(smac, port->mac, 6);
        return forward(eth, ip6, port, dmac, smac, 0, &pk);
    }
    case RLB_MODE_PINNED:
        nh = rt->nexthop;
        nhp = usable_nh(nh, &port);
        if (!nhp) {
            count(RLB_R_EV_FAILOVER);  /* no wait for BGP: DLB over the backups */
            dlb_group = rt->group;
        }
        break;
    case RLB_MODE_WEIGHTED:
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
    default:
        return pass(RLB_R_PASS_NO_ROUTE);
    }
    if (dlb_group) {
        nh = group_dlb(dlb_group, &pk);
        nhp = usable_nh(nh, &port);
    }
    if (!nhp || !port)
        return pass(RLB_R_PASS_NO_NEXTHOP);
    return forward(eth, ip6, port, nhp->dmac, nhp->smac, nh, &pk);
}
