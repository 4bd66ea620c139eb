"""The training kernels the model-training families share: local SGD on torch models (`local_sgd`: FedAvg in the
FedPAQ form, which families register under their own names and extend), the vectorized local optimizer
(`local_optim`), the stacked minibatch gradients of linear chains (`stacked`) and the vmapped ones of other models in
calls of a fixed number of clients (`vmapped`); the server's default client sampler is `raysim.core.sampling`'s."""
from raysim.training.local_sgd import (BatchPlan, Broadcast, LocalSGD, LocalSGDParams, LossKind, ServerState,
                                       WeightedDelta, batch_plan, batch_plans, class_metrics, qsgd, qsgd_bytes,
                                       qsgd_rows, sample_losses, squared_norm)
from raysim.training.vmapped import in_fixed_calls

__all__ = ["BatchPlan", "Broadcast", "LocalSGD", "LocalSGDParams", "LossKind", "ServerState", "WeightedDelta",
           "batch_plan", "batch_plans", "class_metrics", "qsgd", "qsgd_bytes", "qsgd_rows",
           "in_fixed_calls", "sample_losses", "squared_norm"]
