"""The only package that touches ``torch.distributed``, megatron-core's parallel state and mpi4py:
launch (torchrun / srun / mpirun), the parallel context, collectives over explicit groups, and
DP-global pruning plumbing."""
