"""rlblab: namespace lab and demo."""
import sys


def main():
    from .demo import main as demo_main
    sys.exit(demo_main())
