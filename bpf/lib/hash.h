/* Flow hashing: 64-bit multiply-rotate rounds over whole words and the murmur3 finaliser.
 * Seedable, so switches with different seeds do not polarise; about a third of the
 * instructions of byte-wise murmur3 rounds. */
#ifndef RLB_LIB_HASH_H
#define RLB_LIB_HASH_H

#define RLB_HASH_K1 0x9E3779B97F4A7C15ULL
#define RLB_HASH_K2 0xC2B2AE3D27D4EB4FULL

static __always_inline u64 hash_round(u64 h, u64 w)
{
    h ^= w * RLB_HASH_K2;
    h = (h << 31) | (h >> 33);
    return h * RLB_HASH_K1;
}

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
 * fine where XDP runs; the bytes' order only has to be the same on every packet). Two lanes
 * (source side, destination side) run side by side: three dependent rounds instead of six. */
static __always_inline u32 flow_hash(u32 seed, const u8 *src, const u8 *dst, u32 proto_label,
                                     u32 ports, u32 qp)
{
    const u64 *s = (const u64 *)src, *d = (const u64 *)dst;
    u64 a = (u64)seed * RLB_HASH_K1 + RLB_HASH_K2, b = a ^ RLB_HASH_K1;
    a = hash_round(a, s[0]);
    b = hash_round(b, d[0]);
    a = hash_round(a, s[1]);
    b = hash_round(b, d[1]);
    a = hash_round(a, ((u64)proto_label << 32) | ports);
    b = hash_round(b, qp);
    return (u32)fmix64(a ^ ((b << 32) | (b >> 32)));
}

#endif
