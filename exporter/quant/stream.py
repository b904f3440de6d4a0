"""Checkpoint -> the module that is exported, in one streamed pass, a layer at a time.

A whole-model load holds every weight in fp32 (4 bytes a parameter) before quantization starts, then
an fp32 copy of a tied head on top: 5 GB and more for a 1B model whose bf16 checkpoint is 2.5 GB. Here
each part of the model is read from the memory-mapped safetensors, run once in fp32 on the held-out
text (the reference logits the gate needs), cast to the recipe's dtype and quantized before the next
part is read. What stays resident is the quantized model plus one layer in fp32.

The result is the same module, tensor for tensor, as ``load_model`` + ``fp32_reference`` +
``prepare_module`` (``tests/test_stream.py`` checks this), because each step is applied to the same
weights in the same order; only the schedule differs.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..gate.reference import head_logits
from ..gate.validate import Reference
from ..model.checkpoint import Checkpoint, TensorSource, fill
from ..model.transformer import Transformer
from ..model.transforms import LastTokenLogits, for_export
from ..plumbing.progress import progress
from ..recipe import Recipe
from .configs import quantize_embedding, quantize_linears

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def stream_module(ckpt: Checkpoint, recipe: Recipe, ids: Sequence[int]) -> tuple[LastTokenLogits, Reference]:
    """The exported module for ``recipe`` and the eager fp32 logits on ``ids``."""
    dtype = DTYPES[recipe.export.dtype]
    quant = recipe.quantization
    with torch.device("meta"):
        model = Transformer(ckpt.args, recipe.export.max_seq_len)
    source = TensorSource(ckpt, model)  # every name and shape checked before any weight is read
    model.init_buffers()  # fp32 RoPE tables and caches: the reference pass runs in fp32
    tokens = torch.tensor([list(ids)])
    with torch.no_grad():
        # Embedding and head, the largest tensors, stay as stored (bf16: half of fp32) and are
        # cast and quantized a block of rows at a time; the reference uses them in fp32 all the
        # same (a bf16 -> fp32 cast is exact).
        fill(model.tok_embeddings, source, "tok_embeddings.", None)
        h = model.scale_embedding(model.tok_embeddings(tokens).float())
        if quant.embedding is None:
            model.tok_embeddings.to(dtype)
        else:
            quantize_embedding(model.tok_embeddings, quant.embedding, dtype)
        rope = model.rope_window(0, tokens.shape[1])
        with progress("load_quantize", total=len(model.layers), unit="layer") as tick:
            for i, layer in enumerate(model.layers):
                fill(layer, source, f"layers.{i}.")
                h = layer(h, rope, 0)
                quantize_linears(layer.to(dtype), quant.linear)
                tick()
        fill(model.norm, source, "norm.")
        h = model.norm(h)
        model.norm.to(dtype)
        # A tied head reads the embedding's tensor again: its own copy, so embedding and head are
        # quantized apart (as ``untie_embeddings`` does for a whole model).
        fill(model.output, source, "output.", None)
        head = model.output.weight
        logits = model.finish_logits(head_logits(h, head))[0, :-1]
        if ckpt.args.tie_word_embeddings and quant.linear is None and quant.embedding is None:
            model.output.weight = model.tok_embeddings.weight  # nothing to quantize apart: stay tied
        elif quant.linear is None:
            model.output.to(dtype)
        else:
            quantize_linears(model.output, quant.linear, dtype)
    model.cast_rope(dtype)
    model.reset_cache()
    return for_export(recipe, model), Reference(list(ids), logits)
