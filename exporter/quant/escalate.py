"""More precision where text from a third source says the quantized model needs it.

The streamed tuning (``sequential.py``) chooses each block's int8 linears from that block's own
output error, a measure that means different things per family (SmolLM2's and Qwen2.5's later
blocks carry most of their output energy on the first position, Gemma 3's do not; docs/quality.md):
one recipe then leaves Qwen2.5-0.5B a little over its aim and Gemma 3 270M over its gate's bar.
Here the whole quantized model is scored instead, against fp32, on *selection* texts — prose and
code from sources that are neither calibration text (what the weights were fitted on) nor judging
text (what the gate and the user's figures are measured on, which must stay out of every choice).

The steps on offer: every block's int8 choice pushed on to its output-error target halved once,
twice or three times more (gains need not be concave in bytes: a level that buys little can open
one that buys much), along the order each block measured while it was tuned
(``SolvedBlock.tail``: one more linear at a time, each measured with the ones before it; their int8
solutions wait on disk); and the head's costliest 1/128, 1/32 or 1/8 of its rows to int8 (a
``SplitHead``, rows ranked by ``vocabulary.row_costs``), or all of it (solved when first tried). Each round
measures the steps that fit the size budget and takes the one with the most gain per byte while the
ratio over all selection tokens is over ``aim``: within ``aim_size_ratio`` times the weights'
all-4-bit bytes, or, while it is over ``bar`` (the gate's bar), within ``max_size_ratio``. A model
that needs nothing is left as the recipe made it.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..gate.judge import ratio_interval
from ..model.head import SplitHead, head_parts, linear_of, other_rows
from ..model.transformer import Transformer
from ..recipe import Escalation, LinearQuant, StreamedGptq
from .configs import stored_bytes_estimate
from .gptq import INT8, Quantized, to_torchao
from .vocabulary import LogitBlocks, head_blocks, solve_head

log = logging.getLogger("exporter")


def blocked_nll(
    blocks: LogitBlocks, hidden: torch.Tensor, ids: Sequence[int], place: torch.Tensor | None = None
) -> torch.Tensor:
    """Next-token NLL [T - 1] of final hidden states [T, E], the logits a block of vocabulary rows
    at a time (``vocabulary.head_blocks``): no [T, V] tensor and no whole head in fp32 (Gemma 3's
    262k-row head dequantized is 671 MB). ``place``: where each entry's row is among the blocks'
    rows, where they are not in vocabulary order (``SplitHead``)."""
    target = torch.tensor(list(ids[1:]))
    if place is not None:
        target = place[target]
    norms, picked, start = [], torch.zeros(len(target)), 0
    for block in blocks(hidden):
        block = block.float()
        norms.append(block.logsumexp(-1))
        inside = (target >= start) & (target < start + block.shape[1])
        picked[inside] = block[inside, target[inside] - start]
        start += block.shape[1]
    return torch.stack(norms).logsumexp(0) - picked


def fp32_nll(
    model: Transformer, head: torch.Tensor, hidden: torch.Tensor, ids: Sequence[int]
) -> torch.Tensor:
    """The fp32 model's NLL from its last block's outputs [1, T, E] (the head as stored, cast a
    block of rows at a time)."""
    rows = head_blocks(lambda a, b: head[a:b].float(), head.shape[0], model.finish_logits)
    return blocked_nll(rows, model.norm(hidden)[0, :-1], ids)


def rows_of(weight: torch.Tensor, index: slice | torch.Tensor) -> torch.Tensor:
    """Some rows of a weight, a torchao tensor kept one (a head's product then rounds activations
    as the artifact does; rows dequantize as the whole would, bit for bit)."""
    from torchao.quantization import IntxUnpackedToInt8Tensor

    if not isinstance(weight, IntxUnpackedToInt8Tensor):
        return weight[index]
    return IntxUnpackedToInt8Tensor(
        weight.qdata[index],
        weight.scale[index],
        weight.zero_point[index],
        weight.target_dtype,
        weight.block_size,
        weight.dtype,
        weight.activation_quantization,
    )


def head_rows(weight: torch.Tensor, a: int, b: int) -> torch.Tensor:
    return rows_of(weight, slice(a, b))


def quantized_nll(model: Transformer, ids: Sequence[int]) -> torch.Tensor:
    """The quantized model's NLL on ``ids``. The embedding rows are looked up by hand: torchao's
    lookup dequantizes the whole table first (Qwen2.5's 151,936 x 896: the escalation peaked 1.6 GB
    over the tuning's other stages with it)."""
    with torch.no_grad():
        tokens = torch.tensor([list(ids)])
        rows = rows_of(model.tok_embeddings.weight, tokens[0])
        looked_up = rows.dequantize() if hasattr(rows, "dequantize") else rows
        x = model.hidden(tokens, torch.tensor([0]), embedded=looked_up[None])[0, :-1]
        model.reset_cache()
        linears, place = head_parts(model.output)
        parts = [
            head_blocks(partial(head_rows, linear.weight), linear.weight.shape[0], model.finish_logits)
            for linear in linears
        ]
        return blocked_nll(lambda h: (block for part in parts for block in part(h)), x, ids, place)


@dataclasses.dataclass(frozen=True)
class Raise:
    """One linear to int8: the module, its int8 solution (saved to disk while it waits) and the
    bytes it adds."""

    name: str
    module: nn.Linear
    path: Path
    extra: float


@dataclasses.dataclass
class Ladder:
    """One block's further raises in measured order, with the block's error after each."""

    chosen_error: float
    raises: list[Raise]
    errors: list[float]
    taken: int = 0

    def count_for(self, target: float) -> int:
        """How many of the raises reach ``target`` (all of them where none does)."""
        if self.chosen_error <= target:
            return 0
        return next((j + 1 for j, e in enumerate(self.errors) if e <= target), len(self.raises))


@dataclasses.dataclass
class Step:
    name: str
    extra: float
    apply: Callable[[], Callable[[], None]]  # applies the step; returns its undo


def block_step(
    ladders: Sequence[Ladder], target: float, load: Callable[[Raise], torch.Tensor]
) -> Step | None:
    """All blocks to ``target``: the raises not yet taken, or None where there are none."""
    moves = [(ladder, ladder.count_for(target)) for ladder in ladders]
    todo = [(ladder, n) for ladder, n in moves if n > ladder.taken]
    if not todo:
        return None
    extra = sum(r.extra for ladder, n in todo for r in ladder.raises[ladder.taken : n])

    def apply() -> Callable[[], None]:
        saved = [
            (ladder, ladder.taken, [(r.module, r.module.weight) for r in ladder.raises[ladder.taken : n]])
            for ladder, n in todo
        ]
        for ladder, n in todo:
            for r in ladder.raises[ladder.taken : n]:
                r.module.weight = nn.Parameter(load(r), requires_grad=False)
            ladder.taken = n

        def undo() -> None:
            for ladder, taken, weights in saved:
                ladder.taken = taken
                for module, weight in weights:
                    module.weight = weight

        return undo

    return Step(f"blocks to {target:.2g}", extra, apply)


@dataclasses.dataclass(frozen=True)
class Score:
    """A perplexity ratio to fp32 on one text, with its 95% block-bootstrap interval."""

    ratio: float
    low: float
    high: float


Scores = dict[str, Score]
# every selection text's tokens as one sample: what the escalation decides on. The gate judges each
# kind, but the larger of two noisy ratios is biased up, and one of 1,024 tokens spreads +-0.04
POOLED = "pooled"
LOOKAHEAD = 3  # block levels offered at once


def selection_measure(
    model: Transformer, selection: dict[str, tuple[list[list[int]], list[torch.Tensor]]]
) -> Callable[[], Scores]:
    """The quantized ``model``'s perplexity ratio to fp32 on each selection text: ``selection``
    holds each text's windows and the fp32 NLL of their tokens."""

    def ratios() -> Scores:
        out, gaps = {}, []
        for name, (windows, reference) in selection.items():
            nll, fp32 = torch.cat([quantized_nll(model, w) for w in windows]), torch.cat(reference)
            out[name] = _score(nll, fp32)
            gaps.append((nll, fp32))
        out[POOLED] = _score(torch.cat([n for n, _ in gaps]), torch.cat([f for _, f in gaps]))
        return out

    return ratios


def _score(nll: torch.Tensor, fp32: torch.Tensor) -> Score:
    ratio = math.exp(float((nll - fp32).mean()))
    low, high = ratio_interval(nll, fp32) or (ratio, ratio)
    return Score(ratio, low, high)


def escalate(
    settings: Escalation,
    ratios: Callable[[], Scores],
    ladders: Sequence[Ladder],
    head_steps: Callable[[], Sequence[Step]],
    target: float,
    bytes_now: float,
    all4_bytes: float,
    load: Callable[[Raise], torch.Tensor],
) -> dict[str, Any]:
    """Take steps while ``ratios()`` (the model's on the selection texts) says so (the module's
    docstring); ``target`` is the blocks' output-error target as tuned. Returns the record."""
    now = ratios()
    start = {"step": "recipe", "size_ratio": round(bytes_now / all4_bytes, 4), "ratios": _rounded(now)}
    history: list[dict[str, Any]] = [start]
    tried: list[dict[str, Any]] = []
    level = 0  # block steps taken: the blocks are at target * 0.5**level
    while (worst := now[POOLED].ratio) > settings.aim:
        over_bar = worst > settings.bar
        limit = (settings.max_size_ratio if over_bar else settings.aim_size_ratio) * all4_bytes
        # the next LOOKAHEAD block levels, each from where the blocks are: a level that buys
        # little can open one that buys much (Gemma 3 270M: 0.002 for 2.7% of the bytes, then
        # 0.04 for 4.7% more), which one level at a time would lose to a costlier head
        offers: list[tuple[Step, int]] = []
        for next_level in range(level + 1, settings.max_steps + 1):
            step = block_step(ladders, target * 0.5**next_level, load)
            if step is not None and (not offers or step.extra > offers[-1][0].extra):
                offers.append((step, next_level))
            if len(offers) == LOOKAHEAD:
                break
        offers.extend((step, level) for step in head_steps())
        offers = [(s, k) for s, k in offers if bytes_now + s.extra <= limit]
        best: tuple[float, Step, int, Scores] | None = None
        for step, next_level in offers:
            undo = step.apply()
            measured = ratios()
            undo()
            size = round((bytes_now + step.extra) / all4_bytes, 4)
            tried.append({"step": step.name, "size_ratio": size, "ratios": _rounded(measured)})
            gain = (worst - measured[POOLED].ratio) / step.extra
            if best is None or gain > best[0] * (1 + 1e-9):  # a tie goes to the smaller step
                best = (gain, step, next_level, measured)
        if best is None or best[0] <= 0:
            break
        _, step, level, now = best
        step.apply()
        bytes_now += step.extra
        size = round(bytes_now / all4_bytes, 4)
        history.append({"step": step.name, "size_ratio": size, "ratios": _rounded(now)})
        log.info("[escalate] %s: weights x%.3f of all-4-bit, ratios %s", step.name, size, _rounded(now))
    return {
        "method": "whole-model perplexity ratio on selection texts, the step with the most gain per byte",
        "texts": list(settings.texts),
        "tokens": settings.tokens,
        "aim": settings.aim,
        "aim_size_ratio": settings.aim_size_ratio,
        "bar": settings.bar,
        "max_size_ratio": settings.max_size_ratio,
        "taken": history,
        "tried": tried,
    }


def _rounded(scores: Scores) -> dict[str, list[float]]:
    """Each text's ratio and interval, as the manifest gives them."""
    return {k: [round(s.ratio, 4), round(s.low, 4), round(s.high, 4)] for k, s in scores.items()}


def ladder(linears: dict[str, nn.Linear], record: dict[str, Any], spill: Path, base: LinearQuant) -> Ladder:
    """The block's further raises (``SolvedBlock.tail``), their int8 solutions saved to ``spill``."""
    reserve: dict[str, Quantized] = record.pop("reserve")
    tail: list[tuple[str, float]] = record.pop("tail")
    raises = []
    for name, _ in tail:
        path = spill.with_name(f"{spill.name}.{name}.pt")
        torch.save(reserve[name], path)
        shape = linears[name].weight.shape
        extra = stored_bytes_estimate(shape, INT8) - stored_bytes_estimate(shape, base)
        raises.append(Raise(name, linears[name], path, extra))
    return Ladder(record["chosen"], raises, [e for _, e in tail])


def loader(dtype: torch.dtype) -> Callable[[Raise], torch.Tensor]:
    def load(r: Raise) -> torch.Tensor:
        return to_torchao(torch.load(r.path, weights_only=False), INT8, dtype)

    return load


def weight_bytes(
    model: Transformer,
    linears: Sequence[dict[str, nn.Linear]],
    blocks: Sequence[dict[str, Any]],
    vocab: dict[str, Any],
    base: LinearQuant,
) -> tuple[float, float]:
    """The weights' stored bytes all at 4 bits, and as chosen (block linears, head, embedding)."""
    all4 = now = 0.0
    for block_linears, record in zip(linears, blocks, strict=True):
        for name, linear in block_linears.items():
            shape = linear.weight.shape
            all4 += stored_bytes_estimate(shape, base)
            now += stored_bytes_estimate(shape, INT8 if name in record["int8"] else base)
    vocab_shape = torch.Size((model.args.vocab_size, model.args.dim))
    entries = model.args.vocab_size * model.args.dim
    four = stored_bytes_estimate(vocab_shape, base)  # 4-bit groups with bf16 scales: the embedding's too
    all4 += 2 * four
    now += stored_bytes_estimate(vocab_shape, INT8) if vocab["head_bits"] == 8 else four
    bits = vocab["embedding_bits"]
    now += entries * 4 if bits is None else entries * (bits / 8 + 2 / base.group_size)
    return all4, now


# the head's costliest 1/128, 1/32 and 1/8 of its rows offered at 8 bits, then all of them: a few
# rows hold most of a 4-bit head's cost (docs/quality.md: Gemma 3 270M's head alone, 1.125 / 1.119 in
# perplexity on other prose / code, is 1.018 / 1.030 with its costliest 1,000 rows at 8 bits)
HEAD_SHARES = (128, 32, 8)


class HeadRows:
    """The head's rows to int8 per channel, costliest first (``ranking``, ``vocabulary.row_costs``):
    a share of them as a ``SplitHead``, or the whole head, each offered while larger than what is
    taken. Each int8 solve happens when first tried (rows are independent given the Hessian: the
    first n rows of a solve of more are the solve of those n)."""

    def __init__(
        self,
        model: Transformer,
        head: torch.Tensor,
        hessian: torch.Tensor,
        ranking: torch.Tensor,
        settings: StreamedGptq,
        base: LinearQuant,
        dtype: torch.dtype,
    ) -> None:
        self.model, self.head, self.hessian, self.ranking = model, head, hessian, ranking
        self.settings, self.base, self.dtype = settings, base, dtype
        assert isinstance(model.output, nn.Linear)  # the solved 4-bit head
        self.int4 = model.output
        self.vocab = head.shape[0]
        self.sizes = sorted({max(1, self.vocab // k) for k in HEAD_SHARES} | {self.vocab})
        self.taken = 0
        self._solved: dict[str, torch.Tensor] = {}

    def extra(self, rows: int) -> float:
        """Bytes over the 4-bit head with ``rows`` of it at 8 bits (a split head's int32 index too)."""
        if rows == 0:
            return 0.0
        shape = torch.Size((rows, self.head.shape[1]))
        more = stored_bytes_estimate(shape, INT8) - stored_bytes_estimate(shape, self.base)
        return more + (4.0 * self.vocab if rows < self.vocab else 0.0)

    def steps(self) -> list[Step]:
        """The sizes larger than the one taken, each as a step from it."""
        return [
            Step(self.name(n), self.extra(n) - self.extra(self.taken), partial(self._apply, n))
            for n in self.sizes
            if n > self.taken
        ]

    def name(self, rows: int) -> str:
        return "head to int8" if rows == self.vocab else f"head's costliest {rows} rows to int8"

    def _apply(self, rows: int) -> Callable[[], None]:
        old, taken = self.model.output, self.taken
        # the model's head is typed a Linear: it is one through every stage until this last one
        setattr(self.model, "output", self._module(rows))  # noqa: B010
        self.taken = rows

        def undo() -> None:
            self.model.output, self.taken = old, taken

        return undo

    def _int8(self, key: str, rows: torch.Tensor | None) -> torch.Tensor:
        if key not in self._solved:
            head = self.head if rows is None else self.head[rows]
            solved = solve_head(head, self.hessian, INT8, self.settings)
            self._solved[key] = to_torchao(solved, INT8, self.dtype)
        return self._solved[key]

    def _module(self, rows: int) -> nn.Module:
        if rows == self.vocab:
            return linear_of(self._int8("whole", None))
        most = max(n for n in self.sizes if n < self.vocab)
        # rows picked by index, not sliced: a slice is a view, and export writes a view's whole
        # storage (Qwen2.5's .pte carried all 18,992 solved rows for 4,748 used: +12.8 MB)
        first = rows_of(self._int8("rows", self.ranking[:most]), torch.arange(rows))
        picked = self.ranking[:rows]
        rest = rows_of(self.int4.weight, other_rows(picked, self.vocab))
        return SplitHead(linear_of(first), linear_of(rest), picked)
