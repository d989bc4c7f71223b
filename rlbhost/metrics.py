"""Host metrics, read from the BPF maps at scrape time."""
from __future__ import annotations

from rlbcommon.metrics import counter, gauge

from .dataplane import HostDataplane


class HostCollector:
    def __init__(self, dp: HostDataplane, node: str):
        self.dp, self.node = dp, node

    def collect(self):
        s = self.dp.status()
        labels = ["node", "path", "address"]
        fams = {f"{d}_{u}": counter(f"rlb_host_path_{d}_{u}", f"{u} {d} per fabric path", labels)
                for d in ("tx", "rx") for u in ("packets", "bytes")}
        qps = gauge("rlb_host_path_active_qps", "QPs currently on each path", labels)
        weight = gauge("rlb_host_path_weight", "default weight of each path", labels)
        for p in s["paths"]:
            lv = [self.node, str(p["path"]), p["address"]]
            for k, fam in fams.items():
                fam.add_metric(lv, p[k])
            qps.add_metric(lv, p["active_qps"])
            weight.add_metric(lv, p["weight"])
        events = counter("rlb_host_packets", "packets by reason; assignments, releases, rewrites",
                         ["node", "reason"])
        for name, v in s["reasons"].items():
            events.add_metric([self.node, name], v)
        yield from (*fams.values(), qps, weight, events)
