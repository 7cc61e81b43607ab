"""Torch-free policy: sequences, the paged block manager, the scheduler, the recurrent-state slot pool."""
