"""``exporter sweep``: size against quality of one checkpoint's artifacts.

Each artifact folder is a point: its model file's size and its perplexity ratio to eager fp32 on the
shipped held-out texts "prose" and "code", read from what ``exporter eval --text`` filed beside the
artifact (a text not scored yet is scored now, by that same evaluation, and filed there). The peer
race's ``export_llm`` program of the same checkpoint (``make bench-peer``, ``peer.json``) joins as a
point of its own: it is scored on the same tokens against the same fp32 model. Output:
``sweep.json`` and ``sweep.png``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ..artifact.manifest import listed_file, read_manifest
from ..errors import ArtifactError
from ..gate.inputs import text_path

# Shipped held-out texts every point is scored on (``exporter eval --text prose|code``).
QUALITY_TEXTS = ("prose", "code")

# (folder, text) -> the artifact's perplexity ratio to fp32 on that shipped text
Scorer = Callable[[Path, str], float]


@dataclass(frozen=True)
class Point:
    source: str  # "ours": an artifact folder; "peer": ExecuTorch's export_llm program of the race
    recipe: str  # the artifact's recipe; for the peer, the recipe it was raced against
    label: str  # what the weights are stored as
    pte_mb: float
    perplexity_ratio: dict[str, float]  # per text in QUALITY_TEXTS
    path: str  # the artifact folder, or the peer race's JSON


def perplexity_key(text: str) -> str:
    """The key of a text's perplexity ratio to fp32 in a peer race row (``peer.json``)."""
    return f"perplexity_ratio_{text}"


def text_key(text: str) -> str:
    """The name ``exporter eval --text TEXT`` files its result under
    (a shipped text's name does not depend on the checkpoint folder)."""
    return text_path(text, Path())[1]


# describe_weight's words, shortened for a chart annotation
_SHORT = ((" int8 dynamic activations", " 8da"), (" weight-only", " w-only"))


def precision_label(manifest: dict[str, Any]) -> str:
    """Parameters per precision from the manifest's ``quantization.precision.summary``, largest
    share first, e.g. ``int4 g32 8da 80% + int8 per-channel 8da 20%``."""
    summary = manifest.get("quantization", {}).get("precision", {}).get("summary", {})
    total = sum(v["parameters"] for v in summary.values())
    if not total:
        return "precision unknown"
    parts = []
    for label, v in sorted(summary.items(), key=lambda kv: -kv[1]["parameters"]):
        short = label.split(",")[0]  # drop the scales' dtype, for brevity
        for long, abbreviation in _SHORT:
            short = short.replace(long, abbreviation)
        parts.append(f"{short} {v['parameters'] / total:.0%}")
    return " + ".join(parts)


def eval_ratios(evals: dict[str, Any]) -> dict[str, float]:
    """Perplexity ratios of the texts in QUALITY_TEXTS among an artifact's filed eval results."""
    found = {t: evals.get(text_key(t)) for t in QUALITY_TEXTS}
    return {t: float(e["perplexity_ratio"]) for t, e in found.items() if e is not None}


def eval_scorer(checkpoint: Path | None) -> Scorer:
    """What ``exporter eval ARTIFACT --text TEXT`` runs; it files the result beside the artifact."""

    def score(folder: Path, text: str) -> float:
        from .evaluate import evaluate

        return float(evaluate(folder, Path(text), checkpoint)["perplexity_ratio"])

    return score


def one_checkpoint(folders: list[Path], manifests: list[dict[str, Any]]) -> str:
    """The digest of the checkpoint every artifact was built from; refuses a mix."""
    first = manifests[0]["model"]
    for folder, manifest in zip(folders, manifests, strict=True):
        model = manifest["model"]
        if model["checkpoint_sha256"] != first["checkpoint_sha256"]:
            raise ArtifactError(
                folder,
                f"built from checkpoint {model['name']!r} ({model['checkpoint_sha256'][:12]}), "
                f"{folders[0]} from {first['name']!r} ({first['checkpoint_sha256'][:12]}): "
                "a sweep is of one checkpoint",
            )
    return str(first["checkpoint_sha256"])


def artifact_point(folder: Path, manifest: dict[str, Any], score: Scorer) -> Point:
    from .evaluate import read_evals

    ratios = eval_ratios(read_evals(folder, manifest))
    for text in QUALITY_TEXTS:
        if text not in ratios:
            ratios[text] = score(folder, text)
    size = listed_file(folder, manifest, "artifact").stat().st_size
    return Point(
        source="ours",
        recipe=manifest["recipe"]["name"],
        label=precision_label(manifest),
        pte_mb=size / 1e6,
        perplexity_ratio={t: ratios[t] for t in QUALITY_TEXTS},
        path=str(folder),
    )


