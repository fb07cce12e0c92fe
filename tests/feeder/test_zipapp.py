"""`fedload agent pack`: the agent as one file, run by a feeder's own Python with no package installed."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from fedload import __version__
from fedload.results import Outcome
from fedload.stream import StreamDecoder
from tests.feeder.zipapp import PYTHONS, build
from tests.support.federation import CONTEXT_COLS, HOST_COLS, Federation, sync, write_script
from tests.support.interpreters import python_named

_HEAVY = ("pydantic", "asyncpg", "asyncssh", "structlog", "rich", "zstandard", "prometheus_client", "pglast", "tomlkit")


@pytest.fixture(scope="module")
def zipapp(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The zipapp, built once for the module."""
    return build(tmp_path_factory.mktemp("zipapp"))


def test_pack_is_reproducible_and_holds_only_the_agent(zipapp: Path, tmp_path: Path) -> None:
    """Two builds give the same bytes: a shebang for python3, then the agent's, the transformer's and the stream
    writer's modules (source and bytecode), nothing else."""
    again = build(tmp_path)
    assert again.read_bytes() == zipapp.read_bytes()
    assert zipapp.read_bytes().startswith(b"#!/usr/bin/env python3\n")
    assert os.access(zipapp, os.X_OK)
    with zipfile.ZipFile(zipapp) as archive:
        names = archive.namelist()
        assert {entry.date_time for entry in archive.infolist()} == {(1980, 1, 1, 0, 0, 0)}
    assert names == sorted(names)
    repo = Path(__file__).resolve().parents[2]
    expected = {"__main__.py", "fedload/__init__.py", "fedload/_tail.py"}
    expected |= {path.relative_to(repo).as_posix() for path in (repo / "fedload" / "feeder").glob("*.py")}
    expected |= {path.relative_to(repo).as_posix() for path in (repo / "transforms").glob("*.py")}
    expected |= {f"{name}c" for name in expected - {"__main__.py"}}
    assert set(names) == expected


