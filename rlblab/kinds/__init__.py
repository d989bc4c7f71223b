"""Each fabric kind in the labs, one module each: it registers the kind's lab (labs.LABS) and its
worked examples (scenario.register). Found by listing this folder."""
from __future__ import annotations

from rlbcommon.discover import modules_of

MODULES = modules_of(__name__, __path__)
