"""Server-side one-shot merges of local models (specs/fedfisher.md §2.6, §4): FedAvg, FedFisher's
objective and solver, FisherMerge, RegMean, OTFusion and PFNM."""
