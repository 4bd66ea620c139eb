"""Federated zeroth-order optimization (specs/fzoos.md): black-box objectives, GP and RFF
surrogates, finite-difference estimators and the local optimiser shared by the FZooS and FedZO
families in `raysim.algorithms.fzoos` / `raysim.algorithms.fedzo`."""
