"""Quantization: ``configs`` maps a recipe onto torchao configs (no quantization math here),
``precision`` measures which linears stay int8, ``qat`` trains with torchao's fake quantizers,
``tune`` runs both on calibration text, ``stream`` quantizes a checkpoint one block at a time.

May import gate (tuning is judged with the gate's measures), artifact, backends, model, recipe and
plumbing; never build, measure or cli.
"""
