"""dssync: divide-and-shuffle synchronization for data-parallel PyTorch training."""
