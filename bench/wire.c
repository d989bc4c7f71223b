/* Traffic generator, sink and the bare reference forwarder for bench/wire_bench.py.
 *
 * xdp_gen runs under BPF_PROG_RUN with BPF_F_TEST_XDP_LIVE_FRAMES: every run turns its page into
 * the next frame of a flow (headers restored from the template each time, because pages come
 * back holding what the forwarder wrote) and XDP_TX sends it out of the generator's veth.
 * xdp_sink counts and drops at the far end. xdp_bare is the least a forwarder can do. */
#include <uapi/linux/bpf.h>
#include <uapi/linux/if_ether.h>
#include <uapi/linux/ipv6.h>
#include <uapi/linux/udp.h>

#define GEN_HDR  80      /* Ethernet + IPv6 + UDP + BTH = 74, copied as ten 8-byte words */
#define SPORT_OFF (ETH_HLEN + 40)
#define QP_OFF   (ETH_HLEN + 40 + 8 + 5)

struct gen_cfg {
    u32 n_flows;         /* source port and BTH QP cycle through this many flows */
    u32 pad;
    u8  tmpl[GEN_HDR];
};

BPF_ARRAY(gen_cfg, struct gen_cfg, 1);
BPF_PERCPU_ARRAY(gen_seq, u32, 1);
BPF_PERCPU_ARRAY(sink_count, u64, 1);
BPF_DEVMAP(bare_tx, 1);

int xdp_gen(struct xdp_md *ctx)
{
    void *data = (void *)(long)ctx->data;
    void *data_end = (void *)(long)ctx->data_end;
    u32 zero = 0;
    struct gen_cfg *cfg = gen_cfg.lookup(&zero);
    u32 *seq = gen_seq.lookup(&zero);
    if (!cfg || !seq || data + GEN_HDR > data_end)
        return XDP_DROP;
    __builtin_memcpy(data, cfg->tmpl, GEN_HDR);
    u32 i = *seq;
    *seq = i + 1 >= cfg->n_flows ? 0 : i + 1;
    u8 *p = data;
    u16 sport = 49152 + (i & 0x3fff);
    p[SPORT_OFF] = sport >> 8;
    p[SPORT_OFF + 1] = sport & 0xff;
    u32 qp = i + 1;
    p[QP_OFF] = (qp >> 16) & 0xff;
    p[QP_OFF + 1] = (qp >> 8) & 0xff;
    p[QP_OFF + 2] = qp & 0xff;
    return XDP_TX;
}

int xdp_sink(struct xdp_md *ctx)
{
    u32 zero = 0;
    u64 *c = sink_count.lookup(&zero);
    if (c)
        *c += 1;
    return XDP_DROP;
}

int xdp_bare(struct xdp_md *ctx)
{
    return bare_tx.redirect_map(0, 0);
}

int tc_empty(struct __sk_buff *skb)
{
    return 0;   /* TC_ACT_OK */
}
