"""Worked examples of h-score rail routing (outshift-hscore-rail-routing) on lab/rail-only.toml.

Background traffic loads chosen rails (GPU d3g<k> to d4g<k>, across rail k only) or a domain
(d1g3 to d1g4, across domain 1 only); the registry's h-scores follow; then QPs from G1 = d1g1 to
G2 = d2g2 are sent and the rail switches' port counters show which rail carried them (what
arrives at rail switch k's port from domain 1 is G1's traffic, relayed by (1, k) or G1's own).
The expected rail is computed by rlbfabric/hscore.decide from the registry's own scores, and
also stated as a number from the loads (the theorem's pick), so both the policy and the wire
are checked."""
from __future__ import annotations

import contextlib
import math
import tempfile
import time
from pathlib import Path

from rlbfabric.hscore import Gpu, SortedRails, decide, gamma, rail_only_beats_rail_optimised

from ..labs import register_lab
from ..raillab import RailLab
from ..scaleuplab import Receiver
from ..scenario import Check, Scenario, register

register_lab(RailLab)

G1, G2 = "d1g1", "d2g2"


@contextlib.contextmanager
def rail_loads(lab, loads: dict[int, float]):
    """Background traffic while in the block: rail k at loads[k] of its speed (d3g<k> -> d4g<k>)."""
    with contextlib.ExitStack() as stack:
        for k, u in loads.items():
            if u > 0:
                stack.enter_context(lab.load(f"d3g{k}", f"d4g{k}", u * lab.fabric.rail_mbps))
        yield


def _settle(lab, want: dict[str, dict[int, float]], timeout: float = 6.0, tol: float = 0.03):
    """Poll the registry until every score in want ({"rails"/"domains": {id: H}}) is within tol;
    returns (seconds it took, the scores)."""
    t0 = time.monotonic()
    while True:
        s = lab.hscores()
        if all(abs(s[part][str(k)] - h) <= tol for part, hs in want.items() for k, h in hs.items()):
            return time.monotonic() - t0, s
        if time.monotonic() - t0 > timeout:
            return math.inf, s
        time.sleep(0.05)


def _send_and_count(lab, n_qps: int, seed: int, packets: int = 5):
    """n QPs G1 -> G2; {rail: bytes its switch got from domain 1} and datagrams G2 received."""
    before = lab.rail_rx(1)
    with Receiver(lab.ns(G2), lab.fabric.address(G2)) as rx:
        sent = lab.run_qps(G1, G2, n_qps, packets, seed, rate_pps=1000).sent
    after = lab.rail_rx(1)
    return {k: after[k] - before[k] for k in after}, sent, rx.count


def _decision(scores: dict, delta=None):
    rails = SortedRails({int(k): v for k, v in scores["rails"].items()})
    doms = {int(k): v for k, v in scores["domains"].items()}
    return decide(rails, doms, Gpu(1, 1), Gpu(2, 2), delta)


def remote_rail(lab, trials=(({1: 0.6, 2: 0.5, 3: 0.2}, 3), ({1: 0.5, 2: 0.6, 4: 0.3}, 4))) -> list[Check]:
    """Rails g1 = 1 and g2 = 2 loaded: QPs G1 -> G2 take a remote rail, the best fit (the lowest
    H above max(gamma)), every trial; the scores follow the load step within 2 s."""
    checks = []
    lab.wait_converged(60)
    for i, (loads, expect) in enumerate(trials, start=1):
        loads_txt = ", ".join(f"rail {k} {u:.0%}" for k, u in loads.items())
        with rail_loads(lab, loads):
            took, s = _settle(lab, {"rails": {k: 1 - loads.get(k, 0) for k in range(1, lab.fabric.rails + 1)}})
            checks.append(Check(f"trial {i} ({loads_txt}): registry H per rail; seconds to follow the step",
                                (s["rails"], round(took, 2)), "1 - load within 0.03, in <= 2 s", took <= 2.0))
            time.sleep(0.3)                   # the agents' next pass has the same scores
            d = _decision(s)
            why = lab.why(G1, G2)["peers"][G2]
            checks.append(Check(f"trial {i}: {G1}'s decision to {G2} (rlbhost why)",
                                (why["kind"], why["rails"], why["why"]),
                                f"drd via rail {expect} (policy on the registry's scores: {d.kind} {d.rails})",
                                why["kind"] == "drd" and why["rails"] == [expect] == d.rails))
            rx, sent, got = _send_and_count(lab, 16, seed=60 + i)
            carried = max(rx, key=rx.get)
            share = rx[expect] / max(1, sum(rx.values()))
            checks.append(Check(f"trial {i}: bytes per rail switch from domain 1 (16 QPs); delivered",
                                (rx, f"{got}/{sent}"), f"all on rail {expect}; all delivered",
                                carried == expect and share >= 0.99 and got == sent))
            if i == 1:
                h = {k: s["rails"][str(k)] for k in (1, 2)}
                hd = s["domains"]["1"]
                ro, opt = hd * h[2], h[1] * 1.0 * h[2]
                pred = rail_only_beats_rail_optimised(h[1], hd, 1.0)
                checks.append(Check("rail-only dr H(d1)H(g2) vs rail-optimised H(g1)H(S)H(g2), H(S) = 1; "
                                    "the document's gamma(G1) < 1/H(S)", (round(ro, 3), round(opt, 3), pred),
                                    "the predicate agrees with the products", pred == (ro > opt)))
        _settle(lab, {"rails": {k: 1.0 for k in loads}}, timeout=10)
    return checks


