"""Iterative sketching with DP noise (the sketching paper): the algorithm, sketches, the privacy
accountants, the gradient-leakage attack (`raysim attack`), plots.

Importing this package registers them (the `raysim.plugins` entry point `sketching`)."""
from raysim.plugins import declare
from raysim.algorithms.sketching import algorithm  # noqa: F401  (registers)

declare(commands=["raysim.algorithms.sketching.cli"], reports=["raysim.algorithms.sketching.plots"])
