"""Built-in algorithm families; importing this package registers them."""
from raysim.algorithms import fedavg, fedfisher, fedlrgd, fedzo, fzoos, kernel, oneshot, sketching  # noqa: F401