def no_remote_rail(lab) -> list[Check]:
    """G1's domain loaded (30 %) while the rails are idle: gamma(G1) > 1, so no remote rail can
    beat rd or dr (the corollary); gamma(G1) > gamma(G2) = 1 makes it rd: G1's own rail."""
    lab.wait_converged(60)
    checks = []
    with lab.load("d1g3", "d1g4", 0.3 * lab.fabric.domain_mbps):
        took, s = _settle(lab, {"domains": {1: 0.7}})
        time.sleep(0.3)
        g1 = gamma(s["rails"]["1"], s["domains"]["1"])
        checks.append(Check("domain 1 at 30 %: H(d1), gamma(G1)", (s["domains"]["1"], round(g1, 3)),
                            "about 0.7; > 1", g1 > 1))
        why = lab.why(G1, G2)["peers"][G2]
        checks.append(Check(f"{G1}'s decision to {G2}", (why["kind"], why["why"]), "rd (no drd: gamma > 1)",
                            why["kind"] == "rd"))
        rx, sent, got = _send_and_count(lab, 16, seed=70)
        checks.append(Check("bytes per rail switch from domain 1; delivered", (rx, f"{got}/{sent}"),
                            "all on rail 1 (G1's own); all delivered",
                            rx[1] >= 0.99 * sum(rx.values()) and got == sent))
    _settle(lab, {"domains": {1: 1.0}}, timeout=10)
    return checks


def spray(lab, delta: float = 0.45, n_qps: int = 64) -> list[Check]:
    """With delta set (the registry restarted from a fabric file saying so), new QPs are spread
    over the rails with m < H <= m + delta: rails 3 (H 0.7) and 4 (H 0.85) for m = 0.5 and the
    window (0.5, 0.95], half each within 1 point. (No score sits near the window's edges: an
    idle rail's H of 1 against an edge at 1.0 would be in and out with the measurement's noise.)"""
    lab.wait_converged(60)
    text = Path(lab.fabric_file).read_text()
    with tempfile.NamedTemporaryFile("w", suffix=".toml", dir=lab.work, delete=False) as f:
        f.write("\n".join(f"delta = {delta}" if line.startswith("delta") else line for line in text.splitlines()))
    checks = []
    try:
        lab.restart_coordinator(f.name)
        with rail_loads(lab, {1: 0.6, 2: 0.5, 3: 0.3, 4: 0.15}):
            _, s = _settle(lab, {"rails": {1: 0.4, 2: 0.5, 3: 0.7, 4: 0.85}})
            time.sleep(0.3)
            d = _decision(s, delta)
            why = lab.why(G1, G2)["peers"][G2]
            checks.append(Check(f"delta {delta}: {G1}'s decision to {G2}", (why["kind"], why["rails"]),
                                f"drd over rails {d.rails} (policy on the registry's scores)",
                                why["kind"] == "drd" and sorted(why["rails"]) == sorted(d.rails) == [3, 4]))
            rx, sent, got = _send_and_count(lab, n_qps, seed=80)
            total = max(1, sum(rx.values()))
            shares = {k: round(v / total, 4) for k, v in rx.items()}
            checks.append(Check(f"{n_qps} QPs: share per rail switch", shares, "rails 3 and 4 at 0.5 within 0.01",
                                abs(shares[3] - 0.5) <= 0.01 and abs(shares[4] - 0.5) <= 0.01 and got == sent))
    finally:
        lab.restart_coordinator()
        Path(f.name).unlink(missing_ok=True)
    return checks


register(
    Scenario("hscore-remote-rail", "h-score rail routing, Remote Rail Theorem", "rails g1 and g2 loaded: "
             "QPs take the best-fit remote rail, seen on the rail switches", "rail-only.toml",
             remote_rail),
    Scenario("hscore-no-remote-rail", "h-score rail routing, the corollary", "gamma > 1: no remote rail, "
             "rd or dr by the h-ratios", "rail-only.toml", no_remote_rail),
    Scenario("hscore-spray", "h-score rail routing, approach 2", "delta set: QPs spread over the rails "
             "in the window, evenly within 1 point", "rail-only.toml", spray),
)
