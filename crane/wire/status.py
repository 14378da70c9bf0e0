"""Crane's own reply codes, outside CUresult's range (they never reach an application)."""

__all__ = ["CRANE_NEED_IMAGE", "DRIVER_VERSION", "MAX_CHUNK"]

#: MODULE_LOAD without bytes on a daemon that does not hold the image: resend with the image.
CRANE_NEED_IMAGE = 0x43520001

#: Largest payload carried by one call (host-to-device data, device-to-host replies).
MAX_CHUNK = 4 << 20

#: The driver version reported to guests (cuDriverGetVersion): CUDA 13.0.
DRIVER_VERSION = 13000
