"""The deployment files in deploy/ (docs/operations.md, "Running a cluster on several hosts")
are what they claim: the systemd unit passes `systemd-analyze verify` and runs a command line
`tidelog serve` takes, each node's TOML file is accepted by the node's own config loader, every
key a known setting, the three nodes agreeing on what they must share, and the firewall table
passes `nft -c`. The docs show the files as they are."""

from __future__ import annotations

import re
import secrets
import shlex
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest

from tidelog.cli.main import build_parser, cmd_serve
from tidelog.devcerts import make_dev_certs
from tidelog.node.access import Authorization
from tidelog.node.config import KNOWN_SETTINGS, load_toml, node_config_from
from tidelog.storage.descriptors import DEFAULT_CAPACITY, capacity_for

ROOT = Path(__file__).resolve().parent.parent
UNIT = ROOT / "deploy" / "systemd" / "tidelog.service"
NODE_CONFIGS = [ROOT / "deploy" / "config" / f"node{n}.toml" for n in (1, 2, 3)]
FIREWALL = ROOT / "deploy" / "nftables" / "tidelog.nft"
OPERATIONS = ROOT / "docs" / "operations.md"
INSTALLED_TIDELOG = "/opt/tidelog/bin/tidelog"  # where the unit expects the package's script
CONFIG_PATH = "/etc/tidelog/tidelog.toml"
# The settings that name files on the hosts: the test gives them real files of its own.
FILE_SETTINGS = (
    "data",
    "cluster_secret_file",
    "admin_token_file",
    "tls_ca",
    "tls_cert",
    "tls_key",
)


def unit_entries(text: str) -> dict[str, list[str]]:
    """KEY -> its values, over every section (a key may be given more than once)."""
    entries: dict[str, list[str]] = {}
    for line in text.splitlines():
        if line and not line.startswith(("#", "[")) and "=" in line:
            key, _, value = line.partition("=")
            entries.setdefault(key.strip(), []).append(value.strip())
    return entries


