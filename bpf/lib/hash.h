/* Flow hashing: whole 64-bit words, each multiplied by its own constant, and the murmur3
 * finaliser. Seedable, so switches with different seeds do not polarise. */
#ifndef RLB_LIB_HASH_H
#define RLB_LIB_HASH_H

#define RLB_HASH_K1 0x9E3779B97F4A7C15ULL
#define RLB_HASH_K2 0xC2B2AE3D27D4EB4FULL

static __always_inline u64 fmix64(u64 h)
{
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdULL;
    h ^= h >> 33;
    h *= 0xc4ceb9fe1a85ec53ULL;
    h ^= h >> 33;
    return h;
}

/* 32-bit finaliser: per-member rendezvous scores (DLB). */
static __always_inline u32 fmix(u32 h)
{
    h ^= h >> 16;
    h *= 0x85ebca6b;
    h ^= h >> 13;
    h *= 0xc2b2ae35;
    h ^= h >> 16;
    return h;
}

/* Hash of a flow: both addresses, next header + flow label, L4 ports, RoCEv2 dest QP (0 when
 * absent). Addresses are read as 64-bit words straight from the packet (unaligned loads are
 * fine where XDP runs; the bytes' order only has to be the same on every packet). Each word is
 * multiplied by its own odd constant and the sum finalised (multilinear hashing): the six
 * products are independent, so the chain is one multiply and the finaliser deep. */
static __always_inline u32 flow_hash(u32 seed, const u8 *src, const u8 *dst, u32 proto_label,
                                     u32 ports, u32 qp)
{
    const u64 *s = (const u64 *)src, *d = (const u64 *)dst;
    u64 h = (u64)seed * RLB_HASH_K1 + RLB_HASH_K2;
    h += s[0] * 0xA0761D6478BD642FULL + s[1] * 0xE7037ED1A0B428DBULL;
    h += d[0] * 0x8EBC6AF09C88C6E3ULL + d[1] * 0x589965CC75374CC3ULL;
    h += ((((u64)proto_label << 32) | ports) * 0x1D8E4E27C47D124FULL) + (u64)qp * RLB_HASH_K2;
    return (u32)fmix64(h);
}

#endif
