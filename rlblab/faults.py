"""Faults a lab injects: a silent drop, where carrier stays up and BGP and BFD (link-local) keep
running but packets to one address die, the failure in the middle of a plane that only a
data-plane health check sees (a small TC ingress program: this kernel has no flower or u32); and
a hung switch, carrier up and nothing else."""
from __future__ import annotations

import contextlib
import ipaddress
import os
import signal

from rlbcommon import netns

PROG = r"""
#include <uapi/linux/bpf.h>
#include <uapi/linux/pkt_cls.h>
#include <uapi/linux/if_ether.h>
#include <uapi/linux/ipv6.h>
int drop_to(struct __sk_buff *skb)
{
    void *data = (void *)(long)skb->data, *end = (void *)(long)skb->data_end;
    struct ethhdr *eth = data;
    struct ipv6hdr *ip6 = (void *)(eth + 1);
    if ((void *)(ip6 + 1) > end || eth->h_proto != htons(ETH_P_IPV6))
        return TC_ACT_UNSPEC;   /* on to the hook's next filter */
    u64 *d = (u64 *)&ip6->daddr;
    return d[0] == DST0 && d[1] == DST1 ? TC_ACT_SHOT : TC_ACT_UNSPEC;
}
"""
# prio 1: ahead of the GPU's own filters (the probe echo), so the packets die before the host
# sees them, as they would in the plane
TC_INGRESS, PRIO, HANDLE = 0xFFFFFFF2, 0x1, 0xFA17


class SilentDrop:
    """Drop every IPv6 packet to `dst` arriving on the given ports of a namespace."""

    def __init__(self, ns: str, ports: list[str], dst: str):
        from bcc import BPF
        raw = ipaddress.IPv6Address(dst).packed
        w0, w1 = int.from_bytes(raw[:8], "little"), int.from_bytes(raw[8:], "little")
        self.bpf = BPF(text=PROG, cflags=[f"-DDST0={w0}ULL", f"-DDST1={w1}ULL"])
        self.fn = self.bpf.load_func(b"drop_to", BPF.SCHED_CLS)
        self.ns, self.ports = ns, ports

    def _each(self, action: str):
        from pyroute2 import IPRoute
        with netns.inside(self.ns), IPRoute() as ipr:
            for port in self.ports:
                idx = ipr.link_lookup(ifname=port)[0]
                with contextlib.suppress(Exception):
                    ipr.tc("add", "clsact", idx)
                if action == "on":
                    ipr.tc("replace-filter", "bpf", idx, handle=HANDLE, prio=PRIO, fd=self.fn.fd,
                           name=self.fn.name, parent=TC_INGRESS, classid=1, direct_action=True)
                else:
                    with contextlib.suppress(Exception):
                        ipr.tc("del-filter", "bpf", idx, handle=HANDLE, prio=PRIO, parent=TC_INGRESS)

    def on(self):
        self._each("on")

    def off(self):
        self._each("off")
        self.bpf.cleanup()


XDP_DROP_ALL = b"int drop_all(struct xdp_md *ctx) { return XDP_DROP; }"
XDP_FLAGS_DRV_MODE = 1 << 2


class HungSwitch:
    """A switch that keeps carrier but does nothing: its bird and agent stopped (SIGSTOP, as a
    machine whose CPUs are stuck) and its XDP program replaced by one that drops every frame, so
    it forwards nothing, answers no BFD, BGP, ND or heartbeat. off() lets bird go on and starts
    the agent afresh (it attaches its program again and adopts the pinned state)."""

    def __init__(self, lab):
        from bcc import BPF
        self.lab, self.node = lab, None
        self.bpf = BPF(text=XDP_DROP_ALL)
        self.fn = self.bpf.load_func(b"drop_all", BPF.XDP)

    def on(self, node: str):
        from pyroute2 import IPRoute
        self.node = node
        os.killpg(self.lab.agents[node].pid, signal.SIGSTOP)
        os.kill(self.lab.birds[node].proc.pid, signal.SIGSTOP)
        with netns.inside(self.lab.ns(node)), IPRoute() as ipr:
            for port in self.lab.ports(node):
                idx = ipr.link_lookup(ifname=port)[0]
                ipr.link("set", index=idx, xdp_fd=self.fn.fd, xdp_flags=XDP_FLAGS_DRV_MODE)

    def off(self):
        if self.node is not None:
            os.kill(self.lab.birds[self.node].proc.pid, signal.SIGCONT)
            os.killpg(self.lab.agents[self.node].pid, signal.SIGCONT)
            self.lab.kill_agent(self.node)
            self.lab.start_agent(self.node)
        self.bpf.cleanup()
