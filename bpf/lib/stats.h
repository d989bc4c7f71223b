/* Counters. Each program keeps a per-CPU `reasons` array (why a packet went to the kernel,
 * plus events) and defines, in its own .c file, count(reason) and pass(reason):
 *     static __always_inline void count(u32 r) { bump(reasons.lookup(&r)); }
 * bcc rewrites map method calls only in the main source file, so map accesses cannot live
 * in a shared header; what can is here. */
#ifndef RLB_LIB_STATS_H
#define RLB_LIB_STATS_H

static __always_inline void bump(u64 *c)
{
    if (c)
        *c += 1;
}

/* Packets and bytes in one per-CPU slot (no atomics: the slot is this CPU's). */
static __always_inline void bump_bytes(u64 *packets, u64 *bytes, u32 len)
{
    *packets += 1;
    *bytes += len;
}

#endif
