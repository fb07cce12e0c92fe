"""fedload's own tables on a superhub (`fedload.runs`, `fedload.rejects`, `fedload.schedule`, `fedload.moved`,
`fedload.paused`, `fedload.capacity`): every statement that creates, reads or writes them is in this package, and
everyone else calls it.

The one connection a sync or daemon shares for its bookkeeping is `fedload.superhub.bookkeeping.connection`, not
re-exported here: it opens superhub sessions, and the session module itself uses these statements.
"""

from fedload.superhub.bookkeeping.capacity import CapacityReport, forget_capacity, read_capacity, store_capacity
from fedload.superhub.bookkeeping.feeder_states import FeederState, read_feeder_states
from fedload.superhub.bookkeeping.feeder_status import FeederStatus, read_feeder_statuses
from fedload.superhub.bookkeeping.feeders import forget_feeder, known_feeders
from fedload.superhub.bookkeeping.locks import try_feeder_lock, unlock_feeder
from fedload.superhub.bookkeeping.moved import forget_move, moved_away, note_moved
from fedload.superhub.bookkeeping.pauses import Pause, pause_feeder, read_pause, resume_feeder, write_pause
from fedload.superhub.bookkeeping.rejects import RejectedRow, forget_rejects, record_reject
from fedload.superhub.bookkeeping.runs import (
    RUNS_FOR_PEOPLE,
    RunRecord,
    count_runs,
    finish_run,
    last_load,
    last_sizes,
    start_run,
)
from fedload.superhub.bookkeeping.schedule import store_next_run
from fedload.superhub.bookkeeping.tables import ensure_superhub, has_history

__all__ = [
    "RUNS_FOR_PEOPLE",
    "CapacityReport",
    "FeederState",
    "FeederStatus",
    "Pause",
    "RejectedRow",
    "RunRecord",
    "count_runs",
    "ensure_superhub",
    "finish_run",
    "forget_capacity",
    "forget_feeder",
    "forget_move",
    "forget_rejects",
    "has_history",
    "known_feeders",
    "last_load",
    "last_sizes",
    "moved_away",
    "note_moved",
    "pause_feeder",
    "read_capacity",
    "read_feeder_states",
    "read_feeder_statuses",
    "read_pause",
    "record_reject",
    "resume_feeder",
    "start_run",
    "store_capacity",
    "store_next_run",
    "try_feeder_lock",
    "unlock_feeder",
    "write_pause",
]
