"""`python -m dssync ...` (what torchrun runs: `torchrun --nproc-per-node 4 -m dssync train ...`)."""

from dssync.cli import main

main()
