"""The seeds' worked examples on leaf-spine fabrics: Juniper RLB with BGP-DPF, the FARE draft,
FARE for scale-up networks reproduced on a Clos fabric, and the JVD's rail-optimised GPU servers
(lab/fabric*.toml)."""
from __future__ import annotations

import random
import threading
import time

from rlbcommon.netns import run

from rlbfabric import workloads

from .. import topo
from ..fabriclab import FabricLab, balance
from ..labs import register_lab
from ..matrix import run_matrix
from ..scenario import Check, Scenario, register
from ..traffic import Flow, QpRun, open_raw, send

register_lab(FabricLab)


def qps_per_link(r: QpRun, n: int) -> dict[str, int]:
    """Spine -> QPs it carried, from the bytes on each uplink (every QP sends the same)."""
    total = sum(r.links.values())
    return {k: round(v / total * n) for k, v in r.links.items()} if total else {}


ONE_PER_SPINE = {"s1": 1, "s2": 1, "s3": 1, "s4": 1}


# ---- Juniper RLB with BGP-DPF ------------------------------------------------------------

def fig10(lab: FabricLab, seeds=range(6)) -> list[Check]:
    runs = [round(balance(lab.run_qps("h1", "h3", 4, 50, s).links)["max_mean"], 2) for s in seeds]
    return [Check("kernel ECMP, 4 QPs h1->h3: max/mean per run", runs,
                  "some run >= 1.5 (two QPs share a spine)", any(r >= 1.5 for r in runs))]


def fig11(lab: FabricLab, seeds=range(6)) -> list[Check]:
    per_run = [qps_per_link(lab.run_qps("h1", "h3", 4, 50, s), 4) for s in seeds]
    worst = max(max(q.values()) for q in per_run)
    return [Check("RLB, 4 QPs h1->h3: most QPs on one spine in any run", worst, "1 (one QP per spine)",
                  all(q == ONE_PER_SPINE for q in per_run))]


def table2_fig8(lab: FabricLab) -> list[Check]:
    routes = lab.routes("l2")
    wrong = [f"fc00:1:{p}:{k}::/64" for p in (1, 2) for k in range(1, 5)
             if not (routes.get(f"fc00:1:{p}:{k}::/64", {}).get("mode") == "pinned"
                     and routes[f"fc00:1:{p}:{k}::/64"]["nexthop"]["via"].endswith(f"%eth-s{k}"))]
    back = qps_per_link(lab.run_qps("h3", "h1", 4, 50, seed=7), 4)
    return [Check("l2 pins fc00:1:p:k::/64 to spine k (8 prefixes)", f"{8 - len(wrong)} of 8",
                  "8 of 8", not wrong),
            Check("4 QPs h3->h1 per spine", back, "one each", back == ONE_PER_SPINE)]


def fig13(lab: FabricLab, spine: str = "s4") -> list[Check]:
    """l1's uplink to `spine` (k = its number) fails under 12 QPs h1->h3: its QPs spread by DLB,
    the others stay; h3's colour-k prefix goes to DLB on l1, and is pinned again when it is back."""
    k = int(spine[1:])
    net = f"fc00:2:1:{k}::/64"
    others = [s for s in ONE_PER_SPINE if s != spine]
    res: dict = {}
    checks = []
    before = qps_per_link(lab.run_qps("h1", "h3", 12, 20, seed=3), 12)
    checks.append(Check("12 QPs per spine before", before, "3 each", before == {s: 3 for s in ONE_PER_SPINE}))
    rx = lambda: topo.counters(lab.host_ns("h3"), lab.host_if("h3"))["rx_packets"]   # noqa: E731
    rx0 = rx()
    t = threading.Thread(target=lambda: res.update(r=lab.run_qps("h1", "h3", 12, 400, seed=3, rate_pps=4000)))
    t.start()
    try:
        time.sleep(0.4)
        run(lab.ns("l1"), "ip", "link", "set", f"eth-{spine}", "down")
        t.join()
        res["rx"] = rx() - rx0           # h3's own traffic in the meantime: a few RAs and ND at most
        during = qps_per_link(lab.run_qps("h1", "h3", 12, 20, seed=3), 12)
        checks.append(Check(f"l1-{spine} down: QPs per spine", during, f"{spine} 0, the others >= 3 each (DLB)",
                            during.get(spine) == 0 and sum(during.values()) == 12
                            and all(during[s] >= 3 for s in others)))
        deadline = time.time() + 10
        while lab.routes("l1")[net]["mode"] != "dlb" and time.time() < deadline:
            time.sleep(0.2)
        mode = lab.routes("l1")[net]["mode"]
        checks.append(Check(f"after bird withdraws: {net} on l1", mode, "dlb (not a new pin)", mode == "dlb"))
    finally:
        t.join()
        run(lab.ns("l1"), "ip", "link", "set", f"eth-{spine}", "up")
    lost = max(0, res["r"].sent - res["rx"]) if "r" in res and "rx" in res else None
    checks.append(Check("packets lost to the failure (4800 sent at 4000/s)", lost, "recorded", lost is not None))
    deadline = time.time() + 30
    while time.time() < deadline:
        r = lab.routes("l1")[net]
        if r["mode"] == "pinned" and r["nexthop"]["via"].endswith(f"%eth-{spine}") and r["nexthop"]["port_up"]:
            break
        time.sleep(0.3)
    after = qps_per_link(lab.run_qps("h1", "h3", 12, 20, seed=3), 12)
    checks.append(Check("link back: QPs per spine", after, "3 each", after == {s: 3 for s in ONE_PER_SPINE}))
    return checks


