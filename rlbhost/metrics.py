"""Host metrics, read from the BPF maps at scrape time. Every per-path and per-QP family has a
`nic` label: a GPU server's fabric NIC ('' on a host with one NIC), whose paths are its own."""
from __future__ import annotations

from rlbcommon.metrics import counter, gauge, histogram, loop_health, table_fill

from .dataplane import HostDataplane
from .verbs.answertimes import KINDS, buckets


class HostCollector:
    def __init__(self, dps: list[HostDataplane] | HostDataplane, node: str, coordinators=(), health=None,
                 prober=None, rails=None, verbs=None):
        self.dps = dps if isinstance(dps, list) else [dps]
        self.node, self.coordinators, self.health = node, list(coordinators or []), health
        self.verbs = verbs            # the verbs library's service (rlbhost/verbs/service.py)
        self.prober = prober          # scale-up GPUs: per-plane health probes
        self.rails = rails            # rail-only GPUs: the h-score agent (rlbhost/kinds/railonly.py)

    def collect(self):
        labels = ["node", "nic", "path", "address"]
        fams = {f"{d}_{u}": counter(f"rlb_host_path_{d}_{u}", f"{u} {d} per fabric path", labels)
                for d in ("tx", "rx") for u in ("packets", "bytes")}
        qps = gauge("rlb_host_path_active_qps", "QPs currently on each path", labels)
        weight = gauge("rlb_host_path_weight", "default weight of each path (hosts in address mode; a GPU "
                       "in ports mode weights per destination)", labels)
        usable = gauge("rlb_host_path_usable", "1 while the path can carry traffic (ports mode: "
                       "its port has carrier and the plane switch's MAC is known)", labels)
        events = counter("rlb_host_packets", "packets by reason; assignments, releases, rewrites",
                         ["node", "nic", "reason"])
        placed = gauge("rlb_host_placements", "QPs with a coordinator placement", ["node", "nic"])
        fill = []
        for dp in self.dps:
            s = dp.status()
            per_destination = s["config"]["mode"] == "ports"   # GPUs weight per peer; ::/0 is unused
            for p in s["paths"]:
                lv = [self.node, dp.label, str(p["path"]), p["address"]]
                for k, fam in fams.items():
                    fam.add_metric(lv, p[k])
                qps.add_metric(lv, p["active_qps"])
                if not per_destination:
                    weight.add_metric(lv, p["weight"])
                usable.add_metric(lv, int(p["valid"] and p["carrier"]))
            for name, v in s["reasons"].items():
                events.add_metric([self.node, dp.label, name], v)
            placed.add_metric([self.node, dp.label], len(dp.placements()))
            fill += [([self.node, dp.label], t, n, size) for t, (n, size) in s["tables"].items()]
        yield from (*fams.values(), qps, weight, usable, events)
        yield from table_fill("rlb_host", fill, ["node", "nic"])
        if self.health is not None:
            yield from loop_health(self.health, "rlb_host", self.node)
        yield placed
        if self.prober is not None:
            yield from self._probes()
        if self.rails is not None:
            yield from self._rails()
        if self.verbs is not None:
            yield from self._verbs()
        if self.coordinators:
            up = gauge("rlb_host_coordinator_reachable", "1 while reports reach the coordinator", ["node", "nic"])
            reports = counter("rlb_host_coordinator_reports", "reports to the coordinator by result",
                              ["node", "nic", "result"])
            fallbacks = counter("rlb_host_coordinator_fallbacks", "times placements were dropped "
                                "because the coordinator stayed unreachable", ["node", "nic"])
            for c in self.coordinators:
                nic = c.dp.label
                up.add_metric([self.node, nic], int(c.reachable))
                reports.add_metric([self.node, nic, "ok"], c.counters["reports"])
                reports.add_metric([self.node, nic, "failed"], c.counters["failures"])
                fallbacks.add_metric([self.node, nic], c.counters["fallbacks"])
            yield from (up, reports, fallbacks)

    def _probes(self):
        labels = ["node", "peer", "plane"]
        up = gauge("rlb_host_plane_probe_up", "1 while probes to the peer over the plane are answered", labels)
        rtt = gauge("rlb_host_plane_probe_rtt_seconds", "last probe round trip to the peer over the plane", labels)
        loss = gauge("rlb_host_plane_probe_loss_ratio", "share of the last probes unanswered", labels)
        sent = counter("rlb_host_plane_probes_sent", "probes sent to the peer over the plane", labels)
        for s in self.prober.snapshot():
            lv = [self.node, str(s["peer"]), str(s["plane"])]
            up.add_metric(lv, int(s["up"]))
            rtt.add_metric(lv, s["rtt_s"])
            loss.add_metric(lv, s["loss"])
            sent.add_metric(lv, s["sent"])
        rejected = counter("rlb_host_probe_answers_rejected", "probe answers not counted: a tag none of the "
                           "fabric's keys makes (spoofed), a round not probed or answered already (stale, "
                           "replayed), an unknown sender, or dropped by the socket unread (overflow: a burst while the "
                           "prober lacked the CPU)", ["node", "why"])
        for why, n in self.prober.rejected.items():
            rejected.add_metric([self.node, why], n)
        yield from (up, rtt, loss, sent, rejected)

    def _rails(self):
        w = self.rails.why()
        ratio = gauge("rlb_host_h_ratio", "this GPU's h-ratio gamma = H(its rail) / H(its domain)", ["node"])
        if w["gamma"] is not None:
            ratio.add_metric([self.node], w["gamma"])
        kinds = gauge("rlb_host_path_type_peers", "destination GPUs by the path type chosen "
                      "(d, r, rd, dr, drd)", ["node", "kind"])
        for k in ("d", "r", "rd", "dr", "drd"):
            kinds.add_metric([self.node, k], sum(1 for e in w["peers"].values() if e["kind"] == k))
        via = gauge("rlb_host_remote_rail_peers", "destination GPUs reached over each remote rail (drd)",
                    ["node", "rail"])
        counts: dict[int, int] = {}
        for e in w["peers"].values():
            if e["kind"] == "drd":
                for r in e["rails"]:
                    counts[r] = counts.get(r, 0) + 1
        for r, n in sorted(counts.items()):
            via.add_metric([self.node, str(r)], n)
        yield from (ratio, kinds, via)

    def _verbs(self):
        v = self.verbs.snapshot()
        c, n = v["counters"], self.node
        asked = counter("rlb_host_verbs_questions", "QPs (rtr) and UD address handles (ah) the verbs "
                        "library asked a path for", ["node", "kind"])
        placed = counter("rlb_host_verbs_placed", "of those, put on a path (this host's end)", ["node", "kind"])
        for kind in ("rtr", "ah"):
            asked.add_metric([n, kind], c[f"questions_{kind}"])
            placed.add_metric([n, kind], c[f"placed_{kind}"])
        kept = counter("rlb_host_verbs_kept", "QPs that kept the application's addresses, by cause",
                       ["node", "reason"])
        for reason, count in v["kept"].items():
            kept.add_metric([n, reason], count)
        dis = counter("rlb_host_verbs_disagreements", "QP pairs whose two ends may have ended on different "
                      "addresses (an answer lost after the decision)", ["node"])
        dis.add_metric([n], c["disagreements"])
        withdrawn = counter("rlb_host_verbs_withdrawn", "unconfirmed paths taken back because this end's library "
                            "may have given up before the path was in its table (the pair keeps)", ["node"])
        withdrawn.add_metric([n], c.get("withdrawn", 0))
        bad = counter("rlb_host_verbs_refused", "messages and processes the verbs service refused",
                      ["node", "what"])
        bad.add_metric([n, "bad_message"], c["bad_messages"])
        bad.add_metric([n, "client"], c["refused_clients"])
        bad.add_metric([n, "stale_question"], c["stale_questions"])
        bad.add_metric([n, "foreign_qp"], c["foreign_qps"])
        bad.add_metric([n, "unknown_qp"], c["unknown_qps"])            # a QP the kernel does not have
        bad.add_metric([n, "behind"], c["behind"])
        bad.add_metric([n, "unauthenticated"], c["unauthenticated"])
        bad.add_metric([n, "question"], c["refused_questions"])      # a user over its caps
        bad.add_metric([n, "accept_failed"], c["accept_failed"])     # out of file descriptors
        peers = counter("rlb_host_verbs_peer_messages", "the agreement's messages to peer agents sent again "
                        "(resent: lost, or the peer slow) and never acknowledged (unacknowledged)", ["node", "what"])
        peers.add_metric([n, "resent"], c["resent"])
        peers.add_metric([n, "unacknowledged"], c["unacknowledged"])
        keyfile = gauge("rlb_host_fabric_key_file_bad", "1 while the fabric's key file is gone, empty or "
                        "unreadable after keys were read from it (the keys read before stay in use)", ["node"])
        keyfile.add_metric([n], c.get("key_file_bad", 0))
        sent = counter("rlb_host_verbs_peer_sent", "the agreement's messages to peer agents, and the datagrams "
                       "that carried them (a round's messages for one peer go together)", ["node", "what"])
        sent.add_metric([n, "message"], c["messages_sent"])
        sent.add_metric([n, "datagram"], c["datagrams_sent"])
        released = counter("rlb_host_verbs_released_qps", "QPs let go because the kernel no longer has "
                           "them (destroyed without a word reaching the agent)", ["node"])
        released.add_metric([n], c.get("released_qps", 0))
        clients = gauge("rlb_host_verbs_clients", "processes connected to the verbs socket", ["node"])
        clients.add_metric([n], v["clients"])
        qps = gauge("rlb_host_verbs_qps", "QPs of processes with the verbs library, known to the agent, per "
                    "fabric NIC their RDMA port is on ('none': a port on no NIC the agent serves)", ["node", "nic"])
        nic_placed = counter("rlb_host_verbs_placed_per_nic", "QP ends and address handles put on a path, per "
                             "fabric NIC", ["node", "nic", "kind"])
        on_nics = 0
        for e in v["nics"].values():
            qps.add_metric([n, e["label"]], e["qps"])
            on_nics += e["qps"]
            for kind in ("rtr", "ah"):
                nic_placed.add_metric([n, e["label"], kind], e["placed"][kind])
        qps.add_metric([n, "none"], v["qps"] - on_nics)
        waited = histogram("rlb_host_verbs_answer_seconds", "how long the verbs library waited for the agent's "
                           "answer (path or keep), from asking; answers it no longer waited for are "
                           "rlb_host_verbs_answered_late", ["node", "kind"])
        for kind in KINDS:
            waited.add_metric([n, kind], *buckets(v["answer_times"], kind))
        late = counter("rlb_host_verbs_answered_late", "answers the library had stopped waiting for "
                       "(it kept the application's addresses)", ["node"])
        late.add_metric([n], c.get("answered_late", 0))
        unheard = counter("rlb_host_verbs_kept_unheard", "QPs kept when a peer asked because their process's "
                          "words may have been lost (its socket found half full while the agent was behind): "
                          "both ends keep the application's addresses", ["node"])
        unheard.add_metric([n], c.get("kept_unheard", 0))
        busy = counter("rlb_host_verbs_kept_busy", "QP pairs kept when a peer asked because this agent was "
                       "behind its questions, or the QP's library still had words unread here: both ends "
                       "keep the application's addresses", ["node"])
        busy.add_metric([n], c.get("kept_busy", 0))
        slow = counter("rlb_host_verbs_slow_rounds", "rounds of the agent's verbs thread over 50 ms (each "
                       "held every library's answer that long; the agent's log says what the round spent it on)",
                       ["node"])
        slow.add_metric([n], c.get("slow_rounds", 0))
        errors = counter("rlb_host_verbs_message_errors", "peer agents' messages whose handling failed in "
                         "this agent (a fault of the agent's: its log has the traceback); the others go on",
                         ["node"])
        errors.add_metric([n], c.get("message_errors", 0))
        mutual = counter("rlb_host_verbs_mutual_waits", "QP pairs whose two ends each waited for the other's "
                         "library to go first (a lost or late answer): this end, the rendezvous, went first",
                         ["node"])
        mutual.add_metric([n], c.get("mutual_waits", 0))
        yield from (asked, placed, kept, dis, bad, peers, sent, keyfile, clients, qps, nic_placed, waited, late,
                    unheard, busy, slow, errors, mutual)
