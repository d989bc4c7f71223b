/* The probe echo of a GPU's ports (ports mode): rlb_host.c's rlb_host_echo program is this, with
 * its config and key tables. Expects the host's offsets (SADDR_OFF, UDP_OFF, UCSUM_OFF), rlb_host.h,
 * parse.h and siphash.h included before it. The caller looks the key up (bcc rewrites map calls in
 * the program's own file only): probe_to_answer, then the key for l3's source, then probe_answer. */
#ifndef RLB_ECHO_H
#define RLB_ECHO_H

/* Ports mode, on each port's TC ingress: a plane probe (rlbhost/probes.py) goes straight back out
 * of the port it came in by, addressed to its sender, as an answer. In the kernel, so that an
 * answer says the plane and this GPU's port work and never waits for this host's agent to be
 * scheduled (a busy agent answered late on one plane and not yet on another, which looked like a
 * silent plane). Everything else goes on untouched to the hook's next filter (TC_ACT_UNSPEC):
 * the port's ingress may carry the operator's own. The answer (and its tag) names `plane`, the
 * plane of the port the probe came in by, not the one the probe claims: a probe that crossed
 * another plane (a miscabled or misrouted link) never keeps the plane it claims alive; a port
 * that is no path (plane 0) answers nothing. */
static __always_inline struct rlbh_probe *probe_to_answer(struct __sk_buff *skb, struct rlbh_echo_cfg *ec,
                                                          u8 plane, struct rlb_l3 *l3)
{
    void *data = (void *)(long)skb->data, *end = (void *)(long)skb->data_end;
    if (parse_ipv6(data, end, l3) != RLB_PARSE_OK || l3->proto != IPPROTO_UDP)
        return 0;
    struct udphdr *udp = l3->l4;
    struct rlbh_probe *pr = (void *)(udp + 1);
    if ((void *)(pr + 1) > end || udp->dest != htons(RLBH_PROBE_PORT) ||
        pr->magic != htonl(RLBH_PROBE_MAGIC) || pr->kind != RLBH_PROBE_ASK || !plane)
        return 0;
    if (ec && (ec->flags & RLBH_ECHO_OWN_ADDR)) {
        u64 d[2], own[2];
        __builtin_memcpy(d, &l3->ip6->daddr, 16);
        __builtin_memcpy(own, ec->addr, 16);
        if (d[0] != own[0] || d[1] != own[1])
            return 0; /* another GPU's probe, misdelivered: no answer from here */
    }
    return pr;
}

/* The answer to probe `pr` (probe_to_answer's), signed with `key` (NULL: unsigned): the key
 * shared with the prober, else the fabric-wide one. */
static __always_inline int probe_answer(struct __sk_buff *skb, struct rlb_l3 *l3, struct rlbh_probe *pr,
                                        u8 plane, const struct rlbh_key *key)
{
    struct udphdr *udp = l3->l4;
    u64 tag = 0;
    if (key) {
        u64 m[SIP_WORDS];
        u8 *w = (u8 *)m;
        __builtin_memcpy(w, &pr->seq, 4);
        __builtin_memcpy(w + 4, pr->t_ns, 8);
        w[12] = plane;
        __builtin_memcpy(w + 13, &pr->sender, 2);
        w[15] = 0;
        __builtin_memcpy(w + 16, &l3->ip6->daddr, 16);
        __builtin_memcpy(w + 32, &l3->ip6->saddr, 16);
        tag = siphash24_words(key->k0, key->k1, m);
    }
    u8 macs[12], addrs[32];
    __builtin_memcpy(macs, l3->eth->h_source, 6);
    __builtin_memcpy(macs + 6, l3->eth->h_dest, 6);
    __builtin_memcpy(addrs, &l3->ip6->daddr, 16);
    __builtin_memcpy(addrs + 16, &l3->ip6->saddr, 16);
    u16 old_word = *(u16 *)&pr->kind, csum = udp->check;
    u8 answer[2] = {RLBH_PROBE_ANSWER, plane};
    u16 new_word = *(u16 *)answer;
    /* Swapped fields of one size at even offsets leave every checksum as it was; only the kind
     * changes one (skb->csum through the store, the UDP checksum unless the probe sent zero). */
    if (bpf_skb_store_bytes(skb, 0, macs, 12, 0) || bpf_skb_store_bytes(skb, SADDR_OFF, addrs, 32, 0) ||
        bpf_skb_store_bytes(skb, UDP_OFF + 8 + offsetof(struct rlbh_probe, kind), answer, 2,
                            BPF_F_RECOMPUTE_CSUM))
        return TC_ACT_SHOT;
    if (tag) {
        /* the tag changes 8 bytes: the answer goes out with a zero UDP checksum, which the
         * prober's socket accepts (UDP_NO_CHECK6_RX, RFC 6936) */
        u16 none = 0;
        if (bpf_skb_store_bytes(skb, UDP_OFF + 8 + offsetof(struct rlbh_probe, mac), &tag, 8,
                                BPF_F_RECOMPUTE_CSUM) ||
            bpf_skb_store_bytes(skb, UCSUM_OFF, &none, 2, BPF_F_RECOMPUTE_CSUM))
            return TC_ACT_SHOT;
        return bpf_redirect(skb->ifindex, 0);
    }
    if (csum && bpf_l4_csum_replace(skb, UCSUM_OFF, old_word, new_word, 2 | BPF_F_MARK_MANGLED_0))
        return TC_ACT_SHOT;
    return bpf_redirect(skb->ifindex, 0);
}

#endif
