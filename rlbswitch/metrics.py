"""Switch metrics, read from the BPF maps at scrape time."""
from __future__ import annotations

from rlbcommon.metrics import counter, gauge, loop_health, table_fill

from .dataplane import SwitchDataplane


class SwitchCollector:
    def __init__(self, dp: SwitchDataplane, node: str, sync=None, health=None, heartbeat=None):
        self.dp, self.node, self.sync, self.health, self.heartbeat = dp, node, sync, health, heartbeat

    def collect(self):
        s = self.dp.stats()
        fams = {}
        for d in ("rx", "tx"):
            for unit in ("packets", "bytes"):
                fams[f"{d}_{unit}"] = counter(f"rlb_switch_port_{d}_{unit}",
                                              f"{unit} {d} by the XDP program per port",
                                              ["node", "interface"])
        up = gauge("rlb_switch_port_up", "port liveness as the data plane sees it", ["node", "interface"])
        cap = gauge("rlb_switch_port_capacity_bytes_per_second",
                    "port capacity (driver speed or --speed-mbps): divides tx rates into utilisation",
                    ["node", "interface"])
        for p in s["ports"]:
            for k, fam in fams.items():
                fam.add_metric([self.node, p["interface"]], p[k])
            up.add_metric([self.node, p["interface"]], int(p["up"]))
            if p["speed_mbps"]:
                cap.add_metric([self.node, p["interface"]], p["speed_mbps"] * 1e6 / 8)
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
        # from the agent's routing model, in memory: a scrape used to dump the whole route map
        # under the lock route programming needs (seconds at full scale, every scrape)
        by_mode: dict[str, int] = {}
        for rt in list(self.dp.tables.routes.values()):
            by_mode[rt.mode] = by_mode.get(rt.mode, 0) + 1
        for m, n in by_mode.items():
            routes.add_metric([self.node, m], n)
        policed = counter("rlb_switch_punts_dropped", "packets for the kernel dropped by the slow path's "
                          "policer, per bucket (fabric_control must stay 0)", ["node", "bucket"])
        rate = gauge("rlb_switch_punt_rate_limit", "the policer's packets/s per CPU, per bucket (0: off)",
                     ["node", "bucket"])
        for name, b in s.get("police", {}).items():
            policed.add_metric([self.node, name], b["dropped"])
            rate.add_metric([self.node, name], b["rate"])
        by_port = counter("rlb_switch_port_punts_dropped", "packets for the kernel dropped by the policer, "
                          "per port and bucket (a port's flood spends its own buckets)", ["node", "interface", "bucket"])
        for port, drops in s.get("police_by_port", {}).items():
            for name, n in drops.items():
                if n:
                    by_port.add_metric([self.node, port, name], n)
        yield from (*fams.values(), up, cap, nh_p, nh_b, reasons, routes, policed, rate, by_port)
        yield from table_fill("rlb_switch", [([self.node], t, n, size)
                                             for t, (n, size) in self.dp.tables_fill().items()], ["node"])
        if self.health is not None:
            yield from loop_health(self.health, "rlb_switch", self.node)
        if self.heartbeat is not None:
            yield from self._heartbeat()
        if self.sync is not None:
            st = self.sync.stats
            sess = gauge("rlb_switch_bgp_session_up", "BGP sessions (1 = Established)", ["node", "session"])
            for name, up in sessions_up(st["sessions"]).items():
                sess.add_metric([self.node, name], int(up))
            lat = gauge("rlb_switch_last_sync_seconds", "time to compile and program the last bird change", ["node"])
            lat.add_metric([self.node], st["last_sync_seconds"])
            syncs = counter("rlb_switch_bird_syncs", "bird route changes programmed", ["node"])
            syncs.add_metric([self.node], st["syncs"])
            errs = counter("rlb_switch_bird_errors", "failed reads of bird's control socket", ["node"])
            errs.add_metric([self.node], st["errors"])
            hold = gauge("rlb_switch_bird_holding", "1 while a restarted bird converges and the "
                         "programmed routes are kept (stale)", ["node"])
            hold.add_metric([self.node], st["holding"])
            restarts = counter("rlb_switch_bird_restarts", "restarts of bird the agent noticed", ["node"])
            restarts.add_metric([self.node], st["bird_restarts"])
            bad = counter("rlb_switch_bird_bad_paths", "paths ignored for attributes that cannot be "
                          "used (NaN or negative path bandwidth, AIGP without metric)", ["node"])
            bad.add_metric([self.node], st["bad_paths"])
            refused = counter("rlb_switch_bgp_routes_refused", "routes a BGP peer sent that its session's "
                              "import filter refused: prefixes that peer may not announce", ["node", "session"])
            for name, n in sorted(st.get("refused", {}).items()):
                refused.add_metric([self.node, name], n)
            yield from (sess, lat, syncs, errs, hold, restarts, bad, refused)


    def _heartbeat(self):
        silent = gauge("rlb_switch_neighbour_silent", "1 while the switch on this port keeps carrier but its "
                       "data plane answers no heartbeat: the port is out of forwarding", ["node", "interface"])
        silences = counter("rlb_switch_neighbour_silences", "times the switch on this port stopped answering "
                           "heartbeats with carrier up", ["node", "interface"])
        rtt = gauge("rlb_switch_neighbour_heartbeat_rtt_seconds", "round trip of the last heartbeat answered",
                    ["node", "interface"])
        for ifname, st in sorted(self.heartbeat.status().items()):
            if not st["judged"]:
                continue                       # another make, or not found yet: nothing to say
            silent.add_metric([self.node, ifname], int(st["silent"]))
            silences.add_metric([self.node, ifname], st["silences"])
            rtt.add_metric([self.node, ifname], st["rtt_us"] / 1e6)
        yield from (silent, silences, rtt)


def sessions_up(protocols: dict[str, str]) -> dict[str, bool]:
    """{session: Established?} from bird's BGP protocols {name: info}. A passive spine port is a
    template named after the port that never establishes itself; bird spawns <name>_<n> for the
    neighbour that connects: the port's session is up when any of them is."""
    out: dict[str, bool] = {}
    for name, info in protocols.items():
        base, _, n = name.rpartition("_")
        key = base if n.isdigit() and base in protocols else name
        out[key] = out.get(key, False) or info.startswith("Established")
    return out
