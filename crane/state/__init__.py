"""The session state record, its checkpoint file, and park/restore (architecture invariant 5)."""
