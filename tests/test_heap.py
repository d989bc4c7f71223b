"""rlbcommon/heap.py: a model kept out of the collector's sight between batches, and the full
collection that still frees its cycles, only when due and idle."""
from __future__ import annotations

import gc
import weakref

from rlbcommon.heap import FULL_EVERY_S, Heap


class Node:
    pass


def test_a_settled_model_is_frozen_and_a_due_idle_collection_frees_its_cycles():
    now = [0.0]
    heap = Heap(clock=lambda: now[0])
    try:
        a, b = Node(), Node()
        a.other, b.other = b, a                      # a cycle: only the collector frees it
        gone = weakref.ref(a)
        heap.settle()
        assert gc.get_freeze_count() > 0
        del a, b
        gc.collect()
        assert gone() is not None                     # frozen: out of the collector's sight
        now[0] = FULL_EVERY_S - 1
        assert not heap.collect_if_due(idle=True)    # not due yet
        now[0] = FULL_EVERY_S
        assert not heap.collect_if_due(idle=False)   # due, but a batch is waiting
        assert gone() is not None
        assert heap.collect_if_due(idle=True)
        assert gone() is None and gc.get_freeze_count() > 0
        assert heap.counters["full_collections"] == 1
        assert not heap.collect_if_due(idle=True)    # the next one an hour later
    finally:
        gc.unfreeze()
