"""Placement split over coordinators by leaf groups (issue 31): one coordinator process places
at most what one core solves in time, so a large fabric's leaves are cut into N shards, each
with its own election (keys.leader_key) and its own leader, which places the QPs of the hosts on
its leaves and writes their placements.

What couples shards. A QP from leaf a to leaf b loads a's uplink and the downlink into b on its
colour: a's uplinks carry only the QPs of a's shard, but the downlinks into b carry every
shard's. So each shard's leader publishes its QPs' loads per link and generation
(keys.shard_loads_key, under its lease), and every shard places in the room the others leave,
in one fixed order as the generations are placed (qpplacer.py): generation t of shard k above
every shard's newer generations and above generation t of the shards numbered before k. The
order makes it converge: shard 1's newest generation depends on nobody, shard 2's on shard 1's,
and so on, so after a change the shards settle in at most N rounds of publishing a generation
(tests/test_shards.py), and no two shards chase each other's moves. Within the rounding of one
QP per link and shard, the split placement is the one the single coordinator reaches with the
shards' QPs as generations.

Leaves are dealt to shards in turn (leaf i of the fabric file to shard i mod N), the same on
every coordinator given the same N. Not in runs: a job's hosts sit on neighbouring leaves, so
its collective would fall on one shard and be placed by one core; dealt in turn, it is spread
over all of them. Election keys carry N, so coordinators started with different counts see each
other and refuse to lead (etcdrun.py) rather than place twice."""
from __future__ import annotations

import json
from dataclasses import dataclass

from rlbfabric.kinds.clos import ClosFabric
from rlbfabric.policy.placement import add_loads

Loads = list[list[list[int]]]          # [side][leaf][colour], as Placement.loads()


@dataclass(frozen=True)
class Shard:
    index: int                         # 1 .. of
    of: int

    @classmethod
    def parse(cls, text: str) -> "Shard":
        """"K/N" (shard K of N, from 1), ValueError with the reason otherwise."""
        try:
            k, n = (int(x) for x in text.split("/"))
        except ValueError:
            raise ValueError(f"{text!r}: a shard is K/N, e.g. 2/4 (the second of four)") from None
        if not 1 <= k <= n:
            raise ValueError(f"{text!r}: the shard's number must be 1-{n}" if n >= 1 else
                             f"{text!r}: at least one shard")
        return cls(k, n)

    @property
    def whole(self) -> bool:
        return self.of == 1

    def __str__(self) -> str:
        return f"{self.index}/{self.of}"

    def leaves(self, fabric: ClosFabric) -> list[str]:
        """This shard's leaves: every N-th of the fabric file's, from its own number on."""
        if self.of > len(fabric.leaves):
            raise ValueError(f"{self.of} shards for {len(fabric.leaves)} leaves: at most one a leaf")
        return [lf.name for i, lf in enumerate(fabric.leaves) if shard_of(i, len(fabric.leaves), self.of) == self.index]

    def hosts(self, fabric: ClosFabric) -> set[str]:
        mine = set(self.leaves(fabric))
        return {h for h in fabric.hosts if fabric.leaf_of_host(h)[0].name in mine}


WHOLE = Shard(1, 1)


def shard_of(leaf_index: int, n_leaves: int, of: int) -> int:
    """The shard (from 1) of the fabric file's leaf number `leaf_index` (from 0)."""
    return leaf_index % of + 1


# ---- what shards tell each other -------------------------------------------------------------
def encode(tiers: list[Loads], of: int, leaf_names: list[str]) -> str:
    """A shard's loads per generation as its key's value: only the links it loads (a shard
    loads its own leaves' uplinks and some downlinks), by leaf name."""
    out = []
    for t in tiers:
        out.append([{leaf_names[v]: row for v, row in enumerate(side) if any(row)} for side in t])
    return json.dumps({"of": of, "tiers": out}, sort_keys=True, separators=(",", ":"))


def decode(value: bytes | str, leaf_index: dict[str, int], n_tiers: int, n_colours: int) -> tuple[int, list[Loads]]:
    """(the publisher's shard count, its loads per generation); ValueError for a value that is
    not one (a leaf this fabric file does not have included: the shards' files differ)."""
    v = json.loads(value)
    if not isinstance(v, dict) or not isinstance(v.get("of"), int) or not isinstance(v.get("tiers"), list):
        raise ValueError("not a shard's loads")
    n = len(leaf_index)
    tiers = []
    for t in v["tiers"][:n_tiers]:
        sides = []
        for side in t[:2]:
            rows = [[0] * n_colours for _ in range(n)]
            for leaf, row in side.items():
                if leaf not in leaf_index:
                    raise ValueError(f"leaf {leaf!r} is not in this fabric file")
                if len(row) != n_colours or not all(type(x) is int and x >= 0 for x in row):
                    raise ValueError(f"{leaf}: {row!r} is not {n_colours} QP counts")
                rows[leaf_index[leaf]] = row
            sides.append(rows)
        tiers.append(sides)
    return v["of"], tiers


def _zero(n_leaves: int, n_colours: int) -> Loads:
    return [[[0] * n_colours for _ in range(n_leaves)] for _ in range(2)]


def before(me: int, others: dict[int, list[Loads]], n_tiers: int, n_leaves: int, n_colours: int) -> list[Loads] | None:
    """What each of shard `me`'s generations is placed above (besides its own newer ones):
    every other shard's newer generations, and the same generation of the shards numbered
    before it. None when the others load nothing."""
    out = [_zero(n_leaves, n_colours) for _ in range(n_tiers)]
    seen = False
    for j, tiers in others.items():
        if j == me:
            continue
        for t, loads in enumerate(tiers):
            for k in range(t + (j > me), n_tiers):   # ... above generation t (t + 1 for later shards)
                add_loads(out[k], loads)
                seen = True
    return out if seen else None


def newest(others: dict[int, list[Loads]], me: int, n_leaves: int, n_colours: int) -> Loads | None:
    """The other shards' newest generations together: what a host's verbs library places a new
    QP beside, with this shard's own (service.link_table)."""
    out, seen = _zero(n_leaves, n_colours), False
    for j, tiers in others.items():
        if j != me and tiers:
            add_loads(out, tiers[0])
            seen = True
    return out if seen else None
