"""The dashboard's series from a real run, as a chart (docs/metrics.png): `fedload demo --keep`, then a
`fedload daemon` with metrics on, scraped every 2 s over its /metrics for a while, then plotted per feeder: the
age of its data, its run time, the rows it loads per second and its swaps' lock waits, as
deploy/grafana-dashboard.json shows them.

    uv run --group bench python tools/metrics_chart.py [--seconds 120] [--out docs/metrics.png]
"""

from __future__ import annotations

import argparse
import itertools
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections import defaultdict
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

FEDLOAD = [sys.executable, "-m", "fedload"]
Series = dict[str, list[tuple[float, float]]]  # feeder -> (seconds since start, value)
Scrape = dict[tuple[str, str], float]  # (sample name, feeder) -> value; ("time", "") -> the scrape's Unix time


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=120.0)
    parser.add_argument("--interval-s", type=float, default=10.0, help="each feeder's interval_s")
    parser.add_argument("--out", type=Path, default=Path("docs/metrics.png"))
    args = parser.parse_args()
    directory = _demo_kept()
    try:
        port = _free_port()
        config = _with_metrics(directory / "fedload.toml", port, args.interval_s)
        scrapes = _scrape_daemon(config, port, args.seconds)
    finally:
        subprocess.run([*FEDLOAD, "demo", "--stop", str(directory)], check=False, timeout=120)
    _plot(scrapes, args.out)
    print(f"{len(scrapes)} scrapes over {args.seconds:g} s -> {args.out}")
    return 0


def _demo_kept() -> Path:
    done = subprocess.run([*FEDLOAD, "demo", "--keep"], capture_output=True, text=True, check=True, timeout=300)
    found = re.search(r"Kept running in (\S+?)\.", done.stdout)
    assert found, done.stdout[-2000:]
    return Path(found[1])


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def _with_metrics(config: Path, port: int, interval_s: float) -> Path:
    text = config.read_text()
    text = re.sub(r"^(\[feeders\.\w+\])$", rf"\1\ninterval_s = {interval_s}", text, flags=re.MULTILINE)
    text += f'\n[daemon]\nmetrics_listen = "127.0.0.1:{port}"\n'
    config.write_text(text)
    return config


def _scrape_daemon(config: Path, port: int, seconds: float) -> list[tuple[float, Scrape]]:
    daemon = subprocess.Popen([*FEDLOAD, "daemon", "--config", str(config)], stderr=subprocess.DEVNULL)
    started, scrapes = time.monotonic(), []
    try:
        while (now := time.monotonic() - started) < seconds:
            time.sleep(2.0)
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
                    scrapes.append((now, {**_samples(response.read().decode()), ("time", ""): time.time()}))
            except OSError:
                continue  # not serving yet
    finally:
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(timeout=90)
    return scrapes


def _samples(text: str) -> Scrape:
    samples: Scrape = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = sample.labels
            if (
                "feeder" in labels
                and set(labels) <= {"feeder", "outcome"}
                and labels.get("outcome") in (None, "success")
            ):
                samples[sample.name, labels["feeder"]] = sample.value
    return samples


def _series(scrapes: list[tuple[float, Scrape]]) -> dict[str, Series]:
    """Per panel, per feeder: data age, run time and swap wait of each new run, rows/s between scrapes."""
    panels: dict[str, Series] = {p: defaultdict(list) for p in ("age", "run", "rows", "swap")}
    for (t0, before), (t1, after) in itertools.pairwise(scrapes):
        wall = after["time", ""]
        for feeder in sorted({f for _, f in after if f}):
            last = after.get(("fedload_feeder_last_success_timestamp_seconds", feeder))
            if last is not None:
                panels["age"][feeder].append((t1, max(0.0, wall - last)))
            rows_key = ("fedload_rows_loaded_total", feeder)
            rows = after.get(rows_key, 0) - before.get(rows_key, 0)
            panels["rows"][feeder].append((t1, rows / (t1 - t0)))
            for panel, metric in (("run", "fedload_run_duration_seconds"), ("swap", "fedload_swap_lock_wait_seconds")):
                count = after.get((f"{metric}_count", feeder), 0) - before.get((f"{metric}_count", feeder), 0)
                total = after.get((f"{metric}_sum", feeder), 0) - before.get((f"{metric}_sum", feeder), 0)
                if count:
                    panels[panel][feeder].append((t1, total / count))
    return panels


def _plot(scrapes: list[tuple[float, Scrape]], out: Path) -> None:
    import matplotlib  # noqa: PLC0415 - only this script needs it, and the backend must be set first

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    titles = {
        "age": "data age (s): time() - fedload_feeder_last_success_timestamp_seconds",
        "run": "run time (s): fedload_run_duration_seconds, per run",
        "rows": "rows/s: rate(fedload_rows_loaded_total)",
        "swap": "swap lock wait (s): fedload_swap_lock_wait_seconds, per swap",
    }
    figure, axes = plt.subplots(2, 2, figsize=(12, 7), sharex=True)
    for axis, (panel, series) in zip(axes.flat, _series(scrapes).items(), strict=True):
        for feeder, points in sorted(series.items()):
            style = "-" if panel in ("age", "rows") else "o"
            axis.plot([t for t, _ in points], [v for _, v in points], style, label=feeder)
        axis.set_title(titles[panel], fontsize=9)
        axis.grid(alpha=0.3)
        axis.legend(fontsize=8)
    for axis in axes[1]:
        axis.set_xlabel("seconds since the daemon started")
    figure.suptitle("fedload daemon metrics, scraped from /metrics (fedload demo feeders, interval_s = 10)")
    figure.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(out, dpi=110)


if __name__ == "__main__":
    sys.exit(main())
