"""h-score rail routing (rlbfabric/hscore.py) against brute force: every rd, dr and drd path of
random clusters scored exactly (fractions, so ties are real ties), the Remote Rail Theorem and
its corollary, best fit and the spray window against linear scans, smoothing, and the document's
rail-only vs rail-optimised comparison."""
from __future__ import annotations

import math
import random
from fractions import Fraction

import pytest

from rlbfabric.hscore import Gpu, HScores, SortedRails, decide, gamma, rail_only_beats_rail_optimised


def brute(rails: dict, domains: dict, src: Gpu, dst: Gpu):
    """(kind, remote rails, H) by scoring every path: a remote rail only if its drd path beats
    both rd and dr; among those the lowest-H rail (best fit); else the better of rd and dr,
    dr on a tie (the document: r-interface only when gamma(G1) > gamma(G2))."""
    hd1, hd2, hg1, hg2 = domains[src.domain], domains[dst.domain], rails[src.rail], rails[dst.rail]
    rd, dr = hg1 * hd2, hd1 * hg2
    drd = {x: hd1 * h * hd2 for x, h in rails.items() if x not in (src.rail, dst.rail)}
    beating = [x for x, h in drd.items() if h > max(rd, dr)]
    if beating:
        x = min(beating, key=lambda r: (rails[r], r))
        return "drd", [x], drd[x]
    return ("rd", [], rd) if rd > dr else ("dr", [], dr)


def random_cluster(rnd: random.Random, zeros: bool):
    d, k = rnd.randint(2, 6), rnd.randint(3, 16)
    lo = 0 if zeros else 1
    grid = rnd.choice([4, 10, 100])          # coarse grids make ties
    rails = {r: Fraction(rnd.randint(lo, grid), grid) for r in range(k)}
    domains = {x: Fraction(rnd.randint(lo, grid), grid) for x in range(d)}
    while True:
        src, dst = Gpu(rnd.randrange(d), rnd.randrange(k)), Gpu(rnd.randrange(d), rnd.randrange(k))
        if src.domain != dst.domain and src.rail != dst.rail:
            return rails, domains, src, dst


def test_decisions_equal_brute_force_on_10k_random_score_sets():
    rnd = random.Random(2026)
    kinds = {"rd": 0, "dr": 0, "drd": 0}
    for i in range(10_000):
        zeros = i % 4 == 0
        rails, domains, src, dst = random_cluster(rnd, zeros)
        got = decide(SortedRails(rails), domains, src, dst)
        kind, remote, h = brute(rails, domains, src, dst)
        assert got.h == h, (rails, domains, src, dst, got, kind)
        if not zeros:        # with a dead domain several paths are all 0: any of them is right
            assert (got.kind, got.rails) == (kind, remote), (rails, domains, src, dst, got)
        kinds[got.kind] += 1
        # the theorem itself: a remote rail is used exactly when one is above max(gamma)
        m = max(gamma(rails[src.rail], domains[src.domain]), gamma(rails[dst.rail], domains[dst.domain]))
        if got.kind == "drd":
            assert rails[got.rails[0]] > m
            assert got.h > max(rails[src.rail] * domains[dst.domain], domains[src.domain] * rails[dst.rail])
        else:
            assert all(rails[x] <= m for x in rails if x not in (src.rail, dst.rail))
    assert min(kinds.values()) > 500, kinds      # every path type was exercised


def test_corollary_no_remote_rail_when_either_h_ratio_exceeds_one():
    rnd = random.Random(7)
    seen = 0
    for _ in range(5000):
        rails, domains, src, dst = random_cluster(rnd, zeros=False)
        g = (gamma(rails[src.rail], domains[src.domain]), gamma(rails[dst.rail], domains[dst.domain]))
        if max(g) > 1:
            seen += 1
            assert decide(SortedRails(rails), domains, src, dst).kind in ("rd", "dr")
            assert brute(rails, domains, src, dst)[0] in ("rd", "dr")
    assert seen > 500


