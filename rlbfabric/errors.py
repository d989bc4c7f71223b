"""The one error a fabric description raises when it is wrong (a CLI prints it as an operator error)."""
from __future__ import annotations


class FabricError(ValueError):
    pass
