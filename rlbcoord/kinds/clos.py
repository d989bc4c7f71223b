"""Leaf-spine fabrics: hosts' QPs placed on leaves' uplinks (service.Coordinator), over HTTP or on
etcd (etcdrun.EtcdCoordination, leadership and shards)."""
from __future__ import annotations

from .. import COLLECTORS, COORDINATORS, ETCD_RUNNERS
from ..etcdrun import EtcdCoordination
from ..metrics import CoordinatorCollector
from ..service import for_clos

COORDINATORS.register("clos")(for_clos)
COLLECTORS.register("clos")(CoordinatorCollector)
ETCD_RUNNERS.register("clos")(EtcdCoordination)
