"""FZooS and the FedZO family (the FZooS paper): GP/RFF surrogates, zeroth-order estimators, the
synthetic objectives and their sources, plots.

Importing this package registers them (the `raysim.plugins` entry point `fzoos`)."""
from raysim.plugins import declare
from raysim.algorithms.fzoos import fzoos  # noqa: F401  (registers)
from raysim.algorithms.fzoos import fedzo  # noqa: F401  (registers)
from raysim.algorithms.fzoos import sources  # noqa: F401  (registers)

declare(reports=["raysim.algorithms.fzoos.plots"])
