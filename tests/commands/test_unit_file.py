"""deploy/fedload.service: `systemctl reload` runs check-config on the same file before the daemon's SIGHUP, so an
invalid file fails the reload (systemd runs ExecReload lines in order and stops at the first that fails)."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
UNIT = REPO / "deploy" / "fedload.service"
FEDLOAD = "/opt/fedload/bin/fedload"


def service_settings() -> dict[str, list[str]]:
    """The [Service] section's settings, each key with its values in file order (ExecReload= may repeat)."""
    settings: dict[str, list[str]] = {}
    section = ""
    for raw in UNIT.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            section = line
        elif section == "[Service]":
            key, _, value = line.partition("=")
            settings.setdefault(key, []).append(value)
    return settings


def config_option(command: str) -> list[str]:
    """The `--config PATH` of a fedload command line, or [] (then FEDLOAD_CONFIG from Environment= applies)."""
    argv = shlex.split(command)
    return argv[argv.index("--config") : argv.index("--config") + 2] if "--config" in argv else []


def test_reload_checks_the_same_file_before_the_signal() -> None:
    """ExecReload: first `fedload check-config` with the same configuration as ExecStart, then the shell's kill -HUP
    (/bin/kill is not on a minimal Debian: tests/install/test_systemd_unit.py runs the unit there)."""
    service = service_settings()
    first, signal = service["ExecReload"]
    assert shlex.split(first)[:2] == [FEDLOAD, "check-config"]
    assert shlex.split(signal) == ["/bin/sh", "-c", 'kill -HUP "$MAINPID"']
    (start,) = service["ExecStart"]
    assert shlex.split(start)[:1] == [FEDLOAD]
    assert config_option(first) == config_option(start) == config_option(service["ExecStartPre"][0])


def test_the_reload_check_refuses_an_invalid_file(tmp_path: Path) -> None:
    """The unit's check-config command, run as systemd would (its Environment=, the file replaced by one here),
    exits 2 with one line per problem for an invalid file, 0 for a valid one."""
    service = service_settings()
    argv = shlex.split(service["ExecReload"][0])
    environment = dict(setting.split("=", 1) for setting in service.get("Environment", []))
    config = tmp_path / "fedload.toml"
    environment = {name: str(config) if value.endswith(".toml") else value for name, value in environment.items()}
    assert "FEDLOAD_CONFIG" in environment or "--config" in argv
    argv = [str(config) if arg.endswith(".toml") else arg for arg in argv]

    def reload_check() -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "fedload", *argv[1:]],
            env={"PATH": os.environ["PATH"], **environment},
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )

    config.write_text('[superhub]\ndsn = "x"\ntables = ["public.t"]\nunknown = 1\n')
    refused = reload_check()
    assert (refused.returncode, refused.stdout) == (2, "")
    assert refused.stderr == f"fedload: {config}: superhub.unknown: unknown key (misspelt?)\n"
    config.write_text('[superhub]\ndsn = "x"\ntables = ["public.t"]\n')
    accepted = reload_check()
    assert accepted.returncode == 0, accepted.stderr
    assert accepted.stdout.startswith(f"configuration {config} (")


def test_the_reload_checks_refusal_reaches_the_journal_at_error_priority(tmp_path: Path) -> None:
    """Under systemd (stderr the journal's stream, JOURNAL_STREAM naming it), check-config's refusal starts with
    `<3>`, so `journalctl -u fedload -p err` shows why a reload or start was refused."""
    config = tmp_path / "fedload.toml"
    config.write_text('[superhub]\ndsn = "x"\ntables = ["public.t"]\nunknown = 1\n')
    stderr = tmp_path / "stderr"
    with stderr.open("wb") as journal:
        stat = os.fstat(journal.fileno())
        env = {"PATH": os.environ["PATH"], "JOURNAL_STREAM": f"{stat.st_dev}:{stat.st_ino}"}
        argv = [sys.executable, "-m", "fedload", "check-config", "--config", str(config)]
        refused = subprocess.run(argv, env=env, stderr=journal, timeout=60, check=False)
    assert refused.returncode == 2
    assert stderr.read_text() == f"<3>fedload: {config}: superhub.unknown: unknown key (misspelt?)\n"
