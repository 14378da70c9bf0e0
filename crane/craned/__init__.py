"""The host's processes: craned and its session workers, as programs.

Their entry points, craned's configuration, and the one place each process is wired together
(the composition roots): craned's gRPC server with every service over the session manager
(:mod:`~crane.craned.server`), and a worker's loop over its channel with the session's engine,
its checkpoint and restore requests and its migration frames (:mod:`~crane.craned.worker`).

Above the daemon's session machinery (``crane.daemon``), the worker's (``crane.worker``) and
live migration (``crane.migrate``), which never import each other the wrong way: migration
works through the interface the daemon offers (``crane.daemon.host.SessionHost``) and the
worker's session (``crane.worker.attach``), and this package hands them to each other.
"""
