"""Model families: one small module each, saying which ``architectures`` it reads, how its
``config.json`` maps onto ``ModelArgs``'s named features and how its tensor names map onto ours.

May import: exporter.model.args, exporter.errors (nothing that imports torch)."""

from __future__ import annotations

from .base import ConfigReader, Family
from .gemma3 import GEMMA3
from .granite import GRANITE
from .llama import LLAMA, MISTRAL
from .olmo2 import OLMO2
from .phi3 import PHI3
from .qwen import QWEN2, QWEN3
from .smollm3 import SMOLLM3

FAMILIES: dict[str, Family] = {
    f.name: f for f in (LLAMA, MISTRAL, QWEN2, QWEN3, GEMMA3, GRANITE, OLMO2, SMOLLM3, PHI3)
}
BY_ARCHITECTURE: dict[str, Family] = {a: f for f in FAMILIES.values() for a in f.architectures}

__all__ = ["BY_ARCHITECTURE", "FAMILIES", "ConfigReader", "Family"]
