"""Live migration of a session between daemons (issue 5, part 2; invariants 6 and 7)."""
