# Run with `torchrun --nproc-per-node 2 post_local_sgd.py`: PyTorch's PostLocalSGDOptimizer with a
# DS-Sync averager. DDP runs the first 8 steps (all ranks identical), then each rank steps alone
# and averages its parameters with this step's partner.
import time

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks.post_localSGD_hook import (
    PostLocalSGDState,
    post_localSGD_hook,
)
from torch.distributed.optim import PostLocalSGDOptimizer
from torch.nn.parallel import DistributedDataParallel as DDP

import dssync

dist.init_process_group("gloo")
torch.manual_seed(0)  # the same initial model on every rank
model = DDP(torch.nn.Linear(8, 2))
# subgroup=None means "one group per machine" and needs CUDA; on CPU give each rank its own.
own, _ = dist.new_subgroups(group_size=1)
model.register_comm_hook(PostLocalSGDState(None, own, start_localSGD_iter=8), post_localSGD_hook)
# [start:averager]
averager = dssync.GroupAverager(dssync.Shuffle(2, seed=0), warmup_steps=8)
opt = PostLocalSGDOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), averager)
sched = torch.optim.lr_scheduler.StepLR(opt.optim, step_size=16)  # a scheduler takes opt.optim
# [end:averager]

torch.manual_seed(1 + dist.get_rank())  # each rank its own data
for _ in range(32):
    x, y = torch.randn(32, 8), torch.randint(0, 2, (32,))
    torch.nn.functional.cross_entropy(model(x), y).backward()
    opt.step()
    opt.zero_grad()
    sched.step()
dssync.GroupAverager(dssync.Global()).average_parameters(model.parameters())  # one final model
print(f"rank {dist.get_rank()}: weight norm {model.module.weight.norm().item():.6f}")
dist.destroy_process_group()
time.sleep(0.1)  # the DDP hook's last all-reduce on gloo: see port_ddp.py and docs/known-issues.md