def test_best_fit_binary_search_equals_a_linear_scan():
    rnd = random.Random(11)
    for _ in range(3000):
        k = rnd.randint(1, 64)
        scores = {r: Fraction(rnd.randint(0, 20), 20) for r in range(k)}
        sr = SortedRails(scores)
        for _ in range(3):                           # updates keep the order
            r = rnd.randrange(k)
            scores[r] = Fraction(rnd.randint(0, 20), 20)
            sr.set(r, scores[r])
        bound = Fraction(rnd.randint(-1, 21), 20)
        skip = tuple(rnd.sample(range(k), min(k, 2)))
        cands = [r for r in scores if scores[r] > bound and r not in skip]
        assert sr.above(bound, skip) == (min(cands, key=lambda r: (scores[r], r)) if cands else None)
        delta = Fraction(rnd.randint(0, 6), 20)
        window = sorted((r for r in scores if bound < scores[r] <= bound + delta and r not in skip),
                        key=lambda r: (scores[r], r))
        assert sr.window(bound, bound + delta, skip) == window


def test_spray_over_the_rails_within_delta_above_the_bound():
    rails = {0: Fraction(3, 10), 1: Fraction(2, 10), 2: Fraction(9, 10), 3: Fraction(7, 10),
             4: Fraction(75, 100), 5: Fraction(8, 10), 6: Fraction(6, 10)}
    domains = {0: Fraction(1), 1: Fraction(1)}
    src, dst = Gpu(0, 0), Gpu(1, 1)                  # gamma 0.3 and 0.2: m = 0.3
    sr = SortedRails(rails)
    assert decide(sr, domains, src, dst).rails == [6]                   # best fit: 0.6
    d = decide(sr, domains, src, dst, delta=Fraction(45, 100))          # (0.3, 0.75]
    assert (d.kind, d.rails) == ("drd", [6, 3, 4])
    assert d.first_hop == "d->(0, 6)"
    d = decide(sr, domains, src, dst, delta=Fraction(1, 10))            # nothing in (0.3, 0.4]
    assert d.rails == [6]


def test_same_domain_and_same_rail_and_bad_scores():
    sr = SortedRails({0: 0.5, 1: 0.9})
    assert decide(sr, {0: 0.8, 1: 0.4}, Gpu(0, 0), Gpu(0, 1)).kind == "d"
    assert decide(sr, {0: 0.8, 1: 0.4}, Gpu(0, 1), Gpu(1, 1)).kind == "r"
    with pytest.raises(ValueError, match="outside"):
        sr.set(2, 1.5)
    with pytest.raises(ValueError, match="domain 1"):
        decide(sr, {0: 0.8, 1: -0.1}, Gpu(0, 0), Gpu(1, 1))


def test_rail_only_vs_rail_optimised_equals_the_path_products():
    rnd = random.Random(3)
    for _ in range(5000):
        hg1, hd1, hs, hg2 = (Fraction(rnd.randint(0, 20), 20) for _ in range(4))
        only, opti = hd1 * hg2, hg1 * hs * hg2
        if hg2 and hd1 and hs:                      # a 0 factor on both sides is a tie
            assert rail_only_beats_rail_optimised(hg1, hd1, hs) == (only > opti)


def test_h_scores_follow_a_load_step_within_two_seconds():
    s = HScores(tau_s=0.5)
    t = 0.0
    for _ in range(10):
        s.sample("rail3", 0.0, t)
        t += 0.1
    for _ in range(20):                              # 2 s at 80 % utilisation
        s.sample("rail3", 0.8, t)
        t += 0.1
    assert abs(s.h("rail3") - 0.2) < 0.02 * 0.8 + 1e-9
    assert s.h("never-seen") == 1.0
    s.sample("rail4", 3.0, 0.0)                      # clipped
    assert s.h("rail4") == 0.0
    assert math.isclose(gamma(0.5, 0.25), 2.0) and gamma(0.5, 0) == math.inf
