"""The only package that touches ``torch.distributed``, megatron-core's parallel state and mpi4py:
launch (torchrun / srun / mpirun), the parallel context, collectives over explicit groups,
DP-global pruning plumbing, and the all-gather staging probe of the memory-timeline check."""
