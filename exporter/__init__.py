"""exporter: decoder-only checkpoints -> ExecuTorch .pte / AOTInductor .pt2 artifacts.

The sub-packages follow the data path, top to bottom; a module imports only from its own room or
from rooms below it (``tests/test_layout.py`` walks the imports to keep it so):

- ``cli`` — the command line: parses, calls one library function, prints.
- ``measure/`` — bench, eval, sweep: measurement beside the build (they build and run artifacts).
- ``build/`` — the pipeline, the build plan and its cache, recipe-vs-model checks.
- ``quant/`` — torchao configs, the measured precision plan, QAT tuning, the streamed quantized load.
- ``gate/`` — the validation gate: its inputs, steppers (greedy, scoring), generation.
- ``artifact/`` — what a finished folder holds and how anyone checks it: manifest, publish, seal,
  golden vectors, verify, sign, release, summary.
- ``backends`` (top-level package) — lowering to .pte / .pt2 and loading them back.
- ``model/`` — the one model definition, its args, checkpoint loading, tokenizer, chat templates,
  source transforms.
- ``recipe`` — the recipe every stage reads its settings from.
- ``plumbing/`` and ``errors`` — progress, memory, threads, hashing, native logs; the exceptions.

Development tools (peer race, ARM64 check, real-model fetcher, trainer) live in ``tools/`` at the
repository root, outside the installed package.
"""

__version__ = "0.1.0"
