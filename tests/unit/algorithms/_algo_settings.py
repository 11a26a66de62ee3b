"""Hypothesis settings shared by the algorithm tests: deterministic examples, no per-example
deadline (shared CPUs are noisy; the first MDAP call compiles the numba kernels)."""

from hypothesis import HealthCheck, settings

PROPERTY = settings(
    deadline=None,
    max_examples=50,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
