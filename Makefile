# Two commands for a fresh Debian 12 machine (as root). Each installs what is missing first.
.PHONY: demo test bench setup clean

setup:
	@./scripts/bootstrap.sh

demo: setup
	.venv/bin/rlblab demo

test: setup
	.venv/bin/python -m pytest -v tests

bench: setup
	.venv/bin/python bench/xdp_bench.py

clean:
	-.venv/bin/rlblab down
	rm -rf .venv
