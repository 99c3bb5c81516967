"""When ``produce()`` gives the GIL to the threads sending the Producer's requests.

A sender thread whose produce request was answered needs the GIL to read the answer, serve
its delivery reports and send the next request. CPython passes the GIL from a thread that
computes to one waiting for it only after the switch interval (5 ms), and nothing in
``produce()`` gives it up on its own: an application producing in a loop kept every
answered request waiting up to 5 ms — the length of a whole 1000-record request on a local
server. So while a request is out, ``produce()`` gives the GIL up at most every
``HANDOFF_INTERVAL_S``.

``time.sleep(0)`` is the way that works: it leaves the CPU for the kernel's timer slack
(tens of microseconds), long enough for a waiting thread to take the GIL. ``os.sched_yield``
or a zero-timeout ``select`` release it and take it back before the waiter has woken, and
the waiter, seeing the GIL changed hands meanwhile, waits a whole switch interval again
(measured: the waiter's latency grew to hundreds of milliseconds). Because the sleep costs
the caller that slack, it is taken only while a request is out (``requests_out``), when a
sender thread is bound to need the GIL, and at most once a millisecond. Measured on this
project's benchmark (five alternating runs of each, 1000-record batches): the idempotent
Producer's records/s went up by a sixth on one partition and by a quarter over four
partitions on one lane; with four lanes, by a tenth (every half millisecond gained one lane
3% more and cost four lanes 8%; every 2 ms lost on both). An application whose records wait
for its commit (no request out while it produces: the transactional and flushing runs
measured the same) pays nothing. Changing the interpreter's switch interval
instead would change it for the whole application, and gained less (a tenth).
"""

from __future__ import annotations

import time

HANDOFF_INTERVAL_S = 0.001

hand_off = time.sleep  # called with 0: see the module's docstring
