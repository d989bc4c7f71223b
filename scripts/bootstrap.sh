#!/usr/bin/env bash
# Installs everything RLB needs on a fresh Debian 12 machine (run as root). Idempotent:
# each step checks first, so `make demo` / `make test` can call it every time cheaply.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${RLB_VENV:-.venv}
APT_PKGS=(python3-bpfcc python3-venv linux-headers-amd64 bird2 ethtool iproute2 libbpf1 kmod
          gcc libc6-dev libibverbs-dev    # these three: the verbs library (librlbverbs.so)
          openssl                         # rlbfabric etcd-tls: the etcd certificates
          iptables)                       # the labs' loss injection (ip6tables: rlblab/topo.py)
# without recommends: Prometheus for the dashboard tests (no exporters), etcd for the coordinator's
# shared state (the labs start their own members), FRR for spines of another make (the labs start
# their own daemons in a spine's namespace)
APT_LEAN=(prometheus etcd-server frr)

log() { echo "[bootstrap] $*"; }

[ "$(id -u)" = 0 ] || { echo "bootstrap: must run as root (XDP, TC and network namespaces need it)" >&2; exit 1; }

missing=()
for p in "${APT_PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
lean=()
for p in "${APT_LEAN[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || lean+=("$p")
done
if [ ${#missing[@]} -gt 0 ] || [ ${#lean[@]} -gt 0 ]; then
  log "installing apt packages: ${missing[*]} ${lean[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  [ ${#missing[@]} -eq 0 ] || apt-get install -y -qq "${missing[@]}" >/dev/null
  [ ${#lean[@]} -eq 0 ] || apt-get install -y -qq --no-install-recommends "${lean[@]}" >/dev/null
  # Debian starts the packaged etcd at once (an empty member on localhost:2379): the labs run
  # their own, and an operator's cluster is configured on purpose, so that one is stopped
  if [[ " ${lean[*]} " == *" etcd-server "* ]] && [ -d /run/systemd/system ]; then
    systemctl disable --now etcd >/dev/null 2>&1 || true
    log "etcd-server installed; its default service disabled (the labs start their own)"
  fi
  if [[ " ${lean[*]} " == *" frr "* ]] && [ -d /run/systemd/system ]; then
    systemctl disable --now frr >/dev/null 2>&1 || true
    log "frr installed; its default service disabled (the labs start their own)"
  fi
fi

# bcc compiles against the running kernel's headers. Debian has none for this kernel, so fall
# back to Debian's packaged headers (the BPF UAPI we use is stable across these versions).
mod=/lib/modules/$(uname -r)
if [ ! -e "$mod/build" ]; then
  hdr=$(ls -d /usr/src/linux-headers-*-amd64 2>/dev/null | sort -V | tail -1)
  common=$(ls -d /usr/src/linux-headers-*-common 2>/dev/null | sort -V | tail -1)
  [ -n "$hdr" ] && [ -n "$common" ] || { echo "bootstrap: no kernel headers under /usr/src" >&2; exit 1; }
  log "linking $mod/build -> $hdr and source -> $common"
  mkdir -p "$mod"
  ln -sfn "$hdr" "$mod/build"
  ln -sfn "$common" "$mod/source"
fi

# Pinned maps live in bpffs; agents enter namespaces with setns() so they all share this one.
if ! mount | grep -q ' /sys/fs/bpf type bpf'; then
  log "mounting bpffs at /sys/fs/bpf"
  mkdir -p /sys/fs/bpf
  mount -t bpf bpf /sys/fs/bpf
fi

# bcc is Debian's and imports only from the system python: the venv must see system site-packages.
if [ ! -x "$VENV/bin/python" ]; then
  log "creating venv $VENV"
  /usr/bin/python3 -m venv --system-site-packages "$VENV"
fi
stamp="$VENV/.installed-$(sha1sum pyproject.toml | cut -c1-12)"
if [ ! -e "$stamp" ]; then
  log "installing the package and its dependencies into $VENV"
  "$VENV/bin/pip" install -q --upgrade pip >/dev/null
  "$VENV/bin/pip" install -q -e '.[test,lab]'
  rm -f "$VENV"/.installed-*; touch "$stamp"
fi
"$VENV/bin/python" -c 'import bcc, pyroute2, typer, prometheus_client' \
  || { echo "bootstrap: dependency check failed" >&2; exit 1; }

# The verbs library, built where it runs as the BPF programs are (rebuilt when its source changes)
vstamp="build/verbs/.built-$(cat verbs/*.c verbs/*.h rlbhost/verbs/build.py | sha1sum | cut -c1-12)"
if [ ! -e "$vstamp" ]; then
  log "building the verbs library into build/verbs"
  "$VENV/bin/python" -m rlbhost.verbs.build --strict build/verbs
  rm -f build/verbs/.built-*; touch "$vstamp"
fi
log "ready"
