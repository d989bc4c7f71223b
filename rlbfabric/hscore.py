"""h-score rail routing on rail-only clusters (outshift-hscore-rail-routing, ../shared/specs).

A rail-only cluster has D high-bandwidth domains of K GPUs; GPU (d, k) has an r-interface to
rail switch k and a d-interface into domain d. Every rail and every domain has an h-score
H in [0, 1] (1 = idle at line rate, lower = busier); a path's H is the product of its parts'.
A GPU's h-ratio is gamma(G) = H(its rail) / H(its domain).

From G1 (d1, g1) to G2 (d2, g2), d1 != d2 and g1 != g2, the paths are
    rd   G1's rail g1 to (d2, g1), then domain d2          H(g1) * H(d2)
    dr   domain d1 to (d1, g2), then rail g2               H(d1) * H(g2)
    drd  domain d1 to (d1, x), rail x to (d2, x), domain d2    H(d1) * H(x) * H(d2)
rd beats dr exactly when gamma(G1) > gamma(G2) (divide both by H(d1) H(d2)); the document takes
dr on a tie. A remote rail x beats both exactly when H(x) > max(gamma(G1), gamma(G2)) (the
Remote Rail Theorem), so never when either gamma > 1 (the corollary: H(x) <= 1). Among the
rails that qualify the best fit is the lowest H above that bound (the healthiest rails stay free
for pairs that need them), found by binary search in the rails sorted by H: O(log K).

Packet spray (the document's approach 2) takes the rails with H within delta of
m = max(gamma(G1), gamma(G2)); only those above m beat rd and dr (the theorem), so the window
used is (m, m + delta], and the best fit alone when nothing lies inside it.

Same domain: the domain (d). Same rail: the rail (r). The policy is pure; scores come from a
registry (HScores) that turns measured utilisation into smoothed h-scores."""
from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Gpu:
    domain: int
    rail: int

    def __str__(self):
        return f"({self.domain}, {self.rail})"


def gamma(h_rail, h_domain):
    """A GPU's h-ratio; a dead domain makes it infinite: no path through the domain is worth
    anything, so neither dr nor a remote rail (and a GPU dead on both sides has only 0 paths)."""
    if h_domain == 0:
        return math.inf
    return h_rail / h_domain


def check_score(what: str, h):
    if not 0 <= h <= 1:
        raise ValueError(f"{what}: h-score {h} outside [0, 1]")


@dataclass
class Decision:
    kind: str                  # "d" (same domain), "r" (same rail), "rd", "dr" or "drd"
    first_hop: str             # "r", or "d->(d1, y)": the d-interface towards GPU (d1, y)
    rails: list[int]           # drd: the remote rail, or the rails sprayed over
    h: object                  # the chosen path's h-score (the spray's lowest)
    gamma_src: object = None
    gamma_dst: object = None
    bound: object = None       # m = max of the two h-ratios
    why: str = ""


class SortedRails:
    """Rails sorted by h-score (then by number, so ties resolve the same way everywhere)."""

    def __init__(self, scores: dict[int, object] | None = None):
        self._keys: list[tuple] = []
        self._h: dict[int, object] = {}
        for rail, h in (scores or {}).items():
            self.set(rail, h)

    def set(self, rail: int, h):
        check_score(f"rail {rail}", h)
        old = self._h.get(rail)
        if old is not None:
            del self._keys[bisect.bisect_left(self._keys, (old, rail))]
        self._h[rail] = h
        bisect.insort(self._keys, (h, rail))

    def h(self, rail: int):
        return self._h[rail]

    def __len__(self):
        return len(self._keys)

    def above(self, bound, skip=()) -> int | None:
        """Best fit: the rail with the lowest h-score strictly above bound (not in skip)."""
        i = bisect.bisect_right(self._keys, (bound, math.inf))
        while i < len(self._keys) and self._keys[i][1] in skip:
            i += 1
        return self._keys[i][1] if i < len(self._keys) else None

    def window(self, low, high, skip=()) -> list[int]:
        """The rails with low < H <= high (not in skip), lowest first."""
        i = bisect.bisect_right(self._keys, (low, math.inf))
        j = bisect.bisect_right(self._keys, (high, math.inf))
        return [r for _, r in self._keys[i:j] if r not in skip]


