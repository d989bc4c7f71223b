"""The fabric coordinator: the service and its HTTP API (service), Prometheus (metrics), the
rlbcoord command (cli). A fabric kind's coordinator registers itself in COORDINATORS:
service.Coordinator (leaf-spine QP placement), hregistry.HRegistry (rail-only h-scores)."""
from rlbfabric.base import ByKind

# fabric kind -> factory(fabric, host_timeout_s) of an object with expire(), summary() and the
# HTTP handlers make_server() serves
COORDINATORS = ByKind("coordinator")
