"""Python's cyclic garbage collector against a model of hundreds of thousands of objects.

A coordinator's model at 4k hosts holds millions of tracked objects (QPs, their keys, the
mirror of etcd). CPython runs a full collection each time the objects that survived younger
collections grow by a quarter of the old ones: while a collective's QPs arrive, that is a
pause every few batches, each longer than the last (34 to 264 ms in bench/etcd_placement.py,
every one collecting nothing), all under the GIL, so no QP is read or placed meanwhile.

So the model, once a batch of changes is in it, is moved out of the collector's sight
(gc.freeze: its objects are still freed when their last reference goes; only cycles among them
would wait), and the collector looks only at what the next batch allocates. Cycles are rare
here (none in the benchmark's model), but a process that runs for weeks must not keep them: the
frozen objects get a full collection once an hour, when the caller says nothing is waiting."""
from __future__ import annotations

import gc
import logging
import time

log = logging.getLogger(__name__)
FULL_EVERY_S = 3600.0


class Heap:
    def __init__(self, clock=time.monotonic):
        self.clock = clock
        self.full_at = clock()
        self.counters = {"freezes": 0, "full_collections": 0, "full_collection_s": 0.0}

    def settle(self):
        """What the last batch left is long-lived: out of the collector's sight."""
        gc.freeze()
        self.counters["freezes"] += 1

    def collect_if_due(self, idle: bool) -> bool:
        """A full collection of everything frozen, when due and `idle` (nothing waits)."""
        if not idle or self.clock() - self.full_at < FULL_EVERY_S:
            return False
        t = time.perf_counter()
        gc.unfreeze()
        found = gc.collect()
        gc.freeze()
        took = time.perf_counter() - t
        self.full_at = self.clock()
        self.counters["full_collections"] += 1
        self.counters["full_collection_s"] += took
        log.info("full garbage collection while idle: %d objects kept, %d unreachable freed, %.0f ms",
                 gc.get_freeze_count(), found, took * 1000)
        return True