def peer_point(peer_json: Path, digest: str) -> Point:
    """The peer's program from the latest race of checkpoint ``digest`` in ``peer_json``."""
    try:
        races = json.loads(peer_json.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ArtifactError(peer_json, f"cannot read the peer race ({e})") from e
    if not isinstance(races, list):
        raise ArtifactError(peer_json, "not a peer race report (expected the list peer.json holds)")
    matching = [r for r in races if isinstance(r, dict) and r.get("checkpoint_sha256") == digest]
    if not matching:
        raise ArtifactError(
            peer_json, f"no race of the artifacts' checkpoint ({digest[:12]}): run make bench-peer MODEL=<it>"
        )
    race = matching[-1]
    row = race.get("peer", {})
    missing = [t for t in QUALITY_TEXTS if perplexity_key(t) not in row]
    if missing:
        raise ArtifactError(
            peer_json, f"its race of this checkpoint has no {missing[0]} perplexity (random weights?)"
        )
    return Point(
        source="peer",
        recipe=str(race["recipe"]),
        label=str(race.get("peer_label", "export_llm")),
        pte_mb=float(row["pte_mb"]),
        perplexity_ratio={t: float(row[perplexity_key(t)]) for t in QUALITY_TEXTS},
        path=str(peer_json),
    )


def as_report(points: list[Point], name: str, digest: str) -> dict[str, Any]:
    return {
        "checkpoint": {"name": name, "sha256": digest},
        "texts": list(QUALITY_TEXTS),
        "points": [asdict(p) for p in points],
    }


def sweep(
    folders: list[Path],
    peer_json: Path | None = None,
    checkpoint: Path | None = None,
    score: Scorer | None = None,
) -> dict[str, Any]:
    """One point per artifact folder (and the peer's, given its race). Every manifest is read and
    the checkpoints compared before anything is evaluated."""
    if not folders:
        raise ArtifactError(None, "no artifact folders to sweep")
    manifests = [read_manifest(f) for f in folders]
    digest = one_checkpoint(folders, manifests)
    scorer = score or eval_scorer(checkpoint)
    points = [artifact_point(f, m, scorer) for f, m in zip(folders, manifests, strict=True)]
    if peer_json is not None:
        points.append(peer_point(peer_json, digest))
    return as_report(points, manifests[0]["model"]["name"], digest)


def markdown(report: dict[str, Any]) -> str:
    texts = report["texts"]
    lines = [
        "| source | recipe | precision | .pte MB | "
        + " | ".join(f"perplexity ratio {t}" for t in texts)
        + " |",
        "|---" * (4 + len(texts)) + "|",
    ]
    for p in report["points"]:
        ratios = " | ".join(f"{p['perplexity_ratio'][t]:.4f}" for t in texts)
        lines.append(f"| {p['source']} | {p['recipe']} | {p['label']} | {p['pte_mb']:.2f} | {ratios} |")
    return "\n".join(lines) + "\n"


_COLOURS = {"ours": "#4878a8", "peer": "#c44"}
_SOURCES = {"ours": "exporter", "peer": "ExecuTorch export_llm"}
_MARKERS = "os^vD"


def chart(report: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    points, texts = report["points"], report["texts"]
    fig, ax = plt.subplots(figsize=(10, 6))
    for source, colour in _COLOURS.items():
        mine = [p for p in points if p["source"] == source]
        for text, marker in zip(texts, _MARKERS, strict=False):
            if mine:
                ax.scatter(
                    [p["pte_mb"] for p in mine],
                    [p["perplexity_ratio"][text] for p in mine],
                    marker=marker,
                    color=colour,
                    s=60 if source == "peer" else 40,
                    label=f"{_SOURCES[source]}: {text}",
                )
    middle = (min(p["pte_mb"] for p in points) + max(p["pte_mb"] for p in points)) / 2
    for p in points:
        # once per artifact, beside its worse text; towards the inside of the chart, so that the
        # label of the largest artifact is not cut off at the right edge
        top = max(p["perplexity_ratio"].values())
        name = p["label"] if p["source"] == "peer" else f"{p['recipe']}: {p['label']}"
        right = p["pte_mb"] > middle
        ax.annotate(
            name,
            (p["pte_mb"], top),
            textcoords="offset points",
            xytext=(-6 if right else 6, 4),
            ha="right" if right else "left",
            fontsize=7,
            color=_COLOURS[p["source"]],
        )
    ax.axhline(1.0, color="grey", linestyle=":", linewidth=1, label="fp32 eager")
    ax.set_xlabel("model file size (MB)")
    ax.set_ylabel("perplexity / fp32 eager perplexity")
    ax.set_title(f"{report['checkpoint']['name']}: size against quality on shipped held-out texts")
    ax.margins(x=0.25, y=0.1)  # room for the annotations of the outermost points
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="best")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_sweep(report: dict[str, Any], out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / "sweep.json", out / "sweep.png"]
    paths[0].write_text(json.dumps(report, indent=2) + "\n")
    chart(report, paths[1])
    return paths
