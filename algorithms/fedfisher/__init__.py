"""FedFisher, one-shot (the FedFisher paper): Diag and K-FAC Fisher merging, the one-shot baselines
(FedAvg, FisherMerge, RegMean, OTFusion, PFNM), the paper's models, `raysim oneshot`, plots.

Importing this package registers them (the `raysim.plugins` entry point `fedfisher`)."""
from raysim.plugins import declare
from raysim.algorithms.fedfisher import algorithm  # noqa: F401  (registers)
from raysim.algorithms.fedfisher import baselines  # noqa: F401  (registers)
from raysim.algorithms.fedfisher import models  # noqa: F401  (registers)

declare(commands=["raysim.algorithms.fedfisher.cli"], reports=["raysim.algorithms.fedfisher.plots"])
