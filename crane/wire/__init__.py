"""Transport-level pieces shared by guest, daemon and CLI: addresses, channel options,
the protocol fingerprint and Crane's own (non-CUDA) status codes."""
