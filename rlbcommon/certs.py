"""When the certificates an agent speaks to etcd with expire. An agent given --etcd-ca and
--etcd-cert notes them here; every agent's /metrics then carries
rlb_etcd_cert_expiry_timestamp_seconds per file, and RlbEtcdCertExpiring (rlbmonitor/alerts.py)
fires weeks before etcd would refuse the handshake and the machine's reports with it
(`rlbfabric etcd-tls` issues them for 825 days; renew by issuing again)."""
from __future__ import annotations

import ssl
import tempfile
import threading
from pathlib import Path

from prometheus_client.core import GaugeMetricFamily

_lock = threading.Lock()
_in_use: dict[str, Path] = {}                 # what the file is ("ca", "client") -> its path
_read: dict[Path, tuple] = {}                 # path -> ((mtime, size), expiry or None)
PEM_CERT = "-----BEGIN CERTIFICATE-----"


def note(what: str, path: Path | None):
    """An etcd TLS file this process uses (None: none)."""
    if path is not None:
        with _lock:
            _in_use[what] = Path(path)


def expiry(path: Path) -> float | None:
    """When the earliest certificate in a PEM file expires (UNIX time); None when it cannot be
    read. Read again only when the file changed (a renewal)."""
    try:
        st = path.stat()
    except OSError:
        return None
    stamp = (st.st_mtime_ns, st.st_size)
    got = _read.get(path)
    if got is not None and got[0] == stamp:
        return got[1]
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError):
        return None
    times = []
    for block in text.split(PEM_CERT)[1:]:   # a CA file may hold several; a client's, its key after
        pem = PEM_CERT + block.split("-----END CERTIFICATE-----")[0] + "-----END CERTIFICATE-----\n"
        times.append(_not_after(pem))
    out = min((t for t in times if t is not None), default=None)
    _read[path] = (stamp, out)
    return out


def _not_after(pem: str) -> float | None:
    """The certificate's notAfter, by the ssl module's own decoder (it reads a file)."""
    with tempfile.NamedTemporaryFile("w", suffix=".pem") as f:
        f.write(pem)
        f.flush()
        try:
            decoded = ssl._ssl._test_decode_cert(f.name)          # noqa: SLF001 - CPython's decoder
            return float(ssl.cert_time_to_seconds(decoded["notAfter"]))
        except (ssl.SSLError, ValueError, KeyError, AttributeError):
            return None


class CertCollector:
    """The expiry of each etcd TLS file this process noted."""

    def collect(self):
        with _lock:
            files = dict(_in_use)
        if not files:
            return
        g = GaugeMetricFamily("rlb_etcd_cert_expiry_timestamp_seconds", "when the earliest certificate of "
                              "this etcd TLS file expires (UNIX time; absent: unreadable)", labels=["file", "path"])
        for what, path in sorted(files.items()):
            t = expiry(path)
            if t is not None:
                g.add_metric([what, str(path)], t)
        yield g
