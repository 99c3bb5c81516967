"""kip98's benchmarks, run by ``scripts/bench``: every figure a ratio against PostgreSQL
(or another kip98 path) measured in the same run. Not part of the product: nothing in
``app`` imports this package, and it is not installed with it.

The table is declared once, section by section; the console table, the JSON and
docs/benchmarks.md are rendered from it (``bench.table``, ``bench.docs``).

To add a section, write a module here that measures one thing and declares:

- its **cases**, the units ``--only`` names: functions taking a ``bench.section.Run``
  (the server, the flags as ``run.settings``, ``run.data`` for the shared rows,
  ``run.results`` for raw timings the JSON should keep) and returning what they measured
  as a dict. Each case makes its own databases (``bench.database.fresh_database``), times
  its phases once the server has settled (``bench.timing.timed``, ``best_of``), and takes
  its floors from ``bench.floors``;
- its **lines**, ``bench.section.Line``: a key, the label (the figure's name in the table,
  the docs and the JSON), the case it derives from, a function of that case's dict giving
  the figure, its format, its target (``">= 0.8"``, or ``"report"``), the key of its floor
  line if it has one, and its note for "Where the gaps are";
- ``SECTION = Section(name, {case name: case}, LINES, reading=(...))``: ``reading`` holds
  its bullets for "How to read these figures"; ``core=False`` keeps its cases out of
  ``--only core`` (those that start servers or other processes), ``default=False`` out of
  a run without ``--only``; ``options`` adds its own flags, if any.

Then register it: add its ``SECTION`` to ``bench.sections.SECTIONS``, where it belongs in
the table's order. A line added to an existing section goes into that module's ``LINES``
(derived from an existing case's dict, or from a new case in its ``cases``).
"""
