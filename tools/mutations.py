"""Mutation check (not part of the suite): break one safety mechanism at a time in a scratch copy of the repository,
run the tests that guard it there, and say which sabotage no test caught.

    uv run python tools/mutations.py            # every sabotage
    uv run python tools/mutations.py NAME ...   # some (--list names them)

The scratch copy is HEAD's files (`git archive`: commit first) in a temporary directory; its tests run with this
checkout's environment, the copy's `fedload` first on PYTHONPATH (child processes inherit it). A sabotage is
"caught" when its tests fail, "MISSED" when they all pass, "not applied" when its code is no longer where it was
(update the sabotage). Each run of a guard takes 15-90 s (`-n 0`, stopping at the first failure).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
RUN_TIMEOUT_S = 900


@dataclass(frozen=True)
class Sabotage:
    """Replace `old` by `new` in `path`; `tests` (pytest arguments) must then fail."""

    name: str
    promise: str
    path: str
    old: str
    new: str
    tests: tuple[str, ...]


_MVCC_APART = """import os
other = await asyncpg.connect(
    host=os.path.dirname(conn._addr), port=int(conn._addr.rsplit(".", 1)[1]),
    user=conn._params.user, database=conn._params.database,
)
await other.execute(f"DELETE FROM {partition}")
await other.close()
await asyncio.sleep(1.0)
await conn.execute(f"DELETE FROM {partition}")  # noqa: S608 - catalog name"""

_EMPTIED_FIRST = """for parent in sorted(parents.values(), key=lambda p: p.qualified_name)[:1]:
            key_column = self.job.parents.feeder_key
            await conn.execute(f"DELETE FROM {parent.sql_name} WHERE {key_column} = {self.feeder.key!r}")
        async with self._dump(parents) as receiver, entities as change, conn.transaction():"""

_INJECTION = "tests/scenarios/test_adversarial.py::test_injection_corpus_loads_only_data"
_CLAIM = "tests/scenarios/test_adversarial.py::test_a_claim_out_of_bounds_fails_the_run_in_a_bounded_line"

_HOSTILE_BINARY = "tests/scenarios/test_hostile_binary.py"
_PROOF = "tests/feeder/test_identity_proof.py"
_KEPT_SSH = "tests/transport/test_kept_ssh.py"
_DAEMON_KEPT_SSH = "tests/service/test_daemon_kept_ssh.py"
_BEYOND_ANALYZE = (
    "tests/superhub/test_statistics_carried.py::test_statistics_beyond_analyze_are_dropped_and_the_table_analyzed"
)

