"""The host agent of each fabric kind, one module each (clos.py: leaf-spine hosts and hosts
without a fabric file; scaleup.py: scale-up GPUs; railonly.py: rail-only GPUs). Each registers
its assembler in assemble.HOST_AGENTS under its kind's name; this folder is listed to find them."""
from __future__ import annotations

from rlbcommon.discover import modules_of

MODULES = modules_of(__name__, __path__)
