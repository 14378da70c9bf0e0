"""A session's worker, as the rest of the host sees it: the session's attachment and lifecycle
(:mod:`~crane.worker.attach`), the daemon's checkpoint and restore requests
(:mod:`~crane.worker.control`) and the endpoint guests on the daemon's host call directly
(:mod:`~crane.worker.direct`). The process itself is ``crane.craned.worker``.
"""
