"""The client's transaction manager: librdkafka's transactional producer states, as a table.

The producer asks this machine before every transactional call, so an API misuse is a
typed error (_STATE) rather than a protocol violation at the coordinator, and a failure
is classified the way librdkafka does: fenced or fatal errors end the producer; abortable
ones require ``abort_transaction()`` before anything else.

Once ``commit_transaction()`` has started, only retrying it (or closing) is allowed, as in
librdkafka and Kafka's Java producer: a commit that timed out or failed retriably may have
ended the transaction committed (its last batches go out with the EndTxn), so an abort
could tell the application "aborted" about records that are in the log. Abort is allowed
from COMMITTING only through ABORTABLE_ERROR, which a commit reaches only when it is
certain the transaction did not commit (a batch or the EndTxn refused).
"""

from __future__ import annotations

import threading
from functools import cache
from typing import Any

from transitions import Machine, MachineError

from app.errors import KafkaError, KafkaException

UNINITIALIZED = "uninitialized"
READY = "ready"
IN_TRANSACTION = "in_transaction"
COMMITTING = "committing"
ABORTING = "aborting"
ABORTABLE_ERROR = "abortable_error"
FATAL_ERROR = "fatal_error"

STATES = [UNINITIALIZED, READY, IN_TRANSACTION, COMMITTING, ABORTING, ABORTABLE_ERROR, FATAL_ERROR]

# trigger               from                                              to
TRANSITIONS: list[list[Any]] = [
    ["initialized",        UNINITIALIZED,                                   READY],
    ["begin",              READY,                                           IN_TRANSACTION],
    ["start_commit",       IN_TRANSACTION,                                  COMMITTING],
    ["start_abort",        [IN_TRANSACTION, ABORTABLE_ERROR],               ABORTING],
    ["completed",          [COMMITTING, ABORTING],                          READY],
    ["abortable_failure",  [IN_TRANSACTION, COMMITTING],                    ABORTABLE_ERROR],
    ["fatal_failure",      [s for s in STATES if s != FATAL_ERROR],         FATAL_ERROR],
]  # fmt: skip

# Errors after which this producer instance can never continue (librdkafka: fatal).
FATAL_CODES = frozenset(
    {
        KafkaError.PRODUCER_FENCED,
        KafkaError.INVALID_PRODUCER_EPOCH,
        KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
        KafkaError.INVALID_PRODUCER_ID_MAPPING,
        KafkaError.UNKNOWN_PRODUCER_ID,
        KafkaError.TRANSACTION_COORDINATOR_FENCED,
        KafkaError._FENCED,
        KafkaError._FATAL,
    }
)


class _Model:
    def __init__(self) -> None:
        self.state = UNINITIALIZED


_MACHINE = Machine(
    model=None, states=STATES, transitions=TRANSITIONS, initial=UNINITIALIZED,
    auto_transitions=False,
)  # fmt: skip
_machine_lock = threading.Lock()


@cache
def _next_state(state: str, trigger: str) -> str | None:
    """The machine's answer for ``trigger`` from ``state`` (None: not allowed), asked once:
    the table is fixed, and attaching a model to the shared machine costs tens of
    microseconds, three times per transaction."""
    model = _Model()
    model.state = state
    with _machine_lock:
        _MACHINE.add_model(model, initial=state)
        try:
            getattr(model, trigger)()
        except (MachineError, AttributeError):
            return None
        finally:
            _MACHINE.remove_model(model)
    return str(model.state)


class TransactionManager:
    """One per transactional Producer; thread-safe. ``fatal_error`` once set is sticky."""

    def __init__(self) -> None:
        # A plain attribute, read on every produce() of a transactional producer; only
        # ``fire`` moves it, to the machine's answer.
        self.state: str = UNINITIALIZED
        self._lock = threading.RLock()
        self.fatal_error: KafkaError | None = None
        self.abortable_error: KafkaError | None = None

    def fire(self, trigger: str, action: str) -> None:
        """Move the machine, or raise the typed error librdkafka gives for ``action``."""
        with self._lock:
            if self.fatal_error is not None and trigger != "fatal_failure":
                raise KafkaException(
                    KafkaError(self.fatal_error.code(), self.fatal_error.str(), fatal=True)
                )
            after = _next_state(self.state, trigger)
            if after is None:
                raise self._state_error(action)
            self.state = after

    def _state_error(self, action: str) -> KafkaException:
        if self.state == ABORTABLE_ERROR and self.abortable_error is not None:
            err = self.abortable_error
            return KafkaException(
                KafkaError(
                    err.code(),
                    f"{action}: transaction must be aborted first: {err.str()}",
                    txn_requires_abort=True,
                )
            )
        if self.state == COMMITTING:
            # librdkafka's __STATE (a call the transaction's state does not allow), not the
            # coordinator's INVALID_TXN_STATE: nothing was asked of the coordinator, and
            # the remedy is the application's, to call commit_transaction() again.
            return KafkaException(
                KafkaError(
                    KafkaError._STATE,
                    f"{action} is not allowed while a commit is in progress (its outcome is "
                    "not known yet): call commit_transaction() again to complete it",
                    retriable=False,
                    fatal=False,
                    txn_requires_abort=False,
                )
            )
        return KafkaException(
            KafkaError(KafkaError._STATE, f"{action} is not allowed in state {self.state}")
        )

    def fail(self, error: KafkaError) -> KafkaError:
        """Record a failure and return it with librdkafka's flags set."""
        with self._lock:
            if self.fatal_error is not None:
                # Already fatal (e.g. a batch failed fenced during commit's flush, then
                # EndTxn is refused too): the sticky fatal error, not a state error.
                return self.fatal_error
            if error.code() in FATAL_CODES or error.fatal():
                code = (
                    KafkaError._FENCED
                    if error.code()
                    in (KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH)
                    else error.code()
                )
                flagged = KafkaError(code, error.str(), fatal=True)
                self.fatal_error = flagged
                self.fire("fatal_failure", "fail")
                return flagged
            flagged = KafkaError(
                error.code(), error.str(), retriable=False, txn_requires_abort=True
            )
            if self.state in (IN_TRANSACTION, COMMITTING):
                self.abortable_error = flagged
                self.fire("abortable_failure", "fail")
            return flagged

    def reset_abortable(self) -> None:
        with self._lock:
            self.abortable_error = None
