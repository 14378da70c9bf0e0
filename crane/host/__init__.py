"""What craned and its session workers share: the link between them and process plumbing.

The channel between the daemon and a worker (:mod:`~crane.host.channel`, framed opaque bytes)
and the typed messages it carries (:mod:`~crane.host.messages`: the worker's configuration,
checkpoint, restore and migration requests and their answers); the stats page a worker
publishes for ``crane ps`` (:mod:`~crane.host.stats`); malloc tuning for processes that move
multi-megabyte buffers (:mod:`~crane.host.malloc`); the transport diagnostics service both
serve (:mod:`~crane.host.diagnostics`). Neither the guest nor the device code uses any of it.
"""
