"""The wire, as every side speaks it: daemon addresses and channel options, the protocol
fingerprint, Crane's own (non-CUDA) status codes, the flags and hand-encoded replies of call
batches, and the gRPC method handlers with the one error boundary every service goes through."""
