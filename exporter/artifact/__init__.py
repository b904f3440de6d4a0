"""The artifact side: what a finished artifact folder holds and how anyone checks it afterwards —
the manifest and its JSON Schema, atomic publishing, sealed JSON, golden vectors, ``verify``,
``sign``, the release bundle and the one-screen summary.

May import backends (to load a model file back), model (checkpoint facts), recipe and plumbing;
never gate, quant, build, measure or cli: an app team's CI can verify a folder without the tools
that built it.
"""
