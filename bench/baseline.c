/* Reference programs for bench/xdp_bench.py: the floor (do nothing), the least a forwarder
 * must do (parse Ethernet+IPv6, rewrite MACs, decrement hop limit, redirect) and a router's work
 * (that, after a route lookup and a next hop read); for a GPU's TC egress in ports mode, the
 * least it must do (parse, rewrite MACs, redirect to a port). */
#include <uapi/linux/bpf.h>
#include <uapi/linux/if_ether.h>
#include <uapi/linux/ipv6.h>

BPF_DEVMAP(bench_tx, 4);

int xdp_empty(struct xdp_md *ctx)
{
    return XDP_PASS;
}

/* The Ethernet header of an IPv6 frame a forwarder may forward (hop limit left; its IPv6 header
 * follows), or 0. */
static __always_inline struct ethhdr *forwardable(struct xdp_md *ctx)
{
    void *data_end = (void *)(long)ctx->data_end;
    struct ethhdr *eth = (void *)(long)ctx->data;
    struct ipv6hdr *ip6 = (void *)(eth + 1);
    if ((void *)(ip6 + 1) > data_end || eth->h_proto != htons(ETH_P_IPV6) || ip6->hop_limit <= 1)
        return 0;
    return eth;
}

int xdp_parse_redirect(struct xdp_md *ctx)
{
    struct ethhdr *eth = forwardable(ctx);
    if (!eth)
        return XDP_PASS;
    struct ipv6hdr *ip6 = (void *)(eth + 1);
    ip6->hop_limit--;
    __builtin_memset(eth->h_dest, 0x02, ETH_ALEN);
    __builtin_memset(eth->h_source, 0x04, ETH_ALEN);
    return bench_tx.redirect_map(0, 0);
}

/* A router's work, the shape of the kernel's samples/bpf xdp_router_ipv4 in IPv6: the route
 * from an LPM trie (the /128 looked up, longest prefix wins), its next hop's port and MACs from
 * an array, a per-CPU packet and byte count, hop limit, MACs, devmap redirect. rlbswitch does
 * this much and more for every packet; against this reference a ratio carries the cost of map
 * lookups on both sides, which moves with the CPU kind, where parse+redirect has none. */
struct bench_lpm_key {
    u32 prefixlen;
    u8 addr[16];
};
struct bench_nexthop {
    u32 port;
    u8 dmac[ETH_ALEN];
    u8 smac[ETH_ALEN];
};
struct bench_count {
    u64 packets;
    u64 bytes;
};
BPF_F_TABLE("lpm_trie", struct bench_lpm_key, u32, bench_routes, 1024, BPF_F_NO_PREALLOC);
BPF_ARRAY(bench_nexthops, struct bench_nexthop, 16);
BPF_PERCPU_ARRAY(bench_counts, struct bench_count, 16);

int xdp_router(struct xdp_md *ctx)
{
    struct ethhdr *eth = forwardable(ctx);
    if (!eth)
        return XDP_PASS;
    struct ipv6hdr *ip6 = (void *)(eth + 1);
    struct bench_lpm_key key = {.prefixlen = 128};
    __builtin_memcpy(key.addr, ip6->daddr.in6_u.u6_addr8, 16);
    u32 *id = bench_routes.lookup(&key);
    if (!id)
        return XDP_PASS;
    u32 nid = *id;
    struct bench_nexthop *nh = bench_nexthops.lookup(&nid);
    if (!nh)
        return XDP_PASS;
    struct bench_count *c = bench_counts.lookup(&nid);
    if (c) {
        c->packets++;
        c->bytes += ctx->data_end - ctx->data;
    }
    ip6->hop_limit--;
    __builtin_memcpy(eth->h_dest, nh->dmac, ETH_ALEN);
    __builtin_memcpy(eth->h_source, nh->smac, ETH_ALEN);
    return bench_tx.redirect_map(nh->port, 0);
}

int tc_empty(struct __sk_buff *skb)
{
    return 0;   /* TC_ACT_OK */
}

BPF_ARRAY(bench_tc_tx, int, 1);

int tc_parse_redirect(struct __sk_buff *skb)
{
    void *data = (void *)(long)skb->data;
    void *data_end = (void *)(long)skb->data_end;
    struct ethhdr *eth = data;
    struct ipv6hdr *ip6 = (void *)(eth + 1);
    if ((void *)(ip6 + 1) > data_end || eth->h_proto != htons(ETH_P_IPV6))
        return 0;
    __builtin_memset(eth->h_dest, 0x02, ETH_ALEN);
    __builtin_memset(eth->h_source, 0x04, ETH_ALEN);
    int k = 0;
    int *ifindex = bench_tc_tx.lookup(&k);
    if (!ifindex)
        return 0;
    return bpf_redirect(*ifindex, 0);
}
