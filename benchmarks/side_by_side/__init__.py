"""The pieces of benchmarks/petals_side_by_side.py: Petals' virtualenv, the checkpoints, the timing client."""
