"""The demo's picture: per-uplink load of the source leaf, kernel ECMP next to RLB."""
from __future__ import annotations

from pathlib import Path


def load_chart(results: dict[str, dict], path: Path, title: str) -> Path:
    """results: {"kernel ECMP, 4 QPs": {"links": {spine: bytes}, "max_mean": x}, ...}"""
    import matplotlib
    matplotlib.use("Agg")              # files only, no display
    import matplotlib.pyplot as plt

    sizes = sorted({int(k.split(", ")[1].split()[0]) for k in results})
    fig, axes = plt.subplots(1, len(sizes), figsize=(5 * len(sizes), 3.8), sharey=False)
    axes = axes if len(sizes) > 1 else [axes]
    for ax, n in zip(axes, sizes):
        base, rlb = results[f"kernel ECMP, {n} QPs"], results[f"RLB, {n} QPs"]
        links = list(base["links"])
        x = range(len(links))
        ax.bar([i - 0.2 for i in x], [base["links"][k] / 1000 for k in links], width=0.4,
               label=f"kernel ECMP (max/mean {base['max_mean']:.2f})", color="#c0504d")
        ax.bar([i + 0.2 for i in x], [rlb["links"][k] / 1000 for k in links], width=0.4,
               label=f"RLB (max/mean {rlb['max_mean']:.2f})", color="#4f81bd")
        ax.set_xticks(list(x), [f"to {k}" for k in links])
        ax.set_ylabel("kB on the uplink")
        ax.set_title(f"{n} QPs, h1 -> h3")
        ax.legend(fontsize=8, loc="upper left")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
