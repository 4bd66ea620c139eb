"""Server-side one-shot merges of local models (the FedFisher paper): FedAvg, FedFisher's
objective and solver, FisherMerge, RegMean, OTFusion and PFNM."""
