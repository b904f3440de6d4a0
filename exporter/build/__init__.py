"""The build: ``pipeline`` (checkpoint -> quantized, exported, lowered, validated, published artifact,
a flat sequence of stage functions), ``plan`` (build keys and the job matrix, torch-free), ``cache``
(reuse of a finished artifact with the same key) and ``fits`` (recipe checks against the model's
shapes).

May import quant, gate, artifact, backends, model, recipe and plumbing; never measure or cli.
"""
