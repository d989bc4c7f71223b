"""Rail-only fabrics: the h-score registry (hregistry.HRegistry), over HTTP only."""
from __future__ import annotations

from .. import COLLECTORS, COORDINATORS
from ..hregistry import for_rails
from ..metrics import RegistryCollector

COORDINATORS.register("rail-only")(for_rails)
COLLECTORS.register("rail-only")(RegistryCollector)
