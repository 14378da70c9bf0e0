"""Host-side VM integration: libvirt domains whose guests use Crane, and moving their GPU state
with the VM (``crane migrate DOMAIN``, the libvirt hook, the watcher)."""
