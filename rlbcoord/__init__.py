"""The fabric coordinator: the service and its HTTP API (service), Prometheus (metrics), the
rlbcoord command (cli). Each fabric kind's module in rlbcoord/kinds/ registers what runs for it:
its coordinator in COORDINATORS (service.Coordinator: leaf-spine QP placement;
hregistry.HRegistry: rail-only h-scores), its metrics in COLLECTORS, and, for a kind whose
coordinator can run on etcd, its runner in ETCD_RUNNERS. Whoever uses them imports
rlbcoord.kinds (the rlbcoord command does)."""
from rlbfabric.base import ByKind

# fabric kind -> factory(fabric, host_timeout_s, host_qps_max) of an object with expire(),
# summary() and the HTTP handlers make_server() serves
COORDINATORS = ByKind("coordinator")
# fabric kind -> its metrics collector class (taking the coordinator): metrics.py
COLLECTORS = ByKind("coordinator metrics")
# fabric kind -> the runner that keeps its coordinator's state, placements and leadership on etcd
# (etcdrun.py): kinds without one run over HTTP only
ETCD_RUNNERS = ByKind("coordinator on etcd")
