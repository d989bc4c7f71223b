"""Every fabric kind, one module each: a module here that registers a parser with
rlbfabric.base.kind is a kind (found by listing this folder, so adding a kind edits no list).

A kind's module imports only rlbfabric's shared pieces (base.py, bgpsec.py, addrplan.py,
servers.py); what other layers run per kind registers itself in that layer's ByKind registry,
from that layer's own kinds/ folder (rlbhost/kinds: the host agents)."""
from __future__ import annotations

from rlbcommon.discover import modules_of

MODULES = modules_of(__name__, __path__)