def verify_problems(unit_text: str, tmp_path: Path) -> list[str]:
    """What `systemd-analyze verify` says about the unit, with ExecStart pointed at this
    environment's tidelog script: verify refuses a command that is not there, and the unit names
    where the package is installed on a host. Unknown keys are only warned about (exit status
    0), so any line naming the unit counts."""
    here = Path(sys.executable).parent / "tidelog"
    assert here.is_file(), f"no tidelog script next to {sys.executable}: install the package"
    assert unit_text.count(INSTALLED_TIDELOG) == 1, f"ExecStart no longer runs {INSTALLED_TIDELOG}"
    tmp_path.mkdir(parents=True, exist_ok=True)
    path = tmp_path / UNIT.name
    path.write_text(unit_text.replace(INSTALLED_TIDELOG, str(here)))
    done = subprocess.run(
        ["systemd-analyze", "verify", "--man=no", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    said = [line for line in (done.stdout + done.stderr).splitlines() if UNIT.name in line]
    if done.returncode != 0:
        said.append(f"exit status {done.returncode}: {done.stderr.strip()}")
    return said


# systemd-analyze and nft are processes (a fraction of a second each): the process tier, as
# conftest.py holds every test that starts one; the rest of this file stays in process.
@pytest.mark.process
@pytest.mark.skipif(
    shutil.which("systemd-analyze") is None,
    reason="systemd-analyze is not installed here (it comes with systemd)",
)
def test_the_systemd_unit_passes_systemd_analyze_verify(tmp_path: Path) -> None:
    unit_text = UNIT.read_text()
    assert verify_problems(unit_text, tmp_path) == []
    # The check above would see a mistake: an unknown key is named.
    misspelt = unit_text.replace("Restart=on-failure", "Restart=on-failure\nRestrat=always")
    assert any("Restrat" in line for line in verify_problems(misspelt, tmp_path / "misspelt"))


def test_the_unit_runs_a_command_line_serve_takes() -> None:
    entries = unit_entries(UNIT.read_text())
    (exec_start,) = entries["ExecStart"]
    program, *argv = shlex.split(exec_start)
    assert program == INSTALLED_TIDELOG
    args = build_parser().parse_args(argv)
    assert args.func is cmd_serve
    assert str(args.config) == CONFIG_PATH
    assert args.log_format == "json"
    assert entries["User"] == ["tidelog"]
    assert entries["ProtectSystem"] == ["strict"]
    # What the node writes is its data directory: the one every node's config names.
    writable = " ".join(entries["ReadWritePaths"]).split()
    for path in NODE_CONFIGS:
        assert load_toml(path)["data"] in writable, path.name
    # With the unit's limit the segment-file cache is at its full size (storage/descriptors.py).
    (nofile,) = entries["LimitNOFILE"]
    assert capacity_for(int(nofile)) == DEFAULT_CAPACITY


def with_real_files(values: dict[str, Any], host: str, tmp_path: Path) -> dict[str, Any]:
    """The node's settings with the files they name made here, for real: a secret and a
    token file of the modes the docs give, and TLS files signed by a CA of this test's."""
    tls = tmp_path / "tls"
    make_dev_certs(tls, [host], [])
    secret = tmp_path / "cluster.secret"
    secret.write_text(secrets.token_hex(32) + "\n")
    token = tmp_path / "admin.token"
    token.write_text(f"root:{secrets.token_hex(24)}\n")
    for made in (secret, token):
        made.chmod(0o600)
    here = {
        "data": str(tmp_path / "data"),
        "cluster_secret_file": str(secret),
        "admin_token_file": str(token),
        "tls_ca": str(tls / "ca.pem"),
        "tls_cert": str(tls / "node.pem"),
        "tls_key": str(tls / "node.key"),
    }
    assert set(here) == set(FILE_SETTINGS)
    return {**values, **here}


@pytest.mark.parametrize("n", [1, 2, 3])
def test_each_node_config_is_accepted_by_the_node_config_loader(n: int, tmp_path: Path) -> None:
    values = load_toml(NODE_CONFIGS[n - 1])
    assert set(values) <= KNOWN_SETTINGS, set(values) - KNOWN_SETTINGS
    host = f"node{n}.tidelog.internal"
    for key in FILE_SETTINGS:
        assert values[key].startswith(("/etc/tidelog/", "/var/lib/tidelog")), key
    config = node_config_from(with_real_files(values, host, tmp_path))
    assert config.node_id == n
    assert config.listen == (host, 7100)
    assert config.advertised == (host, 7100)
    assert config.peer_bind == (host, 7200)
    assert config.kafka_listen == config.kafka_advertised == (host, 9092)
    assert config.http_listen == (host, 9100)
    assert config.voters == (1, 2, 3)
    assert config.peer_ports == {1: 7200, 2: 7200, 3: 7200}
    assert config.tls is not None and config.authorization is Authorization.ACL
    assert len(config.cluster_secret) == 64
    assert config.admin_token is not None and config.admin_token[0] == "root"


def test_the_nodes_differ_only_in_the_lines_marked_per_node() -> None:
    shared = [
        [line for line in path.read_text().splitlines() if "per node" not in line]
        for path in NODE_CONFIGS
    ]
    assert shared[0] == shared[1] == shared[2]
    tables = [tomllib.loads(path.read_text()) for path in NODE_CONFIGS]
    for key in ("peers", "cluster_id", "cluster_secret_file", "admin_token_file", "data"):
        assert tables[0][key] == tables[1][key] == tables[2][key], key


@pytest.mark.process
@pytest.mark.skipif(
    shutil.which("nft") is None, reason="nft is not installed here (Debian's nftables package)"
)
def test_the_firewall_table_passes_nft_check(tmp_path: Path) -> None:
    def problems(text: str) -> str:
        path = tmp_path / FIREWALL.name
        path.write_text(text)
        done = subprocess.run(
            ["nft", "-c", "-f", str(path)], capture_output=True, text=True, timeout=60
        )
        if "Operation not permitted" in done.stderr:
            pytest.skip("nft -c needs CAP_NET_ADMIN here")
        return "" if done.returncode == 0 else done.stderr

    table = FIREWALL.read_text()
    assert problems(table) == ""
    assert "dportt" in problems(table.replace("tcp dport 9100", "tcp dportt 9100"))


def test_the_docs_show_the_files_as_they_are() -> None:
    blocks = re.findall(r"```[a-z]*\n(.*?)```", OPERATIONS.read_text(), re.S)
    assert NODE_CONFIGS[0].read_text() in blocks
    assert FIREWALL.read_text() in blocks
