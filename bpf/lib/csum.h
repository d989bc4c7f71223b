/* Rewriting IPv6 addresses under a UDP checksum, correct for every ip_summed state. */
#ifndef RLB_LIB_CSUM_H
#define RLB_LIB_CSUM_H

/* BPF_F_IPV6 (kernel 6.16+): the pseudo header is IPv6, so a CHECKSUM_COMPLETE skb->csum is
 * left alone (the address change and the checksum change cancel in it). Named here because
 * older uapi headers lack it; older kernels refuse it with -EINVAL and get the call without. */
#define RLB_F_CSUM_IPV6 (1ULL << 7)

/* Replace a 16-byte address at `off` and fix the UDP checksum at `csum_off` (pseudo header).
 * BPF_F_RECOMPUTE_CSUM keeps a CHECKSUM_COMPLETE skb->csum in line with the new bytes.
 * A zero UDP checksum stays zero (BPF_F_MARK_MANGLED_0); a computed zero becomes 0xffff. */
static __always_inline int replace_addr(struct __sk_buff *skb, u32 off, u32 csum_off, u8 *old, u8 *new)
{
    s64 diff = bpf_csum_diff((__be32 *)old, 16, (__be32 *)new, 16, 0);
    if (bpf_skb_store_bytes(skb, off, new, 16, BPF_F_RECOMPUTE_CSUM))
        return -1;
    u64 flags = BPF_F_PSEUDO_HDR | BPF_F_MARK_MANGLED_0;
    int r = bpf_l4_csum_replace(skb, csum_off, 0, diff, flags | RLB_F_CSUM_IPV6);
    if (r == -22)   /* EINVAL: a kernel without the flag */
        r = bpf_l4_csum_replace(skb, csum_off, 0, diff, flags);
    return r;
}

#endif
