# Run with `torchrun --nproc-per-node 2 uneven_data.py`: ranks with different numbers of batches.
# Under torch's Join a rank that runs out keeps serving its groups until every rank is done.
import torch
import torch.distributed as dist
from torch.distributed.algorithms.join import Join

import dssync

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(rank)
batches = [(torch.randn(16, 8), torch.randint(0, 2, (16,))) for _ in range(10 + 5 * rank)]

model = torch.nn.Linear(8, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
sync = dssync.DSSync(model, schedule=dssync.Shuffle(2, seed=0))

with Join([sync]):  # costs one all-reduce per step while active, as with DDP
    for x, y in batches:
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        opt.zero_grad()
        sync.step()
sync.average_all()
print(f"rank {rank}: {len(batches)} batches, weight norm {model.weight.norm().item():.6f}")
dist.destroy_process_group()
