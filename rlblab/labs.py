"""The lab each fabric kind needs, by the fabric file's kind: `open_lab` builds it. A kind's
module in rlblab/kinds/ registers its lab class (which names its KIND and the options it takes)
here, beside its scenarios; whoever opens labs imports rlblab.kinds (the rlblab command does)."""
from __future__ import annotations

from pathlib import Path

from rlbfabric.base import ByKind, FabricError
from rlbfabric.fabric import load

from .fabriclab import FabricLab

LABS = ByKind("lab")          # fabric kind -> its lab class


def register_lab(lab: type[FabricLab]) -> type[FabricLab]:
    return LABS.register(lab.KIND)(lab)


def open_lab(fabric_file: str | Path, name: str, **options) -> FabricLab:
    """The lab for a fabric file, with the options its kind takes (FabricLab takes them all; the
    scale-up and rail-only labs only `monitor`)."""
    fabric = load(fabric_file)
    try:
        lab = LABS.of(fabric)
    except FabricError as e:
        raise FabricError(f"{fabric_file}: {e}") from None
    return lab(fabric_file, name, **{k: v for k, v in options.items() if k in lab.OPTIONS})
