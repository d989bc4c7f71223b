/* SipHash-2-4 over a fixed number of 64-bit little-endian words (the message is a multiple of 8
 * bytes): the keyed MAC the plane-probe echo signs its answers with. rlbcommon/siphash.py is the
 * same function in Python (checked against the reference vectors there and against this one in
 * the test-run tests). */
#ifndef RLB_LIB_SIPHASH_H
#define RLB_LIB_SIPHASH_H

#define SIP_ROTL(x, b) (u64)(((x) << (b)) | ((x) >> (64 - (b))))
#define SIP_ROUND(v0, v1, v2, v3) do {                                   \
        v0 += v1; v1 = SIP_ROTL(v1, 13); v1 ^= v0; v0 = SIP_ROTL(v0, 32); \
        v2 += v3; v3 = SIP_ROTL(v3, 16); v3 ^= v2;                        \
        v0 += v3; v3 = SIP_ROTL(v3, 21); v3 ^= v0;                        \
        v2 += v1; v1 = SIP_ROTL(v1, 17); v1 ^= v2; v2 = SIP_ROTL(v2, 32); \
    } while (0)

#define SIP_WORDS 6

static __always_inline u64 siphash24_words(u64 k0, u64 k1, const u64 *m)
{
    u64 v0 = k0 ^ 0x736f6d6570736575ULL, v1 = k1 ^ 0x646f72616e646f6dULL;
    u64 v2 = k0 ^ 0x6c7967656e657261ULL, v3 = k1 ^ 0x7465646279746573ULL;
#pragma unroll
    for (int i = 0; i < SIP_WORDS; i++) {
        v3 ^= m[i];
        SIP_ROUND(v0, v1, v2, v3);
        SIP_ROUND(v0, v1, v2, v3);
        v0 ^= m[i];
    }
    u64 b = (u64)(SIP_WORDS * 8) << 56;
    v3 ^= b;
    SIP_ROUND(v0, v1, v2, v3);
    SIP_ROUND(v0, v1, v2, v3);
    v0 ^= b;
    v2 ^= 0xff;
    SIP_ROUND(v0, v1, v2, v3);
    SIP_ROUND(v0, v1, v2, v3);
    SIP_ROUND(v0, v1, v2, v3);
    SIP_ROUND(v0, v1, v2, v3);
    return v0 ^ v1 ^ v2 ^ v3;
}

#endif
