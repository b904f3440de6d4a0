"""XNNPACK backend: ExecuTorch ``.pte`` with linear layers and friends delegated to XNNPACK."""

from .lower import BACKEND

__all__ = ["BACKEND"]