# ---- FARE ----------------------------------------------------------------------------------

def fare_4_1(lab: FabricLab, n_qps: int = 12000) -> list[Check]:
    """12000 QPs towards h1's path-2 addresses from h2: l2 splits them by its FARE weights
    (s1 10 Gb/s, s2 5 Gb/s behind it); the split is a binomial sample, sigma 0.43 points."""
    a, b = lab.host_addresses("h2"), lab.host_addresses("h1")
    rnd = random.Random(4)
    flows = [Flow(a[2], b[2], rnd.randrange(1024, 65536), rnd.getrandbits(24)) for _ in range(n_qps)]
    sock = open_raw(lab.ns("h2"), "eth0")
    before = lab.link_counts("l2")
    try:
        send(sock, flows, 1, dmac=topo.mac(lab.ns("l2"), "eth-h2"), smac=topo.mac(lab.ns("h2"), "eth0"),
             payload_len=400)
        time.sleep(0.3)
    finally:
        sock.close()
    after = lab.link_counts("l2")
    got = {k: after[k] - before[k] for k in after}
    share = got["s1"] / sum(got.values())
    return [Check(f"{n_qps} QPs h2->h1: share of l2's bytes on s1", round(share, 3),
                  "0.667 ± 0.02 (weights 10000:5000)", abs(share - 2 / 3) < 0.02)]


def fare_4_2(lab: FabricLab) -> list[Check]:
    """5 stages: ss2's link towards s12 runs at half speed; the remote leaf l2 weights h1's
    path-2 prefix 10000:5000 over its spines (FARE's min() carried across the super-spines)."""
    deadline, w = time.time() + 15, {}
    while time.time() < deadline:
        r = lab.routes("l2").get("fc00:1:1:2::/64", {})
        w = {m["via"].split("%")[1]: m["weight"] for m in r.get("members", [])}
        if w == {"eth-s21": 10000, "eth-s22": 5000}:
            break
        time.sleep(0.3)
    return [Check("l2's weights for fc00:1:1:2::/64 (Mb/s)", w, "eth-s21 10000, eth-s22 5000",
                  w == {"eth-s21": 10000, "eth-s22": 5000})]


# ---- FARE for scale-up networks ------------------------------------------------------------

def scaleup_3_1(lab: FabricLab) -> list[Check]:
    """8 QPs (2 per path); h1's path 4 at half weight: 8 x (1,1,1,0.5)/3.5 -> 3,2,2,1 by
    largest remainder, so exactly one QP moves, from path 4 to path 1; recovery moves it back."""
    checks = []
    lab.cli("h1", "config", "--expiry-ms", "60000")       # keep QPs active across the change
    try:
        first = qps_per_link(lab.run_qps("h1", "h3", 8, 20, seed=5), 8)
        checks.append(Check("8 QPs per path", first, "2 each", first == {s: 2 for s in ONE_PER_SPINE}))
        out = lab.cli("h1", "weights", "set", "4=0.5")
        checks.append(Check("path 4 at weight 0.5: QPs moved", out.strip().splitlines()[-1], "1 QPs moved",
                            "1 QPs moved" in out))
        degraded = qps_per_link(lab.run_qps("h1", "h3", 8, 20, seed=5), 8)
        checks.append(Check("QPs per path, degraded", degraded, "3,2,2,1",
                            degraded == {"s1": 3, "s2": 2, "s3": 2, "s4": 1}))
        out = lab.cli("h1", "weights", "set", "4=1")
        back = qps_per_link(lab.run_qps("h1", "h3", 8, 20, seed=5), 8)
        checks.append(Check("recovered: QPs moved, per path", (out.strip().splitlines()[-1], back),
                            "1 QPs moved; 2 each", "1 QPs moved" in out and back == first))
    finally:
        lab.cli("h1", "weights", "set", "4=1")
        lab.cli("h1", "config", "--expiry-ms", "200")
    return checks


def scaleup_3_2_spray(lab: FabricLab, packets: int = 20000) -> list[Check]:
    """§3.2 on the switch side: h3's prefixes are sprayed (policy spray in the fabric file), so
    ONE QP from h1 is spread per packet over l1's four uplinks by their (equal) weights."""
    mode = lab.routes("l1")["fc00:2:1:1::/64"]["mode"]
    r = lab.run_qps("h1", "h3", 1, packets, seed=11, payload_len=256)
    total = sum(r.links.values())
    shares = {k: round(v / total, 4) for k, v in r.links.items()} if total else {}
    return [Check("l1's route to h3's prefixes", mode, "spray", mode == "spray"),
            Check(f"1 QP, {packets} packets: share per uplink", shares, "0.25 ± 0.01 each",
                  bool(shares) and all(abs(s - 0.25) < 0.01 for s in shares.values()))]


