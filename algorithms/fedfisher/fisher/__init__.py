"""Fisher information of torch classifiers: the exact diagonal and K-FAC factors (the FedFisher paper) with a
diagonal for parameters outside Linear/Conv layers (README), and their compression for upload (App. C)."""
from raysim.algorithms.fedfisher.fisher.diag import diagonal_fisher
from raysim.algorithms.fedfisher.fisher.kfac import KFAC, KFACBlock, kfac_fisher
from raysim.algorithms.fedfisher.fisher.layers import (FisherEstimate, FisherType, Layer, curvature_layers,
                                                       fisher_partition, layer_matrix, split_layer_matrix)

__all__ = ["FisherEstimate", "FisherType", "KFAC", "KFACBlock", "Layer", "curvature_layers", "diagonal_fisher",
           "fisher_partition", "kfac_fisher", "layer_matrix", "split_layer_matrix"]
