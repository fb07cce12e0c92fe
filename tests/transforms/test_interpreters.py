"""The transformer gives byte-identical results on every Python it claims (3.9 and newer).

A corpus of generated dumps covering every lexical case is transformed by this test's own Python and, in one child
process each, by Debian's /usr/bin/python3 and pyenv's 3.9, 3.10, 3.12 and 3.13 where present; the results must be
equal byte for byte. The patterns once relied on possessive quantifiers, which match wrongly before 3.11.5 and do
not exist before 3.11.
"""

from __future__ import annotations

import errno
import os
import pickle
import re
import subprocess
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support import interpreters
from tests.support.interpreters import python_named
from tests.transforms.interpreter_child import Case, transformed
from transforms import DEFAULT_MAX_STATEMENT_BYTES

REPOSITORY = Path(__file__).resolve().parents[2]
CHILD = Path(__file__).with_name("interpreter_child.py")
PYENV_MINORS = ("3.9", "3.10", "3.12", "3.13")


# ------------------------------------------------------------------ the corpus: dumps with every lexical case

TEXT = st.text(st.sampled_from(list("ab ;,()'\"\\\n\t$-/*Eé_1")), max_size=10)


def standard_literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


@st.composite
def escape_literal(draw: st.DrawFn) -> str:
    """E'...' with backslash escapes and '' pairs."""
    out = []
    for char in draw(TEXT):
        if char == "'":
            out.append(draw(st.sampled_from(["\\'", "''"])))
        elif char == "\\":
            out.append(draw(st.sampled_from(["\\\\", "\\n", "\\x41"])))
        else:
            out.append(char)
    return draw(st.sampled_from(["E", "e"])) + "'" + "".join(out) + "'"


VALUE = st.one_of(
    st.integers(-(10**6), 10**6).map(str),
    st.sampled_from(["NULL", "true", "false", "1e5", "-0.5", "'{a,\"b c\"}'", "'2024-05-01 00:00:07+00'"]),
    TEXT.map(standard_literal),
    escape_literal(),
    st.just("(1 + (2 * 3))"),
    TEXT.map(standard_literal).map(lambda s: f"ARRAY[{s}, 'x']"),
)
TABLES = ["public.t", "t", 'public."We;ird ""T"""', 'public."a.b"', "public.r"]
ROW = st.lists(VALUE, min_size=3, max_size=3).map(lambda vs: "(" + ", ".join(vs) + ")")


@st.composite
def insert(draw: st.DrawFn) -> str:
    """A single- or multi-row INSERT, with or without column names, sometimes ON CONFLICT DO NOTHING."""
    table = draw(st.sampled_from(TABLES))
    columns = " (a, b, c)" if table == "public.r" or draw(st.booleans()) else ""
    rows = draw(st.lists(ROW, min_size=1, max_size=3))
    tail = " ON CONFLICT DO NOTHING" if draw(st.integers(0, 5)) == 0 else ""
    return f"INSERT INTO {table}{columns} VALUES " + ",\n\t".join(rows) + f"{tail};\n"


@st.composite
def dollar_quoted(draw: st.DrawFn) -> str:
    """A function whose body is dollar-quoted with a tag; the body holds ; ' and other dollar quotes."""
    tag = draw(st.sampled_from(["", "_", "body", "a1"]))
    body = draw(TEXT).replace(f"${tag}$", "")
    return f"CREATE FUNCTION f() RETURNS text AS ${tag}$ select ';' || {body!r} $x$ ; ${tag}$ LANGUAGE sql;\n"


@st.composite
def comment(draw: st.DrawFn) -> str:
    """A line comment, or a block comment (one that looks nested, too) before a statement."""
    text = draw(TEXT).replace("\n", " ")
    block = text.replace("*/", "")
    return draw(
        st.sampled_from(
            [
                f"-- {text}\n",
                f"/* {block} */ SELECT 1;\n",
                f"/* outer /* {block} */ SELECT 2;\n",
                f"SELECT 3 /* ; */ - -1; -- {text}\n",
            ]
        )
    )


@st.composite
def copy_block(draw: st.DrawFn) -> str:
    """A COPY ... FROM stdin block with escaped fields."""
    table = draw(st.sampled_from(TABLES))
    field = st.sampled_from(["1", "\\N", "a\\tb", "x;y", "'q'", "é", "\\\\"])
    rows = draw(st.lists(st.lists(field, min_size=3, max_size=3).map("\t".join), max_size=3))
    return f"COPY {table} (a, b, c) FROM stdin;\n" + "".join(r + "\n" for r in rows) + "\\.\n"


