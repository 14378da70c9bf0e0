"""The neutral device layer: what every side agrees a GPU is, whichever backend drives it.

Below the backends, the guest library, the state record, migration and the daemon: the device
identity a guest is told (:mod:`~crane.device.identity`, with its virtual UUID), the model of a
GPU product's attributes and limits (:mod:`~crane.device.model`), the rules for "offers at least
what the guest was told" (:mod:`~crane.device.limits`), the per-device memory ledger shared by a
daemon's workers (:mod:`~crane.device.ledger`) and the session address-space layout
(:mod:`~crane.device.layout`). Nothing here runs a GPU or holds a simulator's data.
"""
