"""Eager fp32 on many windows of text, streamed from the checkpoint a block at a time.

Judging an artifact on thousands of tokens needs fp32 logits for all of them; a whole fp32 model of
3B parameters is 12 GB. Here every window's hidden states (tokens x dim, fp32) go through one block
at a time, read from the memory-mapped checkpoint, and the head is applied a window at a time when
the caller asks: the working set is one block and the windows' activations, as in a streamed build.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import torch
import torch.nn.functional as F

from ..model.checkpoint import Checkpoint, TensorSource, fill
from ..model.transformer import Transformer

HEAD_ROWS = 8192  # rows of a head cast to fp32 at a time: a 150k x 896 head is 545 MB in fp32


def head_logits(hidden: torch.Tensor, head: torch.Tensor) -> torch.Tensor:
    """fp32 logits of ``hidden`` [..., dim] through ``head`` [V, dim] kept as stored (e.g. bf16),
    cast a block of rows at a time: the exact fp32 product without an fp32 copy of the head."""
    return torch.cat(
        [F.linear(hidden, head[r : r + HEAD_ROWS].float()) for r in range(0, head.shape[0], HEAD_ROWS)], -1
    )


def streamed_logits(ckpt: Checkpoint, windows: Sequence[Sequence[int]]) -> Iterator[torch.Tensor]:
    """fp32 next-token logits [len(w) - 1, V] of each window (each from position 0), in order."""
    longest = max(len(w) for w in windows)
    with torch.device("meta"):
        model = Transformer(ckpt.args, longest)
    source = TensorSource(ckpt, model)
    model.init_buffers()
    with torch.no_grad():
        fill(model.tok_embeddings, source, "tok_embeddings.", None)
        hs = [model.scale_embedding(model.tok_embeddings(torch.tensor([list(w)])).float()) for w in windows]
        del model.tok_embeddings
        for i, layer in enumerate(model.layers):
            fill(layer, source, f"layers.{i}.")
            hs = [layer(h, model.rope_window(0, h.shape[1]), 0) for h in hs]
            model.layers[i] = torch.nn.Identity()  # its weights are done with
        fill(model.norm, source, "norm.")
        fill(model.output, source, "output.", None)
        head = model.output.weight
        for h in hs:
            x = model.norm(h)[0, :-1]
            yield model.finish_logits(head_logits(x, head))
