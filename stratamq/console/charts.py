"""The Charts page's data: the console samples the broker's admin RPCs on a timer and keeps
the last hour, so no Prometheus server is needed; ``svg_chart`` draws a series server-side.

Each sample: messages stored (ListTopics' per-topic counts), bytes stored (the CommitLog's
max offset, BrokerStatus), messages consumed (the groups' committed offsets, GroupProgress)
and the groups' total lag. Rates are differences of successive samples; a count that fell
(retention removed messages, a topic was deleted) counts as no traffic rather than negative.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from html import escape

from stratamq.console.broker_api import AdminError, ConsoleBroker

log = logging.getLogger(__name__)

WINDOW_S = 3600
MAX_GROUPS_SAMPLED = 200  # GroupProgress calls per sample: a bound on the console's load


class Sampler:
    def __init__(self, broker: ConsoleBroker, interval_s: float = 15.0) -> None:
        self.broker = broker
        self.interval_s = interval_s
        self.samples: deque[tuple[float, int, int, int, int]] = deque(
            maxlen=max(2, int(WINDOW_S / interval_s) + 1))
        self.last_error: str | None = None
        # Per topic, the last two samples' (time, messages stored, messages consumed).
        self._topic_samples: deque[tuple[float, dict[str, int], dict[str, int]]] = deque(
            maxlen=2)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="console-sampler", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.interval_s + 15)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(self.interval_s)

    def sample(self) -> None:
        try:
            topics = self.broker.call("ListTopics")["topics"]
            status = self.broker.call("BrokerStatus")
            groups = self.broker.call("ListGroups")["groups"][:MAX_GROUPS_SAMPLED]
            lag = 0
            consumed_by_topic: dict[str, int] = {}
            for g in groups:
                progress = self.broker.call("GroupProgress", group=g["group"])
                lag += int(progress["lag"])
                for q in progress["queues"]:
                    consumed_by_topic[q["topic"]] = (consumed_by_topic.get(q["topic"], 0)
                                                     + int(q["consumer_offset"] or 0))
        except AdminError as exc:
            self.last_error = str(exc)
            return
        now = time.time()
        stored_by_topic = {t["topic"]: int(t["messages"]) for t in topics}
        self._topic_samples.append((now, stored_by_topic, consumed_by_topic))
        self.samples.append((now, sum(stored_by_topic.values()),
                             int(status["commitlog"]["max_offset"]),
                             sum(consumed_by_topic.values()), lag))
        self.last_error = None

    def topic_rates(self) -> dict[str, tuple[float, float]]:
        """Per topic, (messages in/s, messages consumed/s) between the last two samples."""
        if len(self._topic_samples) < 2:
            return {}
        (t0, stored0, done0), (t1, stored1, done1) = self._topic_samples
        span = t1 - t0 or 1.0
        return {name: (max(0, stored1[name] - stored0.get(name, 0)) / span,
                       max(0, done1.get(name, 0) - done0.get(name, 0)) / span)
                for name in stored1}

    def series(self) -> list[tuple[str, str, list[tuple[float, float]]]]:
        """(title, unit, [(time, value)]) per chart."""
        rows = list(self.samples)
        rates: list[list[tuple[float, float]]] = [[], [], []]
        for before, after in zip(rows, rows[1:], strict=False):
            span = after[0] - before[0] or 1.0
            for i in range(3):
                rates[i].append((after[0], max(0, after[i + 1] - before[i + 1]) / span))
        return [("Messages in", "msg/s", rates[0]), ("Bytes in", "B/s", rates[1]),
                ("Messages out (committed)", "msg/s", rates[2]),
                ("Consumer lag (all groups)", "messages", [(r[0], float(r[4])) for r in rows])]


def svg_chart(points: list[tuple[float, float]], unit: str, width: int = 640,
              height: int = 160) -> str:
    """A line chart as inline SVG (escaped text only; no script)."""
    pad = 40
    if not points:
        return (f'<svg class="chart" width="{width}" height="{height}" role="img">'
                f'<text x="{pad}" y="{height // 2}">no samples yet</text></svg>')
    t0, t1 = points[0][0], max(points[-1][0], points[0][0] + 1)
    top = max(v for _, v in points) or 1.0

    def xy(t: float, v: float) -> str:
        x = pad + (t - t0) / (t1 - t0) * (width - 2 * pad)
        y = height - pad / 2 - v / top * (height - pad)
        return f"{x:.1f},{y:.1f}"

    line = " ".join(xy(t, v) for t, v in points)
    last = points[-1][1]
    return (f'<svg class="chart" width="{width}" height="{height}" role="img">'
            f'<polyline fill="none" stroke="#2a6ebb" stroke-width="2" points="{line}"/>'
            f'<text x="4" y="14">{top:.1f} {escape(unit)} max</text>'
            f'<text x="{width - pad * 4}" y="14">now {last:.1f} {escape(unit)}</text>'
            f'<line x1="{pad}" y1="{height - pad / 2}" x2="{width - pad}" '
            f'y2="{height - pad / 2}" stroke="#999"/></svg>')


