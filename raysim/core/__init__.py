"""What every other part of raysim stands on and which imports nothing of raysim's own: the random streams keyed
by (seed, round, client, purpose) that make every number reproducible (`rng`), one-line messages for invalid
fields (`field_errors`), the installed distribution and its optional extras (`distribution`), the summed
memory of a run's processes that the benchmarks report (`memory`), and from how many clients a call the compiled
kernels take over (`compiled`)."""