SABOTAGES = (
    Sabotage(
        "mvcc-emptied-apart",
        "mvcc swap: readers see old or new, never empty",
        "fedload/superhub/swap.py",
        'await conn.execute(f"DELETE FROM {partition}")  # noqa: S608 - catalog name',
        _MVCC_APART.replace("\n", "\n    "),
        ("tests/superhub/test_swap_policies.py::test_mvcc_swap_never_waits_for_readers",),
    ),
    Sabotage(
        "entity-moves-frozen-swap",
        "entity rule: a swap that moves hosts replaces its rows in place, never by a partition",
        "fedload/superhub/swap.py",
        "in_place = {t.parent.table for t in plan.tables if t.parent.column(rule.key_column)}",
        "in_place = set()",
        ("tests/superhub/test_entity_readers.py", "-k", "partition"),
    ),
    Sabotage(
        "entity-first-sync-frozen",
        "entity rule: a first sync that moves hosts fills an empty partition, not the frozen staging table",
        "fedload/superhub/swap.py",
        "    elif in_place:\n        partition = await _attach_empty(conn, table, feeder, key)",
        "    elif False:\n        partition = await _attach_empty(conn, table, feeder, key)",
        ("tests/superhub/test_entity_readers.py", "-k", "mvcc"),
    ),
    Sabotage(
        "entity-removal-at-once",
        "entity rule: a removal hands hosts back, waits for older snapshots, then drops",
        "fedload/superhub/removal.py",
        "if handed is None:",
        "if True:",
        ("tests/superhub/test_entity_readers.py", "-k", "mvcc"),
    ),
    Sabotage(
        "terminate-not-cancel",
        "cancel, never terminate, a blocking report",
        "fedload/superhub/blockers.py",
        '_CANCEL = "SELECT pg_cancel_backend($1)"',
        '_CANCEL = "SELECT pg_terminate_backend($1)"',
        ("tests/superhub/test_swap_policies.py::test_partition_swap_cancels_blocking_reports",),
    ),
    Sabotage(
        "idle-and-fedload-cancelled",
        "other fedload sessions and idle transactions are waited for",
        "fedload/superhub/blockers.py",
        'if blocker.state != "active":\n        return Action.WAIT',
        'if blocker.application == "nobody":\n        return Action.WAIT',
        ("tests/superhub/test_swap_policies.py::test_other_fedload_sessions_and_idle_transactions_are_waited_for",),
    ),
    Sabotage(
        "cancel-refusal-silent",
        "swap.cancel_refused is logged without pg_signal_backend",
        "fedload/superhub/blockers.py",
        'log.warning("swap.cancel_refused"',
        'log.debug("swap.cancel_skipped"',
        ("tests/superhub/test_swap_policies.py", "-k", "may_not"),
    ),
    Sabotage(
        "grace-zero",
        "SIGTERM: running syncs finish within shutdown_grace_s",
        "fedload/service/daemon.py",
        "_, pending = await asyncio.wait(running, timeout=self._grace_s)",
        "_, pending = await asyncio.wait(running, timeout=0)",
        ("tests/service/test_daemon.py", "-k", "can_finish"),
    ),
    Sabotage(
        "no-backoff",
        "a failing feeder backs off exponentially",
        "fedload/service/schedule.py",
        "delay = min(max(cap_s, interval_s), min(interval_s, 30.0) * 2 ** (failures - 1))",
        "delay = interval_s",
        ("tests/service/test_daemon.py", "-k", "backs_off"),
    ),
    Sabotage(
        "no-kill-after-cancel",
        "a worker that does not answer a cancel is killed after CANCEL_WAIT_S",
        "fedload/service/workers.py",
        "waited_s=CANCEL_WAIT_S)\n            await self.worker.kill()",
        "waited_s=CANCEL_WAIT_S)",
        ("tests/service/test_workers.py", "-k", "does_not_answer"),
    ),
    Sabotage(
        "filter-view-removed",
        "a moving feeder is read from one shard at every moment",
        "fedload/scaleout/coordinator.py",
        "if self.placement.reads[shard].filtered:",
        "if False:",
        ("tests/scenarios/test_feeder_move.py::test_a_feeder_moved_while_readers_run",),
    ),
    Sabotage(
        "password-logged",
        "a password in a dsn is in no log",
        "fedload/transport/local.py",
        'log.debug("transport.local_forked", argv=[without_passwords(a) for a in argv], pid=agent.pid)',
        'log.debug("transport.local_forked", argv=argv, pid=agent.pid)',
        ("tests/scaleout/test_coordinator_auth.py", "-k", "password_in_a_dsn"),
    ),
    Sabotage(
        "old-contexts-emptied",
        "old data intact after each fault (every table)",
        "fedload/superhub/pipeline.py",
        "async with self._dump(parents) as receiver, entities as change, conn.transaction():",
        _EMPTIED_FIRST,
        (
            "tests/scenarios/test_faults.py",
            "-k",
            "stopped_mid_dump or disk_full",
            "tests/service/test_workers.py",
            "-k",
            "killed_mid_load",
        ),
    ),
    Sabotage(
        "digest-taken-as-sent",
        "a digest the agent sends is checked on receipt (format, rows, asked, once)",
        "fedload/superhub/unchanged.py",
        "        if wrong:\n            said = one_line",
        "        if False:\n            said = one_line",
        ("tests/superhub/test_unchanged.py", "-k", "planted_digest"),
    ),
    Sabotage(
        "invalid-stored-digest-sent",
        "a stored digest the agent would refuse is not sent",
        "fedload/superhub/unchanged.py",
        "    if _malformed(stored.digest, stored.counters):",
        "    if False:",
        ("tests/superhub/test_unchanged.py", "-k", "stored_invalid"),
    ),
    Sabotage(
        "refused-digests-kept",
        "digests the agent refuses are forgotten: the next run sends every table",
        "fedload/superhub/unchanged.py",
        "    if skips is None or not (skips.asked or skips.counters):\n        return None",
        "    if True:\n        return None",
        ("tests/superhub/test_unchanged.py", "-k", "refuses_are_forgotten"),
    ),
    Sabotage(
        "digest-without-partition",
        "a digest is asked only for a table whose partition the superhub holds",
        "fedload/superhub/unchanged.py",
        "    if await feeder_partition(conn, table, job.name, job.feeder.key) is not None:",
        "    if True:",
        ("tests/superhub/test_unchanged.py", "-k", "dropped_by_hand"),
    ),
    Sabotage(
        "removal-keeps-digests",
        "feeder remove --table forgets the tables' digests with their partitions",
        "fedload/superhub/removal.py",
        "            await forget_digests(conn, self.name, self.tables)\n",
        "",
        ("tests/superhub/test_unchanged.py", "-k", "removed_is_sent"),
    ),
    Sabotage(
        "unasked-unchanged-skipped",
        "a table called unchanged that is not loaded here is refused",
        "fedload/superhub/importer.py",
        "        if staged is None:  # no digest of it was asked: nothing of it is kept\n            raise",
        "        if staged is None:  # sabotaged\n            return\n            raise",
        ("tests/superhub/test_unchanged.py", "-k", "not_asked_about"),
    ),
    Sabotage(
        "unasked-digests-ignored",
        "digests sent where the run asked for none are refused",
        "fedload/superhub/unchanged.py",
        "    if skips is None:\n        if trailer.digests:",
        "    if skips is None:\n        if False:",
        ("tests/superhub/test_unchanged.py", "-k", "not_asked_for"),
    ),
    Sabotage(
        "enum-labels-unhashed",
        "the identity proof covers the labels of the enums a table's columns use (RENAME VALUE writes no tuple)",
        "fedload/feeder/digest.py",
        "    labels = enum_labels(facts, context.types)\n",
        "    labels: list[Any] = []\n",
        (_PROOF, "-k", "pg15 and each_change and rename"),
    ),
    Sabotage(
        "reg-types-proven-by-identity",
        "a column whose text prints names (reg* types) or settings (money) gets the content digest",
        "fedload/feeder/proof.py",
        '    if found.name.startswith("reg") or found.name in _NAME_PRINTING:',
        "    if False:",
        (_PROOF, "-k", "pg15 and regclass"),
    ),
    Sabotage(
        "stored-columns-unhashed",
        "the identity proof covers the columns as stored: a column dropped and added again with another default",
        "fedload/feeder/digest.py",
        "    stored = [list(c) for c in facts.columns]",
        "    stored = [list(c)[1:4] for c in facts.columns]",
        (_PROOF, "-k", "pg15 and added_again"),
    ),
    Sabotage(
        "output-settings-unhashed",
        "the identity proof covers the session's output settings (TimeZone changes timestamptz text)",
        "fedload/feeder/digest.py",
        "    return [list(context.server), list(context.settings), facts.oid, stored, labels]",
        "    return [list(context.server), [], facts.oid, stored, labels]",
        (_PROOF, "-k", "pg15 and each_change and time"),
    ),
    Sabotage(
        "identity-digest-not-durable",
        "an identity digest is stored only once the WAL its snapshot sees is flushed",
        "fedload/feeder/digest.py",
        '    statement = f"SELECT {flushed} >= {at} - CASE WHEN {header} <= 40 THEN {header} ELSE 0 END;"',
        '    statement = "SELECT true;"',
        (_PROOF, "-k", "pg15 and durable"),
    ),
    Sabotage(
        "statistics-call-unbounded",
        "a statistics call longer than ANALYZE's could be is not parsed",
        "fedload/superhub/statistics.py",
        "if self._max_call_bytes is not None and len(item.text) > self._max_call_bytes:",
        "if False:",
        (f"{_BEYOND_ANALYZE}[pg18-4 million values-copy]",),
    ),
    Sabotage(
        "statistics-width-unbounded",
        "a carried avg_width fits a page and the loaded partition",
        "fedload/superhub/statistics_bounds.py",
        "if avg_width < 0 or avg_width > limits.block_size or stored > limits.table_bytes:",
        "if avg_width < 0:",
        (f"{_BEYOND_ANALYZE}[pg18-an avg_width of 10^9-copy]",),
    ),
    Sabotage(
        "statistics-frequencies-unsummed",
        "carried most-common frequencies add up, with null_frac, to at most 1",
        "fedload/superhub/statistics_bounds.py",
        'if sum(freqs) + _number(args.get("null_frac", "0")) > 1 + _TOLERANCE:',
        "if False:",
        (f"{_BEYOND_ANALYZE}[pg18-frequencies past 1-copy]",),
    ),
    Sabotage(
        "statistics-target-ignored",
        "carried lists within the column's statistics target on the superhub",
        "fedload/superhub/statistics.py",
        "limits = ColumnLimits(column[3],",
        "limits = ColumnLimits(10**6,",
        (f"{_BEYOND_ANALYZE}[pg18-more values than the target-copy]",),
    ),
    Sabotage(
        "statistics-restored-on-the-parent",
        "carried statistics reach only the feeder's new partition",
        "fedload/superhub/statistics.py",
        "params: list[object] = [STAGE_SCHEMA, table.stage_name, column]",
        "params: list[object] = [table.parent.table.schema, table.parent.table.name, column]",
        ("tests/superhub/test_statistics_carried.py::test_carried_statistics_reach_only_the_feeders_new_partition",),
    ),
    Sabotage(
        "entity-future-believed",
        "a forged future entity_newest takes no host (one superhub)",
        "fedload/superhub/entities.py",
        "    if not _TEMPORAL.fullmatch(newest_type):",
        "    if True:",
        ("tests/superhub/test_entities.py", "-k", "forged"),
    ),
    Sabotage(
        "entity-displacement-unbounded",
        "a mass displacement is held back (one superhub)",
        "fedload/superhub/entities.py",
        "        await _held_back(conn, rule, feeder, decision)",
        "        pass",
        ("tests/superhub/test_entities.py", "-k", "mass_displacement"),
    ),
    Sabotage(
        "entity-pairs-unsaid",
        "status, --json and metrics say who displaced whom",
        "fedload/superhub/entities.py",
        "    for displaced, shown_by, count in rows:",
        "    for displaced, shown_by, count in rows[:0]:",
        ("tests/superhub/test_entities.py", "-k", "who_displaced"),
    ),
    Sabotage(
        "coordinator-future-believed",
        "a forged future entity_newest takes no host (across shards)",
        "fedload/superhub/coordinated_entities.py",
        'forged = forged_sql(rule, await _registry_type(conn), "k.newest")',
        'forged = "false::boolean"',
        ("tests/scenarios/test_shard_entities.py", "-k", "forged"),
    ),
    Sabotage(
        "coordinator-displacement-unbounded",
        "a mass displacement is held back before the shard commits (across shards)",
        "fedload/superhub/coordinated_entities.py",
        "        await check_claims(conn, self.setup.rule, self.feeder, staged)",
        "        pass",
        ("tests/scenarios/test_shard_entities.py", "-k", "forged"),
    ),
    Sabotage(
        "identifier-length-unbounded",
        "a name a feeder sends is 1 to 63 bytes as written, without NUL",
        "fedload/names.py",
        '    if 0 < size <= MAX_IDENTIFIER_BYTES and "\\0" not in name:',
        "    if True:",
        ("tests/test_stream_claims.py", "-k", "past_63"),
    ),
    Sabotage(
        "dump-table-name-unchecked",
        "a table name of the dump text past 63 bytes is refused",
        "fedload/names.py",
        "        if (wrong := next(filter(None, map(identifier_refusal, parts)), None)) is not None:",
        "        if (wrong := None) is not None:",
        (f"{_INJECTION}[identifier: a 64-byte table name]",),
    ),
    Sabotage(
        "dump-columns-unchecked",
        "a COPY or INSERT column list of names past 63 bytes, or of 1601, is refused",
        "fedload/superhub/importer.py",
        "        if (wrong := columns_refusal(names)) is not None:",
        "        if (wrong := None) is not None:",
        (f"{_INJECTION}[identifier: a 64-byte column name]",),
    ),
    Sabotage(
        "section-head-names-unchecked",
        "a binary section head's table and column names are identifiers, at most 1600 columns",
        "fedload/superhub/binary_receive.py",
        "        if (wrong := columns_refusal(head[key])) is not None:",
        "        if (wrong := None) is not None:",
        ("tests/test_stream_claims.py", "-k", "section_heads_names_are"),
    ),
    Sabotage(
        "trailer-claims-believed",
        "the trailer's counts, exit status, dump_program, names and unchanged digests are bounded",
        "fedload/stream.py",
        "    if (wrong := _trailer_refusal(trailer)) is not None:",
        "    if (wrong := None) is not None:",
        ("tests/test_stream_claims.py", "-k", "trailer"),
    ),
    Sabotage(
        "header-versions-believed",
        "agent_version and pg_dump_version are at most 200 printable characters",
        "fedload/stream.py",
        "    if len(version) <= _MAX_VERSION_CHARS and version.isprintable():",
        "    if True:",
        (f"{_CLAIM}[terminal controls in agent_version]",),
    ),
    Sabotage(
        "run-error-uncapped",
        "a run's error is at most 2000 printable characters, whatever the feeder's words in it",
        "fedload/errors.py",
        "    if len(flat) <= MAX_ERROR_CHARS:",
        "    if True:",
        (f"{_CLAIM}[half a megabyte of the agent's error]",),
    ),
    Sabotage(
        "statistics-names-unchecked",
        "a statistics call's schemaname, relname and attname are identifiers",
        "fedload/superhub/statistics.py",
        "        if name in args and (wrong := identifier_refusal(args[name])) is not None:",
        "        if name in args and (wrong := None) is not None:",
        (
            "tests/superhub/test_statistics_carried.py::test_a_hostile_statistics_call_rejects_the_dump"
            "[pg18-a relname past 63 bytes-copy]",
        ),
    ),
    Sabotage(
        "statistics-nan-believed",
        "a NaN null_frac is refused, though NaN compares false with every bound",
        "fedload/superhub/statistics_bounds.py",
        "    if not 0 <= null_frac <= 1:",
        "    if null_frac < 0 or null_frac > 1:",
        (f"{_BEYOND_ANALYZE}[pg18-a NaN null_frac-copy]",),
    ),
    Sabotage(
        "ctrl-c-main-thread-only",
        "fedload sync takes Ctrl-C through the loop's wakeup fd, whichever thread the kernel hands it to",
        "fedload/commands/sync.py",
        "    return asyncio.run(_cancelled_by_sigint(main))",
        "    return asyncio.run(main)",
        ("tests/commands/test_interrupt.py",),
    ),
    Sabotage(
        "statistics-version-believed",
        "a carried call's version is a server version, not any number the superhub's cast would fail on",
        "fedload/superhub/statistics_bounds.py",
        'if "version" in args and not _is_server_version(args["version"]):',
        "if False:",
        ("tests/superhub/test_statistics_bounds.py::test_a_value_out_of_its_range_is_refused[version-99999999999]",),
    ),
    Sabotage(
        "changed-rows-unchecked",
        "a delta must leave the feeder's partition with the feeder's rows, or the run fails (issue 55)",
        "fedload/superhub/delta.py",
        "    if (after := held - deleted + inserted) != delta.rows:",
        "    if (after := held - deleted + inserted) is None:",
        (
            "tests/superhub/test_changed_rows.py::test_a_delta_that_does_not_add_up_is_refused_and_the_next_run_sends_all",
        ),
    ),
    Sabotage(
        "changed-rows-state-not-durable",
        "a delta state is kept only from a snapshot whose WAL is flushed (issue 55)",
        "fedload/superhub/unchanged.py",
        'delta = _delta_state(staged, skips) if digest else ""',
        "delta = _delta_state(staged, skips)",
        ("tests/superhub/test_changed_rows.py::test_no_state_is_kept_from_a_snapshot_whose_wal_is_not_flushed",),
    ),
    Sabotage(
        "changed-rows-by-new-rows-only",
        "a bucket that lost rows is dirty, not only one with new rows (issue 55)",
        "fedload/feeder/delta.py",
        "if new or old != stored[b]}",
        "if new}",
        ("tests/superhub/test_changed_rows.py::test_each_kind_of_change_alone_is_applied_in_place",),
    ),
    Sabotage(
        "changed-rows-old-by-any-xmin",
        "only rows of transactions older than the stored snapshot's xmin are old (issue 55)",
        "fedload/feeder/delta_plan.py",
        "    older_than = ask.state.xmin if ask.state is not None else 0",
        "    older_than = ask.state.xmin + 10**9 if ask.state is not None else 0",
        ("tests/superhub/test_changed_rows.py::test_each_kind_of_change_alone_is_applied_in_place",),
    ),
    Sabotage(
        "changed-rows-old-by-age-off-by-one",
        "a row is old by age() exactly where its 64-bit xmin is below the stored xmin (issue 55)",
        "fedload/feeder/delta_plan.py",
        "% {XID_WRAP} >= {threshold}",
        "% {XID_WRAP} > {threshold}",
        ("tests/feeder/test_old_rows.py",),
    ),
    Sabotage(
        "binary-head-unchecked",
        "a binary section's head is held to what the superhub asked (issue 54 items 4, 7)",
        "fedload/superhub/importer.py",
        "        check_binary_head(start, asked, feeder=self._feeder)",
        "        pass",
        (_HOSTILE_BINARY, "-k", "binary and not copy and not int4"),
    ),
    Sabotage(
        "binary-head-text-types",
        "a column asked as text only (tsvector, enums) is refused in binary (issue 54 item 4)",
        "fedload/superhub/section_head_check.py",
        "        if oids[name] == 0:",
        "        if oids[name] < 0:",
        (_HOSTILE_BINARY, "-k", "tsvector or enum"),
    ),
    Sabotage(
        "binary-head-table-as-text",
        "a table asked as text is refused in binary (issue 54 item 4)",
        "fedload/superhub/importer.py",
        "asked = asked_columns(staged.parent, remap=self._remap,",
        "asked = asked_columns(staged.parent, remap=None,",
        (_HOSTILE_BINARY, "-k", "asked-as-text"),
    ),
    Sabotage(
        "binary-head-empty",
        "a binary section with no column list is refused (issue 54 item 7)",
        "fedload/superhub/section_head_check.py",
        "    if not start.columns:",
        "    if start.columns is None:",
        (_HOSTILE_BINARY, "-k", "no-column-list"),
    ),
    Sabotage(
        "binary-head-order",
        "a binary section's columns come in the order asked (issue 54 item 7)",
        "fedload/superhub/section_head_check.py",
        "        if order[name] < last:",
        "        if order[name] < -1:",
        (_HOSTILE_BINARY, "-k", "out-of-order"),
    ),
    Sabotage(
        "binary-head-not-asked",
        "a binary section's column the superhub did not ask for is refused (issue 54 item 7)",
        "fedload/superhub/section_head_check.py",
        'return f"for column {name}, which the superhub did not ask for"',
        "continue",
        (_HOSTILE_BINARY, "-k", "not-asked"),
    ),
    Sabotage(
        "binary-head-twice",
        "a binary section's column named twice is refused (issue 54 item 7)",
        "fedload/superhub/section_head_check.py",
        'if name in seen:\n            return f"with column {name} twice"',
        'if False:\n            return f"with column {name} twice"',
        (_HOSTILE_BINARY, "-k", "twice"),
    ),
    Sabotage(
        "binary-head-unsent-asked",
        "a binary section may not call a column the superhub asked for unsent (issue 54 item 7)",
        "fedload/superhub/section_head_check.py",
        "        if name in order:",
        "        if not order:",
        (_HOSTILE_BINARY, "-k", "unsent"),
    ),
    Sabotage(
        "header-mode-unchecked",
        "the stream's dump_mode is the mode the superhub asked for",
        "fedload/superhub/receive.py",
        "        if header.dump_mode != self._dump_mode:",
        "        if not header.dump_mode:",
        (_HOSTILE_BINARY, "-k", "copy-was-asked"),
    ),
    Sabotage(
        "data-refusal-superhub",
        "PostgreSQL's refusal of a binary value is a dump error, not the superhub's (issue 54 item 6)",
        "fedload/superhub/data_refusals.py",
        '_DATA_STATES = frozenset({"08P01", "42804", "54000"})',
        '_DATA_STATES = frozenset({"54000"})',
        (_HOSTILE_BINARY, "-k", "int4"),
    ),
    Sabotage(
        "data-refusal-everything",
        "PostgreSQL's error in the data phase that is not about the data (a cancel) stays the superhub's",
        "fedload/superhub/data_refusals.py",
        "(state[:2] in _DATA_CLASSES or state in _DATA_STATES)",
        "bool(state)",
        (_HOSTILE_BINARY, "-k", "cancelled_on_the_superhub"),
    ),
    Sabotage(
        "data-refusal-unnamed",
        "PostgreSQL's refusal of a feeder's data names the feeder and the table, in every mode (issue 54 item 6)",
        "fedload/superhub/importer.py",
        "            if is_data_refusal(exc):",
        "            if False:",
        ("tests/scenarios/test_adversarial.py", "-k", "injection_corpus and deep"),
    ),
    Sabotage(
        "delta-appended-believed",
        "a bucket sent as only gaining rows must gain rows and not be a changed one, or the delta is refused",
        "fedload/superhub/delta.py",
        "    if appended & dirty or any(state.counts[b] <= asked.state.counts[b] for b in appended):",
        "    if False:",
        ("tests/superhub/test_changed_rows.py", "-k", "lost_rows_sent_as_appended"),
    ),
    Sabotage(
        "delta-sent-buckets-uncounted",
        "each bucket a delta sends holds, by this superhub's hash, the rows the feeder's counts give it",
        "fedload/superhub/delta.py",
        "    wrong = next((b for b, n in expected.items() if found.get(b, 0) != n), None)",
        "    wrong = None",
        ("tests/superhub/test_changed_rows.py", "-k", "wrong_buckets"),
    ),
    Sabotage(
        "delta-state-old-rows-believed",
        "counted against its state, a table whose old rows are fewer than the state holds is counted by every row",
        "fedload/feeder/delta_plan.py",
        "        if old_rows == sum(stored.counts):",
        "        if True:",
        ("tests/superhub/test_changed_rows.py", "-k", "unseen_by_the_counters or any_changes"),
    ),
    Sabotage(
        "binary-row-unbounded",
        "a binary COPY row past superhub.max_statement_bytes is refused before it reaches PostgreSQL",
        "fedload/superhub/binary_framing.py",
        "        self._max_row_bytes = max_row_bytes",
        "        self._max_row_bytes = 1 << 61",
        ("tests/scenarios/test_binary_row_bound.py",),
    ),
    Sabotage(
        "freshness-order-by-timer",
        "a free lane goes to the due feeder most behind its freshness target, not the one due longest",
        "fedload/service/targets.py",
        "    return sorted(due, key=lambda c: (-lateness(c, now), c.schedule.next_at, c.name))",
        "    return sorted(due, key=lambda c: (c.schedule.next_at, c.name))",
        ("tests/service/test_targets.py", "tests/service/test_daemon_targets.py"),
    ),
    Sabotage(
        "freshness-target-overrides-backoff",
        "a feeder past its freshness target still waits out its backoff and busy retries",
        "fedload/service/targets.py",
        """    if now < candidate.schedule.not_before:
        return False
""",
        "",
        ("tests/service/test_targets.py",),
    ),
    Sabotage(
        "freshness-unreachable-silent",
        "a freshness target the lanes cannot hold is reported (log, status, metric)",
        "fedload/service/targets.py",
        "        reachable=round_s <= smallest_s and not behind,",
        "        reachable=True,",
        ("tests/service/test_daemon_targets.py", "tests/service/test_targets.py"),
    ),
    Sabotage(
        "ssh-kept-after-failure",
        "a run whose command failed or stopped mid-stream never gives its SSH connection back to the keeper",
        "fedload/transport/ssh.py",
        "        if keep is not None and self._clean and not self._conn.is_closed():",
        "        if keep is not None and not self._conn.is_closed():",
        (_KEPT_SSH, "-k", "failed_run_keeps_nothing"),
    ),
    Sabotage(
        "served-kept-after-give-up",
        "a served dump not read to its end frame closes its agent and connection, never kept for the next run",
        "fedload/transport/ssh.py",
        "        if clean and self._keep is not None and not conn.is_closed() and agent.usable:",
        "        if self._keep is not None and not conn.is_closed() and agent.usable:",
        ("tests/transport/test_served.py", "-k", "given_up"),
    ),
    Sabotage(
        "served-dump-outlives-stdin",
        "a served agent whose stdin ends (the superhub gone) kills the dump under way before it exits",
        "fedload/feeder/serve.py",
        "                        lines.came_during_dump()\n                        _kill(pid)\n",
        "                        lines.came_during_dump()\n",
        ("tests/feeder/test_serve.py", "-k", "stdin_ending or request_during"),
    ),
    Sabotage(
        "served-end-frame-unbounded",
        "a served agent's end frame is read only up to 1 MiB: a larger one fails the run at once",
        "fedload/transport/served.py",
        "        if kind != END or size > _MAX_END_BYTES:",
        "        if kind != END:",
        ("tests/transport/test_served.py", "-k", "hostile"),
    ),
    Sabotage(
        "superhub-loss-unwatched",
        "a superhub session lost while the feeder sends nothing fails the run at once, not at read_timeout_s",
        "fedload/superhub/pipeline.py",
        "        process = SessionWatched(opened, conn)\n",
        "        process = opened\n",
        ("tests/scenarios/test_faults.py", "-k", "silent"),
    ),
    Sabotage(
        "ssh-kept-not-remade",
        "a kept SSH connection on which the command's channel does not open is replaced, the run goes on",
        "fedload/transport/ssh.py",
        "            if not kept:\n                raise exc.error from exc.error.__cause__",
        "            if True:\n                raise exc.error from exc.error.__cause__",
        (_KEPT_SSH, "-k", "gone_silent or nothing_of_it_ran"),
    ),
    Sabotage(
        "ssh-command-started-twice",
        "a command whose channel had opened on a kept connection is never started again on another",
        "fedload/transport/ssh.py",
        "        if opened:\n            raise error from error.__cause__\n",
        "",
        (_KEPT_SSH, "-k", "nothing_of_it_ran"),
    ),
    Sabotage(
        "ssh-kept-other-settings",
        "a kept SSH connection serves only a run with the same ssh settings",
        "fedload/transport/kept_ssh.py",
        "        if idle.config != lease.config:",
        "        if False:",
        (_KEPT_SSH, "-k", "other_settings"),
    ),
    Sabotage(
        "ssh-kept-unbounded",
        "a worker keeps at most MAX_IDLE SSH connections, each at most IDLE_S",
        "fedload/transport/kept_ssh.py",
        "        while len(self._idle) > self._max_idle:",
        "        while len(self._idle) > 1000:",
        (_KEPT_SSH, "-k", "bounded"),
    ),
    Sabotage(
        "ssh-forget-ignores-run",
        "a feeder forgotten during its run (paused, reconfigured) keeps no connection of that run",
        "fedload/transport/kept_ssh.py",
        "        if self._generations.get(lease.feeder, 0) != lease.generation:",
        "        if False:",
        (_KEPT_SSH, "-k", "forgotten"),
    ),
    Sabotage(
        "daemon-pause-keeps-ssh",
        "a paused feeder's kept SSH connection is closed",
        "fedload/service/daemon.py",
        '                self._pool.forget(name, "paused")',
        "                pass",
        (_DAEMON_KEPT_SSH, "-k", "changes"),
    ),
    Sabotage(
        "daemon-reload-keeps-ssh",
        "a reload that changes a feeder's ssh settings, or removes it, closes its kept SSH connection",
        "fedload/service/daemon.py",
        "        if self._pool is None:\n            return\n        for name in removed:",
        "        if True:\n            return\n        for name in removed:",
        (_DAEMON_KEPT_SSH, "-k", "changes"),
    ),
    Sabotage(
        "pool-no-feeder-affinity",
        "a feeder's run goes to the idle worker that ran it last (where its SSH connection is kept)",
        "fedload/service/workers.py",
        "    return min(ran)[1] if ran else -1",
        "    return -1",
        ("tests/service/test_workers.py", "-k", "ran_it_last"),
    ),
    Sabotage(
        "worker-end-keeps-ssh",
        "a worker closes the SSH connections it keeps when it ends (the daemon's shutdown)",
        "fedload/service/worker.py",
        "        await asyncio.shield(close_kept_ssh())\n",
        "",
        (_DAEMON_KEPT_SSH, "-k", "at_its_end"),
    ),
)


