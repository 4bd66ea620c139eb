"""When the runtime's compiled kernels (numba: the host's batch plans, the reduction tree's sums) take a call: from
COMPILED_MIN clients. Below it NumPy and torch serve, the same numbers, so a run of small rounds never pays numba's
import and the kernels' load (0.3-0.5 s once a process, a few seconds the first time they compile)."""
COMPILED_MIN = 2048
