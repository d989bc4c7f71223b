"""rlbhost: per-QP path selection on GPU hosts (issue 3; not built yet)."""
import sys


def main():
    print("rlbhost: not implemented yet (see issue 3)", file=sys.stderr)
    sys.exit(2)