def _scratch_copy(directory: Path) -> None:
    """HEAD's files in `directory` (`git archive`: no worktree registered in the repository)."""
    directory.mkdir()
    archive = subprocess.run(["git", "-C", str(REPO), "archive", "HEAD"], capture_output=True, check=True, timeout=120)
    subprocess.run(["tar", "-x", "-C", str(directory)], input=archive.stdout, check=True, timeout=120)


def _apply(copy: Path, sabotage: Sabotage) -> str | None:
    """Put the sabotage in; the file's text before, or None if its code is not (once) where it was."""
    path = copy / sabotage.path
    text = path.read_text()
    if text.count(sabotage.old) != 1:
        return None
    path.write_text(text.replace(sabotage.old, sabotage.new))
    return text


def _run_guards(copy: Path, sabotage: Sabotage) -> tuple[str, str, float]:
    """Run the guarding tests on the sabotaged copy: the verdict, the evidence (first failure), the seconds."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(copy), os.environ.get("PYTHONPATH")]))}
    groups = _pytest_groups(sabotage.tests)
    started = time.monotonic()
    for group in groups:
        argv = [sys.executable, "-m", "pytest", "-n", "0", "-x", "-q", "-p", "no:cacheprovider", "-p", "no:logging"]
        try:
            result = subprocess.run(
                [*argv, *group], cwd=copy, env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT_S, check=False
            )
        except subprocess.TimeoutExpired:
            return "caught (timed out)", " ".join(group), time.monotonic() - started
        if result.returncode == 1:
            return "caught", _evidence(result.stdout), time.monotonic() - started
        if result.returncode != 0:
            return f"error (pytest exit {result.returncode})", result.stdout[-300:], time.monotonic() - started
    return "MISSED", "every guarding test passed", time.monotonic() - started


def _evidence(output: str) -> str:
    """The failed test and the first line of what failed in it."""
    lines = output.splitlines()
    failed = next((line.split(" - ")[0] for line in lines if line.startswith(("FAILED", "ERROR"))), "?")
    error = next((line[1:].strip() for line in lines if line.startswith("E ")), "")
    return f"{failed.split('::')[-1]}: {error}"[:200]


def _pytest_groups(tests: tuple[str, ...]) -> list[list[str]]:
    """Split `path [-k EXPR] path [-k EXPR] ...` into one pytest call per path."""
    groups: list[list[str]] = []
    for arg in tests:
        if groups and (groups[-1][-1] == "-k" or arg == "-k"):
            groups[-1].append(arg)
        else:
            groups.append([arg])
    return groups


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("names", nargs="*", help="sabotages to try (default: all)")
    parser.add_argument("--list", action="store_true", help="name the sabotages and exit")
    options = parser.parse_args()
    chosen = [s for s in SABOTAGES if not options.names or s.name in options.names]
    if options.list or not chosen:
        for sabotage in SABOTAGES:
            print(f"{sabotage.name:<28} {sabotage.promise}")
        return 0 if options.list else 2
    missed = 0
    with tempfile.TemporaryDirectory(prefix="fedload-mutations-") as scratch:
        copy = Path(scratch) / "repo"
        _scratch_copy(copy)
        for sabotage in chosen:
            if (original := _apply(copy, sabotage)) is None:
                verdict, evidence, seconds = "not applied", f"code not found in {sabotage.path}", 0.0
            else:
                try:
                    verdict, evidence, seconds = _run_guards(copy, sabotage)
                finally:
                    (copy / sabotage.path).write_text(original)
            missed += not verdict.startswith("caught")
            print(f"{sabotage.name:<28} {verdict:<12} {seconds:5.0f} s  {evidence}", flush=True)
    print(f"{len(chosen) - missed} of {len(chosen)} sabotages caught" + (f"; {missed} not" if missed else ""))
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