def test_pack_from_the_command_line(tmp_path: Path) -> None:
    """`fedload agent pack -o FILE` writes the file and says so; an unwritable place is one line, exit 2."""
    done = subprocess.run(
        [sys.executable, "-m", "fedload", "agent", "pack", "-o", str(tmp_path / "a.pyz")],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"{tmp_path / 'a.pyz'}: ")
    assert zipfile.is_zipfile(tmp_path / "a.pyz")
    refused = subprocess.run(
        [sys.executable, "-m", "fedload", "agent", "pack", "-o", str(tmp_path / "no" / "a.pyz")],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert refused.returncode == 2
    assert refused.stderr.startswith(f"fedload: cannot write {tmp_path / 'no' / 'a.pyz'}: ")
    assert len(refused.stderr.splitlines()) == 1


_IMPORTS = """
import sys
sys.path.insert(0, sys.argv[1])
import fedload.feeder.main, fedload.feeder.agent
print(fedload.feeder.agent.__file__)
print(*sorted({name.partition(".")[0] for name in sys.modules}))
"""


def test_zipapp_imports_nothing_but_the_standard_library(zipapp: Path) -> None:
    """Run by this environment's Python, where every dependency is installed, the agent's modules come from the
    archive and import none of them; with no site-packages at all (-S) it answers --version."""
    done = subprocess.run(
        [sys.executable, "-I", "-c", _IMPORTS, str(zipapp)], capture_output=True, text=True, check=True, timeout=60
    )
    where, modules = done.stdout.splitlines()
    assert where.startswith(str(zipapp))
    assert not set(modules.split()) & set(_HEAVY)
    bare = subprocess.run(
        [sys.executable, "-I", "-S", str(zipapp), "--version"], capture_output=True, text=True, check=True, timeout=60
    )
    assert bare.stdout == f"fedload {__version__}\n"


_COMPILED_AS = """
import sys
sys.path.insert(0, sys.argv[1])
import fedload.feeder.agent, transforms.lexical
print(fedload.feeder.agent.run_agent.__code__.co_filename, transforms.lexical.possessive.__code__.co_filename)
"""


def _compiled_as(python: Path | str, zipapp: Path) -> list[str]:
    """The file names in the code of two of the zipapp's modules, as `python` loads them from it."""
    argv = [str(python), "-I", "-c", _COMPILED_AS, str(zipapp)]
    return subprocess.run(argv, capture_output=True, text=True, check=True, timeout=60).stdout.split()


@pytest.mark.parametrize("name", ["3.9", "3.13"])
def test_zipapp_bytecode_serves_its_own_python_only(zipapp: Path, name: str) -> None:
    """The Python that packed the zipapp runs the bytecode packed with it (compiled with the module's name in the
    archive), not the source; another release compiles the source (its code names the archive's path)."""
    assert _compiled_as(sys.executable, zipapp) == ["fedload/feeder/agent.py", "transforms/lexical.py"]
    expected = [f"{zipapp}/fedload/feeder/agent.py", f"{zipapp}/transforms/lexical.py"]
    assert _compiled_as(python_named(name), zipapp) == expected


@pytest.mark.parametrize("name", PYTHONS)
async def test_zipapp_loads_what_the_installed_agent_loads(federation: Federation, zipapp: Path, name: str) -> None:
    """The zipapp run by each Python here (`python -I fedload-agent.pyz`: Debian 12's 3.11.2, pyenv's 3.9, 3.10,
    3.12, 3.13) feeds a real superhub exactly the rows the installed agent does, which are the feeder's."""
    python = str(python_named(name))
    (installed,) = await sync(federation.config(), "hub1")
    assert installed.outcome == Outcome.SUCCESS, installed.error
    by_installed = _loaded(federation)
    run = (await sync(federation.config(agent_command=[python, "-I", str(zipapp)]), "hub1"))[0]
    assert run.outcome == Outcome.SUCCESS, run.error
    assert _loaded(federation) == by_installed == _feeder_rows(federation)


@pytest.mark.parametrize("name", ["3.9", "3.13"])
async def test_zipapp_dumps_in_binary_mode(federation: Federation, zipapp: Path, name: str) -> None:
    """The zipapp on the oldest and newest Python feeds the feeder's rows exactly in binary mode (its snapshot
    session, psql and the sections are standard library only)."""
    python = str(python_named(name))
    config = federation.config(agent_command=[python, "-I", str(zipapp)], dump_mode="binary")
    (run,) = await sync(config, "hub1")
    assert run.outcome == Outcome.SUCCESS, run.error
    assert _loaded(federation) == _feeder_rows(federation)


_COMPRESSORS = {  # site-packages (zstandard), the zstd program on PATH, the stream's compression, the agent's
    "zstandard": (True, False, "zstd", "the zstandard module"),
    "zstd-program": (False, True, "zstd", "the zstd program"),
    "gzip": (False, False, "gzip", "zlib"),
}


@pytest.mark.parametrize("case", _COMPRESSORS)
async def test_each_compressor_is_read_by_the_superhub(
    federation: Federation, zipapp: Path, tmp_path: Path, case: str
) -> None:
    """zstd through zstandard (if importable), else the zstd program (if on PATH), else gzip: the stream's header
    says which, the agent logs it, and the superhub loads each exactly."""
    site, zstd_program, compression, compressor = _COMPRESSORS[case]
    zstd = shutil.which("zstd")
    if zstd_program and zstd is None:
        pytest.skip("the zstd program is not installed (Debian: apt-get install zstd)")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    if zstd_program:
        assert zstd is not None
        (bin_dir / "zstd").symlink_to(zstd)
    log = tmp_path / "agent.log"
    python = [sys.executable, "-I", *([] if site else ["-S"])]  # -S: no site-packages, so no zstandard
    # The superhub sends `agent dump --quiet ...`; this wrapper adds -vv (after `agent dump`) and keeps the log.
    wrapper = write_script(
        tmp_path / "agent.sh",
        f'shift 2\nPATH={bin_dir} exec {" ".join(python)} {zipapp} dump -vv --log-format json "$@" 2>{log}\n',
    )
    (run,) = await sync(federation.config(agent_command=[wrapper]), "hub1")
    assert run.outcome == Outcome.SUCCESS, (run.error, log.read_text())
    assert _loaded(federation) == _feeder_rows(federation)
    events = {event["event"]: event for event in map(json.loads, log.read_text().splitlines())}
    assert events["agent.dump_started"]["compressor"].startswith(compressor)
    if compression == "gzip":
        assert events["agent.compression_fallback"]["using"] == "gzip (zlib)"
        assert events["agent.compression_fallback"]["level"] == "warning"
    database = federation.cluster.conninfo(federation.feeders["hub1"])
    pg_dump = federation.cluster.install.tool("pg_dump")
    dump = await asyncio.to_thread(
        subprocess.run,
        [*python, str(zipapp), "dump", "--database", database, "--table", "public.hosts", "--pg-dump", pg_dump],
        capture_output=True,
        check=True,
        timeout=60,
        env={"PATH": str(bin_dir)},
    )
    stream = dump.stdout
    decoder = StreamDecoder("hub1")
    assert b"".join(decoder.feed(stream)).count(b"\n") > 300
    decoder.close()
    assert decoder.header is not None
    assert decoder.header.compression == compression


@pytest.mark.parametrize("named", ["wrapper", "missing"])
def test_the_zstd_program_named_by_option(federation: Federation, zipapp: Path, tmp_path: Path, named: str) -> None:
    """`dump --zstd PATH` without the zstandard module and with no zstd on PATH: the stream is zstd from that
    program; a path to no program falls back to gzip, the warning naming it."""
    zstd = shutil.which("zstd")
    if zstd is None:
        pytest.skip("the zstd program is not installed (Debian: apt-get install zstd)")
    used = tmp_path / "zstd.used"
    program = tmp_path / "bin" / "zstd-of-the-feeder"
    program.parent.mkdir()
    if named == "wrapper":
        write_script(program, f'echo "$@" >> {used}\nexec {zstd} "$@"\n')
    database = federation.cluster.conninfo(federation.feeders["hub1"])
    argv = [sys.executable, "-I", "-S", str(zipapp), "dump", "--log-format=json", "--database", database]
    argv += ["--table", "public.hosts", "--pg-dump", federation.cluster.install.tool("pg_dump"), f"--zstd={program}"]
    dump = subprocess.run(argv, capture_output=True, check=True, timeout=60, env={"PATH": str(program.parent)})
    decoder = StreamDecoder("hub1")
    assert b"".join(decoder.feed(dump.stdout)).count(b"\n") > 300
    decoder.close()
    assert decoder.header is not None
    if named == "wrapper":
        assert decoder.header.compression == "zstd"
        assert "--stream-size=" in used.read_text()
    else:
        assert decoder.header.compression == "gzip"
        events = {event["event"]: event for event in map(json.loads, dump.stderr.decode().splitlines())}
        why = f"neither the zstandard module nor the zstd program ({program}: not an executable file) is installed"
        assert events["agent.compression_fallback"]["reason"] == why


def _loaded(fed: Federation) -> tuple[str, str]:
    return (
        fed.digest(fed.superhub, "hosts", HOST_COLS, "WHERE hub_id = 1"),
        fed.digest(fed.superhub, "contexts", CONTEXT_COLS, "WHERE hub_id = 1"),
    )


def _feeder_rows(fed: Federation) -> tuple[str, str]:
    db = fed.feeders["hub1"]
    return fed.digest(db, "hosts", HOST_COLS), fed.digest(db, "contexts", CONTEXT_COLS)
