"""The coordinator's two state machines, declared once as tables (``transitions``).

Transaction status follows Kafka's TransactionState (names in docs/design.md §4); producer identity
follows the epoch lifecycle: a transactional id owns (producer_id, epoch), every bump
fences older holders, and an exhausted epoch rotates to a fresh producer id.

One shared Machine per table, with ``auto_transitions=False`` and ``ignore_invalid_triggers``
off: an invalid trigger raises, never silently does nothing. Models are attached only for
the duration of one trigger, under a lock, because Machines are expensive to build and
not safe to mutate from several threads at once. The tables are fixed, so each machine's
answer for a (state, trigger) — and, for the identity, whether an epoch is left — is
asked once and remembered: attaching a model costs tens of microseconds, and a
transaction makes several transitions.
"""

from __future__ import annotations

import threading
from functools import cache
from typing import Any

from transitions import Machine, MachineError

# ---------------------------------------------------------------- transaction status

EMPTY = "EMPTY"
BEGIN = "BEGIN"
PREPARE_COMMIT = "PREPARE_COMMIT"
PREPARE_ABORT = "PREPARE_ABORT"
COMPLETE_COMMIT = "COMPLETE_COMMIT"
COMPLETE_ABORT = "COMPLETE_ABORT"
DEAD = "DEAD"

TXN_STATES = [EMPTY, BEGIN, PREPARE_COMMIT, PREPARE_ABORT, COMPLETE_COMMIT, COMPLETE_ABORT, DEAD]
COMPLETE = [COMPLETE_COMMIT, COMPLETE_ABORT]
PREPARE = [PREPARE_COMMIT, PREPARE_ABORT]
# Open on the data partitions: records may be undecided, the LSO may be pinned.
OPEN_STATES = frozenset({BEGIN, *PREPARE})

# trigger               from                          to
TXN_TRANSITIONS: list[list[Any]] = [
    ["init_producer_id",  [EMPTY, *COMPLETE],           EMPTY],
    ["add_partitions",    [EMPTY, BEGIN, *COMPLETE],    BEGIN],
    ["end_commit",        BEGIN,                        PREPARE_COMMIT],
    ["end_abort",         BEGIN,                        PREPARE_ABORT],
    ["fence_abort",       BEGIN,                        PREPARE_ABORT],   # timeout, or a new producer instance
    ["complete_commit",   PREPARE_COMMIT,               COMPLETE_COMMIT],
    ["complete_abort",    PREPARE_ABORT,                COMPLETE_ABORT],
    ["expire",            [EMPTY, *COMPLETE],           DEAD],
]  # fmt: skip

# ---------------------------------------------------------------- producer identity

UNASSIGNED = "unassigned"
ACTIVE = "active"
EXHAUSTED = "exhausted"
# Kafka keeps epochs below Short.MAX_VALUE so one bump past this always fits.
MAX_EPOCH = 32766

# trigger    from                    to          condition
IDENTITY_TRANSITIONS: list[dict[str, Any]] = [
    {"trigger": "allocate", "source": [UNASSIGNED, EXHAUSTED], "dest": ACTIVE},
    {"trigger": "bump",     "source": ACTIVE, "dest": ACTIVE,    "conditions": "epoch_available"},
    {"trigger": "bump",     "source": ACTIVE, "dest": EXHAUSTED, "unless": "epoch_available"},
]  # fmt: skip


class InvalidTransition(Exception):
    """A trigger that the machine's table does not allow from the current state."""


class _Status:
    def __init__(self, state: str) -> None:
        self.state = state


class _Identity:
    def __init__(self, state: str, epoch: int) -> None:
        self.state = state
        self.epoch = epoch

    def epoch_available(self) -> bool:
        return self.epoch + 1 <= MAX_EPOCH


_TXN_MACHINE = Machine(
    model=None,
    states=TXN_STATES,
    transitions=TXN_TRANSITIONS,
    initial=EMPTY,
    auto_transitions=False,
    send_event=False,
)
_IDENTITY_MACHINE = Machine(
    model=None,
    states=[UNASSIGNED, ACTIVE, EXHAUSTED],
    transitions=IDENTITY_TRANSITIONS,
    initial=UNASSIGNED,
    auto_transitions=False,
)
_lock = threading.Lock()


def _fire(machine: Machine, model: object, trigger: str) -> str:
    with _lock:
        machine.add_model(model, initial=model.state)  # type: ignore[attr-defined]
        try:
            getattr(model, trigger)()
        except (MachineError, AttributeError) as exc:
            raise InvalidTransition(f"{trigger} is not allowed from {model.state}") from exc  # type: ignore[attr-defined]
        finally:
            machine.remove_model(model)
    return str(model.state)  # type: ignore[attr-defined]


@cache
def _txn_answer(state: str, trigger: str) -> str | None:
    try:
        return _fire(_TXN_MACHINE, _Status(state), trigger)
    except InvalidTransition:
        return None


def txn_transition(state: str, trigger: str) -> str:
    """The status after ``trigger`` from ``state``; raises InvalidTransition if not allowed."""
    after = _txn_answer(state, trigger)
    if after is None:
        raise InvalidTransition(f"{trigger} is not allowed from {state}")
    return after


def txn_allows(state: str, trigger: str) -> bool:
    try:
        txn_transition(state, trigger)
    except InvalidTransition:
        return False
    return True


def identity_after_bump(epoch: int) -> str:
    """ACTIVE when the epoch can be bumped in place, EXHAUSTED when the id must rotate."""
    return _bump_answer(_Identity(ACTIVE, epoch).epoch_available())


@cache
def _bump_answer(epoch_available: bool) -> str:
    return _fire(
        _IDENTITY_MACHINE,
        _Identity(ACTIVE, MAX_EPOCH - 1 if epoch_available else MAX_EPOCH),
        "bump",
    )
