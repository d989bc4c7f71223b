"""Switch metrics, read from the BPF maps at scrape time."""
from __future__ import annotations

from rlbcommon.metrics import counter, gauge

from .dataplane import SwitchDataplane


class SwitchCollector:
    def __init__(self, dp: SwitchDataplane, node: str):
        self.dp, self.node = dp, node

    def collect(self):
        s = self.dp.stats()
        fams = {}
        for d in ("rx", "tx"):
            for unit in ("packets", "bytes"):
                fams[f"{d}_{unit}"] = counter(f"rlb_switch_port_{d}_{unit}",
                                              f"{unit} {d} by the XDP program per port",
                                              ["node", "interface"])
        up = gauge("rlb_switch_port_up", "port liveness as the data plane sees it", ["node", "interface"])
        for p in s["ports"]:
            for k, fam in fams.items():
                fam.add_metric([self.node, p["interface"]], p[k])
            up.add_metric([self.node, p["interface"]], int(p["up"]))
        nh_p = counter("rlb_switch_nexthop_packets", "packets per next hop", ["node", "nexthop", "interface"])
        nh_b = counter("rlb_switch_nexthop_bytes", "bytes per next hop", ["node", "nexthop", "interface"])
        for nh in s["nexthops"]:
            labels = [self.node, nh["via"], nh["via"].split("%")[-1].split("@")[0]]
            nh_p.add_metric(labels, nh["packets"])
            nh_b.add_metric(labels, nh["bytes"])
        reasons = counter("rlb_switch_packets", "packets by verdict reason and LB events", ["node", "reason"])
        for name, v in s["reasons"].items():
            reasons.add_metric([self.node, name], v)
        routes = gauge("rlb_switch_routes", "programmed routes by mode", ["node", "mode"])
        by_mode: dict[str, int] = {}
        for r in self.dp.routes():
            by_mode[r["mode"]] = by_mode.get(r["mode"], 0) + 1
        for m, n in by_mode.items():
            routes.add_metric([self.node, m], n)
        yield from (*fams.values(), up, nh_p, nh_b, reasons, routes)
