"""Draw the Grafana dashboard's panels with matplotlib, from the same PromQL, straight from Prometheus.

For a picture of a run where no Grafana runs (the docs' figure, CI, a paper appendix):

    python monitoring/render_panels.py --prometheus http://127.0.0.1:9090 --minutes 10 --out panels.png

Each panel's queries run as range queries with Grafana's variables filled in ($run, $actor,
$__rate_interval). Time series are lines; heatmap panels are per-interval bucket counts. The
repeated actor row is drawn once, with one line per actor. Needs matplotlib.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import dashboard  # noqa: E402


def fill(expr: str, run: str, rate_interval: str) -> str:
    return (expr.replace("$__rate_interval", rate_interval).replace('"$run"', json.dumps(run))
            .replace('"$actor"', '".*"'))


def query_range(url: str, expr: str, start: float, end: float, step: float) -> list[dict]:
    params = urllib.parse.urlencode({"query": expr, "start": start, "end": end, "step": step})
    with urllib.request.urlopen(f"{url}/api/v1/query_range?{params}", timeout=30) as r:
        body = json.loads(r.read())
    if body["status"] != "success":
        raise RuntimeError(f"{expr}: {body.get('error')}")
    return body["data"]["result"]


def legend(fmt: str, labels: dict) -> str:
    return re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: labels.get(m.group(1), ""), fmt) or json.dumps(labels)


def draw_lines(ax, panel: dict, series: list[tuple[dict, list[dict]]], t0: float) -> None:
    for target, results in series:
        for r in results:
            xs = [float(t) - t0 for t, _ in r["values"]]
            ys = [float(v) for _, v in r["values"]]
            ax.plot(xs, ys, label=legend(target.get("legendFormat", ""), r["metric"]), linewidth=1.2)
    custom = panel.get("fieldConfig", {}).get("defaults", {}).get("custom", {})
    if custom.get("scaleDistribution", {}).get("type") == "log":
        ax.set_yscale("symlog", linthresh=0.1)
    if ax.lines:
        ax.legend(fontsize=6, loc="best")


def draw_heatmap(ax, results: list[dict], t0: float) -> None:
    rows = sorted(results, key=lambda r: float(r["metric"]["le"]))
    if not rows:
        return
    les = [float(r["metric"]["le"]) for r in rows]
    times = [float(t) - t0 for t, _ in rows[0]["values"]]
    cumulative = [[float(v) for _, v in r["values"]][: len(times)] for r in rows]
    grid = [[c - (cumulative[i - 1][j] if i else 0.0) for j, c in enumerate(row)] for i, row in enumerate(cumulative)]
    labels = ["+Inf" if math.isinf(le) else f"≤{le:g}" for le in les]
    ax.imshow(grid, aspect="auto", origin="lower", cmap="Blues", interpolation="nearest",
              extent=(times[0], times[-1], -0.5, len(les) - 0.5))
    ax.set_yticks(range(len(les)), labels, fontsize=6)


def render(url: str, start: float, end: float, out: Path, run: str = ".*", step: float | None = None,
           scrape_interval_s: float = 5.0) -> int:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    step = step or max(1.0, (end - start) / 300)
    rate_interval = f"{int(max(4 * scrape_interval_s, step + scrape_interval_s))}s"  # Grafana's $__rate_interval
    panels = [p for p in dashboard.build()["panels"] if p["type"] != "row"]
    cols = 4
    rows = math.ceil(len(panels) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5 * cols, 3.2 * rows), squeeze=False)
    drawn = 0
    for ax, panel in zip(axes.flat, panels):
        series = [(t, query_range(url, fill(t["expr"], run, rate_interval), start, end, step))
                  for t in panel["targets"]]
        ax.set_title(panel["title"].replace("$actor", "all actors"), fontsize=9)
        ax.tick_params(labelsize=7)
        ax.set_xlabel("seconds", fontsize=7)
        if panel["type"] == "heatmap":
            draw_heatmap(ax, series[0][1], start)
        else:
            draw_lines(ax, panel, series, start)
        drawn += any(results for _, results in series)
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    fig.suptitle(f"streamrl dashboard panels, rendered from Prometheus with matplotlib (run {run})", fontsize=12)
    fig.tight_layout(rect=(0, 0, 1, 0.98))
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=80)
    plt.close(fig)
    return drawn


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--prometheus", default="http://127.0.0.1:9090")
    p.add_argument("--minutes", type=float, default=15, help="window ending now (ignored with --start)")
    p.add_argument("--start", type=float, help="unix time the window starts")
    p.add_argument("--end", type=float, help="unix time the window ends (default: now)")
    p.add_argument("--run", default=".*", help="run name (a regex, as the $run variable)")
    p.add_argument("--scrape-interval", type=float, default=5.0, help="Prometheus scrape interval in seconds")
    p.add_argument("--out", type=Path, default=Path("dashboard-panels.png"))
    a = p.parse_args()
    end = a.end or time.time()
    start = a.start or end - 60 * a.minutes
    drawn = render(a.prometheus, start, end, a.out, a.run, scrape_interval_s=a.scrape_interval)
    print(f"wrote {a.out}: {drawn} panels with data")
    return 0


if __name__ == "__main__":
    sys.exit(main())
