"""The artifact side: what a finished artifact folder holds and how anyone checks it afterwards —
sealed JSON, the manifest's JSON Schema, golden vectors, ``verify`` and ``sign``.

Nothing here imports the build side (pipeline, model, quantization): the build hands it plain
values, and an app team's CI can verify a folder without the tools that made it.
"""
