"""The lab each fabric kind needs, by the fabric file's kind: `open_lab` builds it. A new kind's
lab is a module whose class names its KIND and the options it takes, added to LABS here."""
from __future__ import annotations

from pathlib import Path

from rlbfabric.fabric import FabricError, load

from .fabriclab import FabricLab
from .raillab import RailLab
from .scaleuplab import ScaleupLab

LABS = {lab.KIND: lab for lab in (FabricLab, ScaleupLab, RailLab)}


def open_lab(fabric_file: str | Path, name: str, **options) -> FabricLab:
    """The lab for a fabric file, with the options its kind takes (FabricLab takes them all; the
    scale-up and rail-only labs only `monitor`)."""
    kind = load(fabric_file).kind
    if kind not in LABS:
        raise FabricError(f"{fabric_file}: no lab for fabric kind {kind!r}")
    lab = LABS[kind]
    return lab(fabric_file, name, **{k: v for k, v in options.items() if k in lab.OPTIONS})