def decide(rails: SortedRails, domains: dict[int, object], src: Gpu, dst: Gpu,
           delta=None) -> Decision:
    """The path from src to dst and its first hop, by the document's rules."""
    hd1, hd2 = domains[src.domain], domains[dst.domain]
    check_score(f"domain {src.domain}", hd1)
    check_score(f"domain {dst.domain}", hd2)
    hg1, hg2 = rails.h(src.rail), rails.h(dst.rail)
    if src.domain == dst.domain:
        return Decision("d", f"d->{dst}", [], hd1, why="same domain: its interconnect")
    if src.rail == dst.rail:
        return Decision("r", "r", [], hg1, why="same rail: the rail switch")
    g1, g2 = gamma(hg1, hd1), gamma(hg2, hd2)
    m = max(g1, g2)
    skip = (src.rail, dst.rail)
    if m < 1:       # the corollary: at or above 1 no rail (H <= 1) can be above it
        if delta is not None:
            spray = rails.window(m, m + delta, skip)
            if spray:
                return Decision("drd", f"d->({src.domain}, {spray[0]})", spray,
                                hd1 * rails.h(spray[0]) * hd2, g1, g2, m,
                                f"{len(spray)} rails with {_f(m)} < H <= {_f(m + delta)}: spray")
        x = rails.above(m, skip)
        if x is not None:
            return Decision("drd", f"d->({src.domain}, {x})", [x], hd1 * rails.h(x) * hd2, g1, g2, m,
                            f"rail {x}: the lowest H ({_f(rails.h(x))}) above max(gamma) = {_f(m)}")
    if g1 > g2:
        return Decision("rd", "r", [], hg1 * hd2, g1, g2, m,
                        f"gamma(src) {_f(g1)} > gamma(dst) {_f(g2)}; no rail above {_f(m)}")
    return Decision("dr", f"d->({src.domain}, {dst.rail})", [], hd1 * hg2, g1, g2, m,
                    f"gamma(src) {_f(g1)} <= gamma(dst) {_f(g2)}; no rail above {_f(m)}")


def rail_only_beats_rail_optimised(h_rail_src, h_domain_src, h_spine) -> bool:
    """The document's last section: from G1 to G2 on different rails, rail-only goes d1 then
    rail g2 (H(d1) H(g2)), rail-optimised goes rail g1, a spine, rail g2 (H(g1) H(S) H(g2));
    rail-only is better exactly when gamma(G1) < 1 / H(S)."""
    if h_spine == 0:
        return h_domain_src > 0 or h_rail_src == 0
    return gamma(h_rail_src, h_domain_src) < 1 / h_spine


def _f(x) -> str:
    return "inf" if x == math.inf else f"{float(x):.3f}"


@dataclass
class HScores:
    """Measured utilisation in, smoothed h-scores out: H = 1 - u, u the element's utilisation
    (its busiest port's tx rate over capacity, clipped to [0, 1]) smoothed by an exponential
    moving average with time constant tau_s (time-based, so irregular samples weigh by the time
    they cover). With tau 0.5 s a step in load is 98 % followed after 2 s."""
    tau_s: float = 0.5
    _u: dict = field(default_factory=dict)        # element -> (smoothed u, time)

    def sample(self, element, utilisation: float, now: float):
        u = min(1.0, max(0.0, utilisation))
        prev = self._u.get(element)
        if prev is None:
            self._u[element] = (u, now)
            return
        s, t = prev
        a = 1 - math.exp(-max(0.0, now - t) / self.tau_s)
        self._u[element] = (s + a * (u - s), now)

    def force(self, element, utilisation: float, now: float):
        """Set the element's utilisation outright (no smoothing): what is known to be so."""
        self._u[element] = (min(1.0, max(0.0, utilisation)), now)

    def h(self, element) -> float:
        prev = self._u.get(element)
        return 1.0 if prev is None else 1.0 - prev[0]
