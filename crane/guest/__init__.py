"""Crane."""
