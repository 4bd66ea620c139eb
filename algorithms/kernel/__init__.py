"""Kernel FedAvg/FedProx in an RKHS and the federation gain (the kernel FedAvg/FedProx paper): the
algorithms, kernels, regression sources, figures and plots.

Importing this package registers them (the `raysim.plugins` entry point `kernel`)."""
from raysim.plugins import declare
from raysim.algorithms.kernel import algorithm  # noqa: F401  (registers)
from raysim.algorithms.kernel import sources  # noqa: F401  (registers)

declare(reports=["raysim.algorithms.kernel.plots"])
