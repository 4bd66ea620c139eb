"""The training kernels the model-training families share: local SGD on torch models (`local_sgd`: FedAvg in the
FedPAQ form, which families register under their own names and extend), the vectorized local optimizer
(`local_optim`), the stacked minibatch gradients of linear chains (`stacked`) and the server's default client
sampler (`sampling`)."""
from raysim.training.local_sgd import (BatchPlan, Broadcast, LocalSGD, LocalSGDParams, LossKind, ServerState,
                                       WeightedDelta, batch_plan, batch_plans, class_metrics, qsgd, qsgd_bytes,
                                       qsgd_rows, sample_losses, squared_norm)
from raysim.training.sampling import sample_clients

__all__ = ["BatchPlan", "Broadcast", "LocalSGD", "LocalSGDParams", "LossKind", "ServerState", "WeightedDelta",
           "batch_plan", "batch_plans", "class_metrics", "qsgd", "qsgd_bytes", "qsgd_rows", "sample_clients",
           "sample_losses", "squared_norm"]
