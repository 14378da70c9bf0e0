"""Crane: CUDA remoting and live migration of GPU state."""

__version__ = "0.1.0"
