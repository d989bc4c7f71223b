"""bird's routes into the data plane (the switch agent's writing side): compiled by the fabric's
policy, programmed in one batch as the agent's own routes (connected, local and an operator's
are left to their owners), and why each is as it is kept for `rlbswitch route show`."""
from __future__ import annotations

import json
import logging
import time
from typing import Callable

from rlbcommon.paths import write_atomic
from rlbfabric.base import Node, SwitchedFabric
from rlbfabric.policy.compiler import compile_for_node

from .dataplane import SwitchDataplane
from .runfiles import why_file

log = logging.getLogger("rlbswitch.birdsync")


class RouteProgrammer:
    def __init__(self, dp: SwitchDataplane, fabric: SwitchedFabric, node: Node, trusted: Callable[[list], list],
                 link_bw: Callable[[str], float], stats: dict):
        self.dp, self.fabric, self.node = dp, fabric, node
        self.trusted, self.link_bw, self.stats = trusted, link_bw, stats
        self.programmed: set[str] = set()          # prefixes this agent owns (bird's routes)
        self.explain: dict[str, str] = {}
        self.synced_writes = -1                    # the tables' operator writes at the last full sync
        self._reported: set = set()
        self._why_text = None

    def adopt(self):
        """A restarted agent takes over what the previous one programmed (the routes recorded as
        the agent's; an operator's stay theirs); the first sync then changes only what bird's
        table says differently."""
        self.programmed = self.dp.tables.owned_by("agent")

    def compile(self, paths):
        return compile_for_node(self.fabric, self.node, self.trusted(paths), self.link_bw)

    def sync(self, paths, only: set[str] | None = None) -> bool:
        """Program bird's routes (compiled by policy) in one batch. With `only`, paths are those
        prefixes' (after an event) and nothing else is touched. False if some route could not
        be programmed yet (it is retried)."""
        t0 = time.perf_counter()
        compiled = self.compile(paths)
        tables = self.dp.tables
        if only is None:
            self.synced_writes = tables.operator_writes   # a full sync sees every operator's change
        for net in [n for n in compiled if tables.owner(n) not in (None, "agent")]:
            if ("owner", net) not in self._reported:
                self._reported.add(("owner", net))
                log.warning("%s is the %s's route: bird's is not programmed over it", net, tables.owner(net))
            del compiled[net]
        scope = (set(self.programmed) | set(compiled)) if only is None else only
        ch = self.dp.apply_routes([c.route for c in compiled.values()], keep_going=True, owner="agent",
                                  scope=lambda net: str(net) in scope and tables.owner(net) in (None, "agent"),
                                  only_own=True)
        for net in ch.yielded:          # an operator's route written since the check above
            compiled.pop(net, None)
            log.warning("%s is the %s's route: bird's is not programmed over it", net, tables.owner(net))
        for net, why in ch.failed.items():
            log.warning("cannot program %s: %s (retrying)", net, why)
        if only is None:
            self.programmed = set(compiled)          # failed ones too: still bird's, retried
            self.explain = {net: c.why for net, c in compiled.items()}
        else:
            self.programmed = (self.programmed - only) | set(compiled)
            for net in only:
                self.explain.pop(net, None)
            self.explain.update({net: c.why for net, c in compiled.items()})
        if ch:
            log.info("routes from bird%s: %s", f" ({len(only)} changed)" if only is not None else "", ch.summary())
        self.stats["last_sync_seconds"] = time.perf_counter() - t0
        self.stats["syncs"] += 1
        text = json.dumps(self.explain)
        if text != self._why_text:
            write_atomic(why_file(self.dp.instance), text)
            self._why_text = text
        return not ch.failed
