"""What a session's worker executes calls with: one layer per job.

* :mod:`~crane.engine.model`: the session's device state (object tables, allocations, chunks,
  the module area, the sticky fault, dirty tracking) with one public method per wire operation
  and the accessors the state record and migration use;
* :mod:`~crane.engine.dispatch`: the thin dispatcher that binds each op of the call table to
  its method by name and applies the table's rules (teardown after a fault, dirty marking);
* :mod:`~crane.engine.codec`: the wire codec, call batches in and reply batches out, with the
  call log a resumed guest continues from.
"""