STATEMENT = st.one_of(
    insert(),
    insert(),
    dollar_quoted(),
    comment(),
    copy_block(),
    escape_literal().map(lambda s: f"SELECT {s};\n"),
    TEXT.map(lambda s: f"SET search_path = {standard_literal(s)};\n"),
    st.just('SELECT "a;b"."c""d" FROM "x" WHERE $1 = 1;\n'),
    st.just("--\n-- Data for Name: r; Type: TABLE DATA; Schema: public; Owner: -\n--\n\n"),
    st.just("\\restrict Xy12\n"),
)
REMAP = {"tables": {"public.r": {"rename": {"a": "x"}, "drop": ["b"], "add": {"k": "'v;''w'", "n": "NULL"}}}}


@st.composite
def case(draw: st.DrawFn) -> Case:
    """A dump (sometimes cut off), how it is fed, and whether the remap applies."""
    dump = "".join(draw(st.lists(STATEMENT, min_size=1, max_size=12))).encode()
    if draw(st.integers(0, 4)) == 0:
        dump = dump[: draw(st.integers(0, len(dump)))]
    chunk = draw(st.sampled_from([1, 3, 17, 1 << 20]))
    remap = REMAP if b"public.r " in dump and draw(st.booleans()) else None
    statement_bytes = draw(st.sampled_from([DEFAULT_MAX_STATEMENT_BYTES, 8]))  # 8: long INSERTs go on in pieces
    return dump, chunk, draw(st.sampled_from([1, 2, 1000])), statement_bytes, remap


def run_child(python: Path, cases: list[Case], tmp_path: Path) -> list[object]:
    """The results of `interpreter_child.py` for the cases, run by `python` on `transforms` from source."""
    cases_path, results_path = tmp_path / "cases.pickle", tmp_path / "results.pickle"
    cases_path.write_bytes(pickle.dumps(cases, protocol=4))
    command = [str(python), "-E", "-s", str(CHILD), str(REPOSITORY), str(cases_path), str(results_path)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, f"{python} failed:\n{done.stderr[-3000:]}"
    results: list[object] = pickle.loads(results_path.read_bytes())  # noqa: S301 - our own child's output
    return results


@pytest.mark.parametrize("name", ["system", *PYENV_MINORS])
def test_every_interpreter_transforms_a_corpus_alike(name: str, tmp_path_factory: pytest.TempPathFactory) -> None:
    """Each available interpreter gives exactly this Python's output, counts, errors and tuple values."""
    python = python_named(name)

    @settings(max_examples=3, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(st.lists(case(), min_size=40, max_size=40))
    def check(cases: list[Case]) -> None:
        expected = [transformed(c) for c in cases]
        got = run_child(python, cases, tmp_path_factory.mktemp("corpus"))
        assert len(got) == len(cases)
        for one_case, mine, theirs in zip(cases, expected, got, strict=True):
            assert theirs == mine, f"{python} differs on {one_case!r}"

    check()


def test_a_remap_file_without_a_toml_parser_is_a_clear_error(tmp_path: Path) -> None:
    """On a Python older than 3.11 without tomli, a remap file is refused in one clear sentence."""
    python = python_named("3.9")
    remap = tmp_path / "remap.toml"
    remap.write_text('[tables."public.r"]\ndrop = ["b"]\n')
    script = (
        f"import sys; sys.path.insert(0, {str(REPOSITORY)!r}); from pathlib import Path\n"
        "try:\n    import tomli\nexcept ImportError:\n    pass\nelse:\n    sys.exit(3)\n"
        f"from transforms import load_remap, RemapError\ntry:\n    load_remap(Path({str(remap)!r}))\n"
        "except RemapError as exc:\n    print(exc)\n"
    )
    done = subprocess.run(
        [str(python), "-E", "-s", "-c", script], capture_output=True, text=True, timeout=60, check=False
    )
    if done.returncode == 3:
        pytest.skip(f"{python} has tomli installed")
    assert done.returncode == 0, done.stderr
    assert "has no TOML parser (tomllib comes with 3.11): install tomli" in done.stdout


def test_an_unreadable_or_absent_pyenv_is_a_skip_saying_so(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A PYENV_ROOT this account cannot read (another user's, issue 56) or that is absent skips a pyenv Python's
    tests with the reason, instead of failing them with PermissionError."""
    versions = tmp_path / "versions"
    monkeypatch.setattr(interpreters, "PYENV_VERSIONS", versions)
    with pytest.raises(pytest.skip.Exception, match=re.escape(f"no Python 3.9: {versions} is absent")):
        python_named("3.9")
    versions.mkdir()
    with pytest.raises(pytest.skip.Exception, match=re.escape("no Python 3.9 this account can run")):
        python_named("3.9")

    def unreadable(path: object) -> object:
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(path))

    monkeypatch.setattr(os, "scandir", unreadable)  # as root, a mode-000 directory stays readable
    with pytest.raises(pytest.skip.Exception, match=r"this account cannot read .*versions \(Permission denied\)"):
        python_named("3.9")
