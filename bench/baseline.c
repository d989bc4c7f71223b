/* Reference programs for bench/xdp_bench.py: the floor (do nothing) and the least a
 * forwarder must do (parse Ethernet+IPv6, rewrite MACs, decrement hop limit, redirect); for a
 * GPU's TC egress in ports mode, the least it must do (parse, rewrite MACs, redirect to a port). */
#include <uapi/linux/bpf.h>
#include <uapi/linux/if_ether.h>
#include <uapi/linux/ipv6.h>

BPF_DEVMAP(bench_tx, 4);

int xdp_empty(struct xdp_md *ctx)
{
    return XDP_PASS;
}

int xdp_parse_redirect(struct xdp_md *ctx)
{
    void *data = (void *)(long)ctx->data;
    void *data_end = (void *)(long)ctx->data_end;
    struct ethhdr *eth = data;
    struct ipv6hdr *ip6 = (void *)(eth + 1);
    if ((void *)(ip6 + 1) > data_end || eth->h_proto != htons(ETH_P_IPV6))
        return XDP_PASS;
    if (ip6->hop_limit <= 1)
        return XDP_PASS;
    ip6->hop_limit--;
    __builtin_memset(eth->h_dest, 0x02, ETH_ALEN);
    __builtin_memset(eth->h_source, 0x04, ETH_ALEN);
    return bench_tx.redirect_map(0, 0);
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
