"""The agents' metrics page (rlbcommon/metrics.py) under a pile of scrapes: one collection at a
time whatever the number of scrapers, connections bounded, and no scrape answered from a
collection that started before it came."""
from __future__ import annotations

import socket
import struct
import threading
import time
import urllib.error
import urllib.request

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import CollectorRegistry

from rlbcommon import metrics


class Slow:
    """A collector that takes `seconds` and reports the value it read when it began."""

    def __init__(self, seconds: float):
        self.seconds = seconds
        self.value = 0
        self.running = self.most = self.calls = 0
        self.lock = threading.Lock()
        self.fail = False

    def collect(self):
        with self.lock:
            self.calls += 1
            self.running += 1
            self.most = max(self.most, self.running)
        value = self.value
        time.sleep(self.seconds)
        with self.lock:
            self.running -= 1
        if self.fail:
            raise RuntimeError("the maps went away")
        g = GaugeMetricFamily("rlb_test_value", "what the collector read when it began")
        g.add_metric([], value)
        yield g


def serve(collector) -> str:
    registry = CollectorRegistry()
    registry.register(collector)
    server = metrics.start(registry, 0)
    return f"http://127.0.0.1:{server.server_address[1]}"


def scrape(url: str, path: str = "/metrics", accept: str | None = None) -> tuple[int, str, str]:
    req = urllib.request.Request(url + path, headers={"Accept": accept} if accept else {})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, r.headers.get("Content-Type"), r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.headers.get("Content-Type"), e.read().decode()


def value(page: str) -> float:
    return next(float(ln.split()[1]) for ln in page.splitlines() if ln.startswith("rlb_test_value "))


def test_a_pile_of_scrapes_costs_one_collection_at_a_time_and_no_more_threads_than_the_bound():
    """Twelve scrapers at once against a 0.4 s collection (prometheus_client's own server ran
    twelve collections at once, one thread each): at most SCRAPES_AT_ONCE are served, the rest
    refused at once (503), and the served ones share collections, one running at a time."""
    c = Slow(0.4)
    url = serve(c)
    results = []
    threads = [threading.Thread(target=lambda: results.append(scrape(url))) for _ in range(12)]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    took = time.monotonic() - t0
    codes = sorted(code for code, _, _ in results)
    served = codes.count(200)
    assert c.most == 1, c.most
    assert 1 <= served <= metrics.SCRAPES_AT_ONCE and codes.count(503) == 12 - served, codes
    assert c.calls <= 2, c.calls               # the first scraper's, and one shared by the rest
    assert took < 0.4 * 3, took
    assert all(value(page) == 0 for code, _, page in results if code == 200)


def test_a_scrape_never_takes_a_collection_that_began_before_it_came():
    """A test bumps a counter, then scrapes while a slower scrape's collection is under way: it
    must see the bump (sharing the running collection would answer the value from before)."""
    c = Slow(0.5)
    url = serve(c)
    first = []
    t = threading.Thread(target=lambda: first.append(scrape(url)))
    t.start()
    deadline = time.monotonic() + 5
    while not c.running and time.monotonic() < deadline:
        time.sleep(0.01)
    assert c.running == 1
    c.value = 7
    code, _, page = scrape(url)
    t.join()
    assert code == 200 and value(page) == 7
    assert first[0][0] == 200 and value(first[0][2]) == 0
    assert c.calls == 2 and c.most == 1


def test_the_page_speaks_what_the_scraper_asks_and_says_what_failed():
    c = Slow(0.0)
    url = serve(c)
    code, ctype, page = scrape(url, accept="application/openmetrics-text; version=1.0.0")
    assert code == 200 and ctype.startswith("application/openmetrics-text") and page.endswith("# EOF\n")
    code, ctype, page = scrape(url)
    assert code == 200 and ctype.startswith("text/plain") and value(page) == 0
    assert scrape(url, "/anything")[0] == 404
    c.fail = True
    code, _, page = scrape(url)
    assert code == 500 and "the maps went away" in page
    c.fail, c.value = False, 3
    assert value(scrape(url)[2]) == 3                # and it goes on serving


def test_an_idle_connection_is_closed_and_gives_its_slot_back(monkeypatch):
    """SCRAPES_AT_ONCE silent connections hold every slot only until their idle timeout."""
    monkeypatch.setattr(metrics._Scrape, "timeout", 0.5)
    c = Slow(0.0)
    url = serve(c)
    port = int(url.rsplit(":", 1)[1])
    idle = [socket.create_connection(("127.0.0.1", port)) for _ in range(metrics.SCRAPES_AT_ONCE)]
    time.sleep(0.2)
    assert scrape(url)[0] == 503
    time.sleep(1.0)
    assert scrape(url)[0] == 200
    for s in idle:
        s.close()


def test_a_scraper_that_gives_up_mid_collection_is_no_traceback_and_the_page_serves_on(capfd):
    """Prometheus closes a scrape at its timeout; the page, finished later, meets a reset
    connection: one debug line, not a traceback on the agent's stderr (ten of them in a VM lab
    journal), and the next scrape is served."""
    c = Slow(0.5)
    url = serve(c)
    port = int(url.rsplit(":", 1)[1])
    s = socket.create_connection(("127.0.0.1", port))
    s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
    time.sleep(0.1)                                   # the collection has begun
    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    s.close()                                         # reset, as a scraper's timeout does
    time.sleep(0.8)                                   # the page was written into the reset socket
    status, _, page = scrape(url)
    assert status == 200 and value(page) == 0
    assert c.calls == 2
    err = capfd.readouterr().err
    assert "Traceback" not in err and "Exception occurred" not in err, err
