# Two commands for a fresh Debian 12 machine (as root). Each installs what is missing first.
.PHONY: demo test bench setup clean vagrant-deps vagrant-box vagrant-test vagrant-test-scaleup vagrant-test-verbs vagrant-test-rails

setup:
	@./scripts/bootstrap.sh

demo: setup
	.venv/bin/rlblab demo

# the layers and no circles first (pyproject.toml, [tool.importlinter]), then every test
test: setup
	.venv/bin/lint-imports
	.venv/bin/python -m pytest -v -n auto --dist loadfile --no-loadscope-reorder -m "not alone" tests
	.venv/bin/python -m pytest -v -m alone tests

# Real packets through each forwarder side by side, then test-run costs (about 6 minutes in all); each
# figure beside the ratio recorded for this CPU kind (bench/ratios.json).
bench: setup
	.venv/bin/python bench/wire_bench.py
	.venv/bin/python bench/xdp_cpus_bench.py
	.venv/bin/python bench/xdp_bench.py
	.venv/bin/python bench/route_cli.py

# The Vagrant lab (opt-in, not in CI): VMs under libvirt; about an hour each here under software emulation.
vagrant-deps:
	DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends qemu-system-x86 \
	    qemu-utils mmdebstrap grub-pc-bin vagrant vagrant-libvirt libvirt-daemon-system dnsmasq-base \
	    fdisk e2fsprogs

vagrant-box: setup vagrant-deps
	./vagrant/build-box.sh

vagrant-test: setup vagrant-deps
	RLB_VAGRANT=1 .venv/bin/python -m pytest -v -s tests/test_vagrant_lab.py

# the verbs library over Soft-RoCE: perftest and a dlopen program with LD_PRELOAD, TC off and on
vagrant-test-verbs: setup vagrant-deps
	RLB_VAGRANT=1 .venv/bin/python -m pytest -v -s tests/test_vagrant_verbs.py

# GPU servers of two NICs (lab/fabric-rails-2x2.toml, 7 VMs): perftest on rxe0 and rxe1 at once
vagrant-test-rails: setup vagrant-deps
	RLB_VAGRANT=1 .venv/bin/python -m pytest -v -s tests/test_vagrant_rails.py

# RLB_FABRIC=lab/scaleup-small.toml: 7 VMs instead of 13 (13 emulated VMs need about 4 cores)
vagrant-test-scaleup: setup vagrant-deps
	RLB_VAGRANT=1 .venv/bin/python -m pytest -v -s tests/test_vagrant_scaleup.py

clean:
	-.venv/bin/rlblab down
	rm -rf .venv