# ---- rail-optimised GPU servers (Juniper JVD: gpu0_eth ... gpu7_eth, NIC r on leaf r) ------------

def rails_stripe(lab: FabricLab) -> list[Check]:
    """Servers a1, a2 of two NICs each, NIC r on rail leaf r: same-rail QPs stay on their leaf,
    cross-rail QPs spread over the spines, and every NIC's QPs at once are at the best balance."""
    nics = {m: lab.fabric.endpoints(m) for m in ("a1", "a2")}
    same = lab.run_qps(nics["a1"][0], nics["a2"][0], 8, 50, seed=11)
    across = lab.run_qps(nics["a1"][0], nics["a2"][1], 8, 50, seed=12)
    cross = qps_per_link(across, 8)
    one_qp = sum(across.links.values()) // 8 // 2     # half a QP's bytes: below it, no QP crossed a spine
    conns = workloads.connections("all-to-all", [h for m in ("a1", "a2") for h in nics[m]])
    m = run_matrix(lab, conns, 2, packets=100, seed=13, bursts=2)
    got, best = m.figures(), m.best(lab.fabric)
    checks = [Check(f"8 QPs {nics['a1'][0]} -> {nics['a2'][0]} (same rail): bytes on l1's uplinks",
                    sum(same.links.values()), f"< {one_qp} (half a QP's): they stay on the leaf",
                    sum(same.links.values()) < one_qp),
              Check(f"8 QPs {nics['a1'][0]} -> {nics['a2'][1]} (across rails): QPs per spine", cross, "2 each",
                    cross == {s: 2 for s in ONE_PER_SPINE}),
              Check("every NIC to every other, 2 QPs each (24 QPs, both NICs of both servers at once): worst "
                    "leaf max/mean up, down", [round(x, 2) for x in got], f"within 0.05 of the best {best}",
                    all(g <= b + 0.05 for g, b in zip(got, best)))]
    if lab.coordinator:
        servers = lab.coordinator_status().get("servers", {})
        nic_counts = {s: len(e["nics"]) for s, e in servers.items()}
        checks.append(Check("the coordinator: NICs reporting per server", nic_counts, "2 each",
                            nic_counts == {"a1": 2, "a2": 2}))
    return checks


register(
    Scenario("juniper-fig10", "Juniper RLB, Fig. 10", "kernel ECMP puts two of 4 QPs on one spine",
             "fabric.toml", fig10, {"mode": "baseline"}),
    Scenario("juniper-fig11", "Juniper RLB, Fig. 11", "RLB puts exactly one of 4 QPs on each spine",
             "fabric.toml", fig11),
    Scenario("juniper-table2", "Juniper RLB, Table 2 / Fig. 8",
             "the remote leaf pins prefix colour k to spine k", "fabric.toml", table2_fig8),
    Scenario("juniper-fig13", "Juniper RLB, Fig. 13",
             "an uplink fails: its QPs spread by DLB, the others stay; recovery", "fabric.toml", fig13),
    Scenario("frr-table2", "Mixed fabric: an FRR spine (no AIGP)",
             "every prefix pinned as with bird only (colour k to spine k), one QP per spine",
             "fabric-frr.toml", lambda lab: table2_fig8(lab) + fig11(lab, seeds=range(3))),
    Scenario("frr-fig13", "Mixed fabric: the FRR spine's link fails",
             "its QPs spread by DLB, the others stay; pinned again when it is back", "fabric-frr.toml",
             lambda lab: fig13(lab, "s1")),
    Scenario("frr2-table2", "Mixed fabric: two FRR spines",
             "every prefix pinned as with bird only, one QP per spine", "fabric-frr2.toml",
             lambda lab: table2_fig8(lab) + fig11(lab, seeds=range(3))),
    Scenario("fare-4.1", "FARE draft, §4.1", "weights follow the slower link (10:5 Gb/s -> 2:1)",
             "fabric-2x2.toml", fare_4_1, {"shape": True, "coordinator": False}),
    Scenario("fare-4.2", "FARE draft, §4.2", "a slow super-spine link reaches the remote leaf's weights",
             "fabric-5stage.toml", fare_4_2),
    Scenario("scaleup-3.1-host", "FARE scale-up, §3.1 (host side)",
             "a path at half weight moves exactly the proportional QPs, and back", "fabric.toml",
             scaleup_3_1),
    Scenario("scaleup-3.2-spray", "FARE scale-up, §3.2 (switch side)",
             "one QP sprayed per packet across the uplinks by weight", "fabric-spray.toml",
             scaleup_3_2_spray),
    Scenario("rails-stripe", "Juniper RLB JVD, rail-optimised servers (gpu0_eth ... gpu7_eth)",
             "same-rail QPs stay on their leaf, cross-rail ones spread, every NIC balanced at once",
             "fabric-rails.toml", rails_stripe),
)
