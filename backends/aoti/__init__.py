"""AOTInductor backend: ``model.pt2`` (compiled shared library + weights) for x86 servers, and a C++
consumer (``runner.cpp``) that loads it with ``torch::inductor::AOTIModelPackageLoader``."""

from .lower import BACKEND

__all__ = ["BACKEND"]
