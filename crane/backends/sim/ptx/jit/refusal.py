"""Why the compiler does not take a kernel: an exception of its own, apart from the modules
that need llvmlite, so that the package can name it before LLVM is loaded."""

from __future__ import annotations

__all__ = ["Refusal"]


class Refusal(Exception):
    """The compiler does not take this kernel: ``what`` and the PTX ``line`` say why."""

    def __init__(self, what: str, line: int | None) -> None:
        self.what = what
        self.line = line
        super().__init__(f"{what} (PTX line {line})" if line is not None else what)
