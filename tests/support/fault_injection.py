"""Faults that a test injects into one feeder's run: an exception fedload does not expect, at one stage.

In the test's own process, `install(fault, monkeypatch)`. In the fedload processes a test starts (`fedload sync`,
its forked or started workers, the daemon), `fault_environment(fault, directory)`: the environment of a child
whose Python imports a `sitecustomize` that installs the fault from `FEDLOAD_TEST_FAULT` at start-up, so the
fault lives in every process of the command, wherever the stage runs (a run in a worker, its history in the
parent).

Sabotages (`sabotage_environment(name, directory)`, `FEDLOAD_TEST_SABOTAGE`): the same way into child processes,
a named break of one safety mechanism (`SABOTAGES`), for the negative controls: the test of a promise, run against
a daemon whose mechanism is broken, must fail.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from transforms import CopyRows

ENV = "FEDLOAD_TEST_FAULT"
SABOTAGE_ENV = "FEDLOAD_TEST_SABOTAGE"
STAGES = ("connect", "load", "swap", "analyze", "history")
_REPO = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Fault:
    """Raise `error` (a class name: RuntimeError, InternalClientError) at `stage` of `feeder`'s run."""

    stage: str
    feeder: str
    error: str

    def __str__(self) -> str:
        return f"{self.stage}:{self.feeder}:{self.error}"

    @classmethod
    def parse(cls, text: str) -> Fault:
        stage, feeder, error = text.split(":")
        return cls(stage, feeder, error)

    def exception(self) -> Exception:
        if self.error == "InternalClientError":  # what asyncpg raises for a connection left in a bad state
            return asyncpg.InternalClientError("cannot perform operation: another operation is in progress")
        return RuntimeError(f"injected fault at {self.stage}")


Patch = Callable[[Any, str, Any], None]


def install(fault: Fault, monkeypatch: pytest.MonkeyPatch) -> None:
    """Inject `fault` into this process, undone at the end of the test."""
    _patch(fault, monkeypatch.setattr)


def install_from_env() -> None:
    """Inject the fault that FEDLOAD_TEST_FAULT names, and the sabotage FEDLOAD_TEST_SABOTAGE names, if any, into
    this process for its life."""
    if text := os.environ.get(ENV):
        _patch(Fault.parse(text), setattr)
    if name := os.environ.get(SABOTAGE_ENV):
        SABOTAGES[name]()


def fault_environment(fault: Fault, directory: Path) -> dict[str, str]:
    """The environment for a fedload command (and every Python process it starts) with `fault` injected."""
    return {**_hooked_environment(directory), ENV: str(fault)}


def sabotage_environment(name: str, directory: Path) -> dict[str, str]:
    """The environment for a fedload command (and every Python process it starts) with sabotage `name` in."""
    assert name in SABOTAGES, name
    return {**_hooked_environment(directory), SABOTAGE_ENV: name}


def _hooked_environment(directory: Path) -> dict[str, str]:
    hook = "from tests.support.fault_injection import install_from_env\ninstall_from_env()\n"
    (directory / "sitecustomize.py").write_text(hook)
    path = os.pathsep.join(p for p in (str(directory), str(_REPO), os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "PYTHONPATH": path}


def _no_grace() -> None:
    """SIGTERM cancels the running syncs at once, as if `shutdown_grace_s` were 0."""
    from fedload.service.daemon import Daemon  # noqa: PLC0415 - only where sabotaged

    drain = Daemon._drain_runs

    async def drain_at_once(self: Any) -> None:
        self._grace_s = 0.0
        await drain(self)

    setattr(Daemon, "_drain_runs", drain_at_once)  # noqa: B010 - a private method


def _no_backoff() -> None:
    """A failing feeder is retried at its plain interval while its failures are still counted."""
    from fedload.service import daemon  # noqa: PLC0415 - only where sabotaged
    from fedload.service.schedule import FeederSchedule  # noqa: PLC0415

    def at_interval(now: float, interval_s: float, previous: FeederSchedule, *_: Any, **__: Any) -> FeederSchedule:
        return FeederSchedule(now + interval_s, previous.failures + 1)

    setattr(daemon, "after_failure", at_interval)  # noqa: B010 - a name the module imported, not exported


def _passwords_logged() -> None:
    """The dump command lines are logged with the passwords of their connection strings."""
    from fedload.transport import local  # noqa: PLC0415 - only where sabotaged

    setattr(local, "without_passwords", str)  # noqa: B010 - a name the module imported


SABOTAGES: dict[str, Callable[[], None]] = {
    "no-grace": _no_grace,
    "no-backoff": _no_backoff,
    "passwords-logged": _passwords_logged,
}


def _patch(fault: Fault, setattr_: Patch) -> None:
    from fedload.superhub import pipeline  # noqa: PLC0415 - only where a fault is injected
    from fedload.superhub.bookkeeping import connection  # noqa: PLC0415
    from fedload.superhub.importer import Importer  # noqa: PLC0415

    run: Any = pipeline  # the names the pipeline imported, as it calls them
    history: Any = connection
    target, error = fault.feeder, fault.exception()
    if fault.stage == "connect":
        setattr_(run, "reused_session", _failing_for(run.reused_session, target, error, argument=1))
    elif fault.stage == "load":
        setattr_(Importer, "load", _failing_load(Importer.load, target, error))
    elif fault.stage == "swap":
        setattr_(run, "swap_in", _failing_for_keyword(run.swap_in, target, error))
    elif fault.stage == "analyze":
        setattr_(run, "analyze_partitions", _failing_for(run.analyze_partitions, target, error, argument=2))
    elif fault.stage == "history":
        setattr_(history, "start_run", _failing_for(history.start_run, target, error, argument=1))
    else:
        raise ValueError(f"unknown stage {fault.stage!r}; known: {', '.join(STAGES)}")


def _failing_for(original: Callable[..., Any], feeder: str, error: Exception, *, argument: int) -> Callable[..., Any]:
    """`original`, raising `error` when its positional `argument` is `feeder`."""

    def call(*args: Any, **kwargs: Any) -> Any:
        if args[argument] == feeder:
            raise error
        return original(*args, **kwargs)

    return call


def _failing_for_keyword(original: Callable[..., Any], feeder: str, error: Exception) -> Callable[..., Any]:
    def call(*args: Any, **kwargs: Any) -> Any:
        if kwargs["feeder"] == feeder:
            raise error
        return original(*args, **kwargs)

    return call


def _failing_load(original: Callable[..., Any], feeder: str, error: Exception) -> Callable[..., Any]:
    """Importer.load, whose dump raises `error` after the first COPY data for `feeder`: mid-COPY, in the load's
    transaction, a staging table created."""

    async def failing_mid_copy(items: AsyncIterator[Any]) -> AsyncIterator[Any]:
        async for item in items:
            yield item
            if isinstance(item, CopyRows):
                raise error

    async def load(self: Any, items: AsyncIterator[Any]) -> Any:
        return await original(self, failing_mid_copy(items) if self._feeder == feeder else items)

    return load
