/* Packet parsing shared by the switch (XDP) and host (TC) programs: Ethernet, IPv6, the L4
 * ports and the RoCEv2 BTH destination QP. Bounds are checked here once; callers get pointers
 * and host-order values. */
#ifndef RLB_LIB_PARSE_H
#define RLB_LIB_PARSE_H

#include <uapi/linux/if_ether.h>
#include <uapi/linux/ipv6.h>
#include <uapi/linux/in.h>
#include <uapi/linux/udp.h>
#include <uapi/linux/tcp.h>
#include <uapi/linux/icmpv6.h>

#define RLB_BTH_LEN   12

enum rlb_parse_result {
    RLB_PARSE_OK = 0,
    RLB_PARSE_NOT_IPV6,
    RLB_PARSE_MALFORMED,
};

struct rlb_l3 {
    struct ethhdr *eth;
    struct ipv6hdr *ip6;
    void *l4;
    u8 proto;          /* IPv6 next header */
};

static __always_inline int parse_ipv6(void *data, void *data_end, struct rlb_l3 *l3)
{
    struct ethhdr *eth = data;
    if ((void *)(eth + 1) > data_end)
        return RLB_PARSE_MALFORMED;
    if (eth->h_proto != htons(ETH_P_IPV6))
        return RLB_PARSE_NOT_IPV6;
    struct ipv6hdr *ip6 = (void *)(eth + 1);
    if ((void *)(ip6 + 1) > data_end || ip6->version != 6)
        return RLB_PARSE_MALFORMED;
    l3->eth = eth;
    l3->ip6 = ip6;
    l3->l4 = ip6 + 1;
    l3->proto = ip6->nexthdr;
    return RLB_PARSE_OK;
}

/* Next header in the top byte, flow label below: the IPv6 part of a flow's identity. */
static __always_inline u32 proto_label(const struct ipv6hdr *ip6)
{
    return ((u32)ip6->nexthdr << 24) | ((u32)(ip6->flow_lbl[0] & 0x0f) << 16) |
           ((u32)ip6->flow_lbl[1] << 8) | ip6->flow_lbl[2];
}

/* The BTH destination QP (24 bits) of a RoCEv2 datagram whose BTH is at `bth`, or -1. */
static __always_inline s32 bth_dest_qp(u8 *bth, void *data_end)
{
    if ((void *)(bth + RLB_BTH_LEN) > data_end)
        return -1;
    return ((u32)bth[5] << 16) | ((u32)bth[6] << 8) | bth[7];
}

static __always_inline int is_link_local(const u8 *a)
{
    return a[0] == 0xfe && (a[1] & 0xc0) == 0x80;
}

#endif
