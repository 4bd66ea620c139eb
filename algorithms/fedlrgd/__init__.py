"""FedLRGD (Algorithm 1 of the FedLRGD paper): its algorithm, smooth sources and
paper networks; `raysim compare` (Γ to accuracy ε) and `raysim rank` (App. C) commands; plots.

Importing this package registers them (the `raysim.plugins` entry point `fedlrgd`)."""
from raysim.plugins import declare
from raysim.algorithms.fedlrgd import algorithm  # noqa: F401  (registers)
from raysim.algorithms.fedlrgd import nets  # noqa: F401  (registers)
from raysim.algorithms.fedlrgd import sources  # noqa: F401  (registers)

declare(commands=["raysim.algorithms.fedlrgd.cli"], reports=["raysim.algorithms.fedlrgd.plots"])
