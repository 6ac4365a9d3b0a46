"""A synthetic clickstream for `tidelog demo`: page views at a steady rate, as an idempotent
producer (a batch retried across a leader change lands once), counting what it got acknowledged
so the demo can check Spark's output against it.

Event time runs `speedup` times faster than the wall clock so that a short demo spans several
one-minute windows."""

from __future__ import annotations

import json
import random
import threading
import time
import zlib
from collections import Counter
from datetime import UTC, datetime

from tidelog.client.sync_client import Client
from tidelog.errors import TidelogError
from tidelog.record.batch import ProducerRecord, build_batch
from tidelog.spark.page_counts import WATERMARK_PAGE  # closes every window at the end

PAGES = [f"/page/{i}" for i in range(12)]
WEIGHTS = [1 / (i + 1) for i in range(len(PAGES))]  # a few pages get most views


def window_key(page: str, ts_ms: int) -> str:
    """The key Spark's job writes: page and the start of its one-minute window (UTC)."""
    start = datetime.fromtimestamp(ts_ms // 60_000 * 60, UTC)
    return f"{page}|{start:%Y-%m-%dT%H:%M}"


class Clickstream(threading.Thread):
    def __init__(
        self,
        bootstrap: str,
        topic: str,
        partitions: int,
        rate: int,
        duration_s: float,
        speedup: float = 4.0,
        seed: int = 7,
    ) -> None:
        super().__init__(name="clickstream", daemon=True)
        self.client = Client(bootstrap)
        self.topic = topic
        self.partitions = partitions
        self.rate = rate
        self.duration_s = duration_s
        self.speedup = speedup
        self.random = random.Random(seed)
        self.producer_id = self.random.getrandbits(48)
        self.sequences = [0] * partitions
        self.counts: Counter[str] = Counter()  # window_key -> acknowledged views
        self.produced = 0
        self.retries = 0
        self.last_event_ms = 0
        self.error: BaseException | None = None
        self._halt = threading.Event()
        self._epoch_ms = int(time.time() * 1000)

    def event_time_ms(self, elapsed_s: float) -> int:
        return self._epoch_ms + int(elapsed_s * self.speedup * 1000)

    def stop(self) -> None:
        self._halt.set()

    def run(self) -> None:
        try:
            self._run()
        except BaseException as exc:
            self.error = exc

    def _run(self) -> None:
        tick_s = 0.1
        started = time.monotonic()
        sent = 0
        while not self._halt.is_set():
            elapsed = time.monotonic() - started
            if elapsed >= self.duration_s:
                break
            due = int(elapsed * self.rate) - sent
            if due > 0:
                self._send(self._events(due, elapsed))
                sent += due
            time.sleep(tick_s)
        # One event per partition far enough ahead to close every window (Spark's append mode
        # emits a window only once the watermark has passed its end).
        ahead = self.event_time_ms(time.monotonic() - started) + 10 * 60_000
        self._send(
            [
                (p, ProducerRecord(None, self._value(WATERMARK_PAGE, "-", ahead), (), ahead))
                for p in range(self.partitions)
            ],
            count=False,
        )

    def _value(self, page: str, user: str, ts: int) -> bytes:
        return json.dumps({"page": page, "user": user, "ts": ts}).encode()

    def _events(self, n: int, elapsed: float) -> list[tuple[int, ProducerRecord]]:
        now = self.event_time_ms(elapsed)
        out = []
        for _ in range(n):
            page = self.random.choices(PAGES, WEIGHTS)[0]
            user = f"user-{self.random.randrange(500)}"
            ts = now - self.random.randrange(2000)  # slightly out of order, as clicks are
            key = user.encode()
            out.append(
                (
                    zlib.crc32(key) % self.partitions,
                    ProducerRecord(key, self._value(page, user, ts), (), ts),
                )
            )
        return out

    def _send(self, events: list[tuple[int, ProducerRecord]], count: bool = True) -> None:
        by_partition: dict[int, list[ProducerRecord]] = {}
        for partition, record in events:
            by_partition.setdefault(partition, []).append(record)
        for partition, records in sorted(by_partition.items()):
            batch = build_batch(
                records,
                producer_id=self.producer_id,
                producer_epoch=0,
                base_sequence=self.sequences[partition],
            )
            while True:
                try:
                    self.client.produce_batch(self.topic, partition, batch, acks="all")
                    break
                except TidelogError:
                    # The same bytes again: if the first attempt did land, the log drops this one.
                    self.retries += 1
                    if self._halt.is_set():
                        raise
                    time.sleep(0.2)
            self.sequences[partition] += len(records)
            if count:
                for record in records:
                    event = json.loads(record.value or b"{}")
                    self.counts[window_key(event["page"], event["ts"])] += 1
                self.produced += len(records)
                self.last_event_ms = max(self.last_event_ms, *(r.timestamp or 0 for r in records))
