"""Built-in algorithm families; importing this package registers them."""
from raysim.algorithms import fedavg, fedlrgd, kernel  # noqa: F401
