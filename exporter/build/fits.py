"""Recipe checks that need the model's shapes; cheap, so the build runs them right after config.json
is read and before any weights are."""

from __future__ import annotations

from pathlib import Path

from ..errors import RecipeError
from ..model.args import ModelArgs
from ..recipe import Recipe


def check_fits(recipe: Recipe, args: ModelArgs, path: Path) -> None:
    """Checks that need the model's shapes; cheap, so they run before any weights are read."""
    mixed = recipe.quantization.mixed
    for linear in (recipe.quantization.linear, *(mixed.candidates if mixed else ())):
        if linear is None or linear.group_size == 0:
            continue
        in_features = {
            "attention q/k/v and feed-forward gate/up (hidden_size)": args.dim,
            "attention output (n_heads * head_dim)": args.n_heads * args.head_dim,
            "feed-forward down (intermediate_size)": args.hidden_dim,
        }
        for what, size in in_features.items():
            if size % linear.group_size:
                raise RecipeError(
                    path,
                    f"quantization.linear.group_size: {linear.group_size} does not divide the "
                    f"input size {size} of the {what} layers",
                )
    emb = recipe.quantization.embedding
    if emb is not None and args.dim % emb.group_size:
        raise RecipeError(
            path,
            f"quantization.embedding.group_size: {emb.group_size} does not divide the embedding "
            f"dimension {args.dim}",
        )
    if recipe.export.max_seq_len > args.max_position_embeddings:
        raise RecipeError(
            path,
            f"export.max_seq_len: {recipe.export.max_seq_len} exceeds the model's "
            f"max_position_embeddings {args.max_position_embeddings}",
        )
