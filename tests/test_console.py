"""The web console in a real browser (Debian's chromium, driven by Playwright; no browser
download) against a live 3-node cluster: three replica bars per partition; the committed zone
grows as records are produced; after the leader is SIGKILLed the page shows the new leader and
epoch; after retention runs the deleted zone appears and the hold is named. Screenshots are kept
in test-artifacts/console/ (or $TIDELOG_ARTIFACTS/console/)."""

from __future__ import annotations

import os
import shutil
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Browser, Page, sync_playwright

from helpers import poll
from tidelog.cli.cluster import LocalCluster
from tidelog.client.sync_client import Client
from tidelog.cluster_status import merge_status

# timed: the page must redraw within seconds
pytestmark = [pytest.mark.process, pytest.mark.timed]  # tiers: pyproject.toml's markers

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
# As the machine's notes say: without the background-networking flags Chromium keeps dialing
# Google's hosts, which a closed network refuses.
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
FAST = {"retention.check.interval.ms": "100", "file.delete.delay.ms": "0"}


def artifacts() -> Path:
    root = Path(
        os.environ.get("TIDELOG_ARTIFACTS", Path(__file__).parent.parent / "test-artifacts")
    )
    out = root / "console"
    out.mkdir(parents=True, exist_ok=True)
    return out


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    assert Path(CHROMIUM).exists(), "chromium is missing: `make setup` installs Debian's chromium"
    with sync_playwright() as p:
        launched = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield launched
        finally:
            launched.close()


def replica(page: Page, partition: str, node: int | str) -> dict[str, int]:
    found = page.locator(f'[data-partition="{partition}"] .replica[data-node="{node}"]')
    return {
        key: int(found.get_attribute(f"data-{key}") or -1) for key in ("log-start", "hw", "leo")
    }


def leader_on_page(page: Page, partition: str) -> tuple[int, int]:
    section = page.locator(f'[data-partition="{partition}"]')
    leader = section.locator(".leader-id").get_attribute("data-leader")
    epoch = section.locator(".epoch").get_attribute("data-epoch")
    return int(leader or -1), int(epoch or -1)


def wait_page(page: Page, what: str, check: Any, timeout_s: float = 30.0) -> Any:
    """check()'s first truthy value; a timeout leaves a screenshot of the page."""
    value = poll(check, timeout_s)
    if not value:
        page.screenshot(path=str(artifacts() / f"timeout-{what.replace(' ', '-')}.png"))
        raise AssertionError(f"the console never showed {what}")
    return value


def cluster_row(client: Client, topic: str) -> dict[str, Any]:
    rows = merge_status(client.status([topic]), topic)
    return rows[0] if rows else {"leader": -1, "epoch": -1}


@pytest.mark.timeout(240)
def test_the_console_draws_the_three_zones_live(tmp_path: Path, browser: Browser) -> None:
    shots = artifacts()
    with (
        LocalCluster(tmp_path, nodes=3, http=True) as cluster,
        Client(cluster.bootstrap) as client,
    ):
        cluster.wait_ready()
        common = {"segment.bytes": "4096", "replica.max.lag.ms": "1000", **FAST}
        client.create_topic(
            "events", replication_factor=3, configs={"retention.bytes": "8192", **common}
        )
        client.wait_for_leaders("events")
        page = browser.new_page(viewport={"width": 1200, "height": 800})
        page.goto(cluster.http_url(1) + "/")

        # Three bars, one per replica, before anything is produced.
        wait_page(
            page,
            "three replica bars",
            lambda: page.locator('[data-partition="events/0"] .replica').count() == 3,
        )
        page.screenshot(path=str(shots / "1-empty.png"))

        # Produced and committed: the committed zone grows on every replica.
        for i in range(20):
            client.produce("events", [b"e%04d" % i + b"." * 100], partition=0)
        wait_page(
            page,
            "the committed zone grow",
            lambda: all(replica(page, "events/0", n)["hw"] >= 20 for n in cluster.node_ids),
        )
        # The page redraws every refresh: a box read while it swaps its elements is None.
        width = wait_page(
            page,
            "the committed zone drawn",
            lambda: page.locator(
                '[data-partition="events/0"] .replica.leader .zone.committed'
            ).bounding_box(),
            timeout_s=5.0,
        )
        assert width["width"] > 50, width
        page.screenshot(path=str(shots / "2-committed.png"))

        # The leader is SIGKILLed: the page shows the new leader and its epoch.
        old_leader, old_epoch = leader_on_page(page, "events/0")
        assert old_leader in cluster.node_ids
        if old_leader == 1:  # the page is served by node 1: keep it up, move the leader
            page.goto(cluster.http_url(2) + "/")
        cluster.procs[old_leader].send_signal(signal.SIGKILL)
        cluster.procs[old_leader].wait()
        known = wait_page(
            page,
            "a new leader known to the cluster",
            lambda: (r := cluster_row(client, "events"))["leader"] not in (-1, old_leader) and r,
        )
        known_at = time.monotonic()
        new_leader, new_epoch = wait_page(
            page,
            "the new leader",
            lambda: (seen := leader_on_page(page, "events/0"))[0] not in (-1, old_leader) and seen,
        )
        shown_after = time.monotonic() - known_at
        assert new_leader == known["leader"] and new_epoch > old_epoch
        print(f"console showed the new leader {shown_after * 1000:.0f} ms after status did")
        page.screenshot(path=str(shots / "3-new-leader.png"))

        # The old leader comes back; retention passes the oldest segments: the deleted zone
        # appears and the hold that sets the LWM is named.
        cluster.start(old_leader)
        cluster.wait_ready()
        for i in range(200):
            client.produce("events", [b"f%04d" % i + b"." * 200], partition=0)
        leader_bar = f'[data-partition="events/0"] .replica[data-node="{new_leader}"]'
        wait_page(
            page,
            "the deleted zone",
            lambda: replica(page, "events/0", new_leader)["log-start"] > 0,
        )
        deleted = wait_page(
            page,
            "the deleted zone drawn",
            lambda: page.locator(f"{leader_bar} .zone.deleted").bounding_box(),
            timeout_s=5.0,
        )
        assert deleted["width"] > 10, deleted
        hold = page.locator('[data-partition="events/0"] .hold').inner_text()
        assert "low-water mark" in hold and "set by" in hold, hold
        assert "retention" in hold or "replica" in hold, hold
        page.screenshot(path=str(shots / "4-deleted.png"), full_page=True)
        page.close()
