"""A GPU's weights per sub-port (ScaleupGpuAgent.weights_from), from the ports' state and the
routes bird holds: no data plane or bird needed to compute them."""
from __future__ import annotations

from pathlib import Path

from rlbfabric.bird.ctl import BirdPath
from rlbfabric.fabric import load
from rlbhost.kinds.scaleup import GBPS, ScaleupGpuAgent

FABRIC = Path(__file__).resolve().parent.parent / "lab" / "scaleup.toml"


def gpu_agent(tmp_path) -> ScaleupGpuAgent:
    agent = ScaleupGpuAgent(None, load(FABRIC), "g1", tmp_path)
    for p in agent.ports:
        agent.carrier[p.ifname] = True
        agent.macs[p.ifname] = "02:00:00:00:00:01"
    return agent


def weights_to_g2(agent) -> dict[str, float]:
    g2 = agent.fabric.loopback("g2")
    routes = [BirdPath(net=f"{g2}/128", proto=f"bgp_{p.ifname}", iface=p.ifname, source="BGP") for p in agent.ports]
    w, _ = agent.weights_from(routes)[f"{g2}/128"]
    return {p.ifname: w[p.value] for p in agent.ports}


def test_a_sub_port_back_with_carrier_counts_only_once_its_switch_is_known(tmp_path):
    """eth-p2-1 has carrier again but its switch's MAC is not known yet: it cannot carry a QP,
    and plane 2 must weigh one sub-port's bandwidth on eth-p2-2, not both (which put the whole
    plane on eth-p2-2 first and moved its QPs twice); once the MAC is known, both again."""
    agent = gpu_agent(tmp_path)
    sub = agent.fabric.sub_mbps(agent.ports[0].plane.name) * 1e6 / 8 / GBPS
    full = weights_to_g2(agent)
    assert set(full.values()) == {sub}
    del agent.macs["eth-p2-1"]
    back = weights_to_g2(agent)
    assert back["eth-p2-1"] == 0.0 and back["eth-p2-2"] == sub
    assert {k: v for k, v in back.items() if not k.startswith("eth-p2-")} == \
        {k: v for k, v in full.items() if not k.startswith("eth-p2-")}
    agent.carrier["eth-p2-2"] = False               # the plane's other sub-port lost too: nothing
    assert weights_to_g2(agent)["eth-p2-2"] == 0.0
