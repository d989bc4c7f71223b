"""FRR (frrouting.org) as a spine of another make in an RLB fabric: its configuration rendered
from the fabric file (conf.py)."""
