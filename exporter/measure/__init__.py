"""Measurement beside the build: ``bench`` (speed and memory of artifacts against eager), ``evaluate``
(perplexity ratio and agreement of an artifact on a text), ``sweep`` (quality against size).

May import everything below it on the data path (build, quant, gate, artifact, backends, model,
recipe, plumbing); nothing in the package imports it but the command line.
"""
