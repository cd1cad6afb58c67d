# Run with `torchrun --nproc-per-node 2 port_dssync.py`: port_ddp.py with DS-Sync in place of DDP.
import math
import tempfile

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

import dssync

# [start:device]
device = dssync.local_device()  # cuda:LOCAL_RANK where every rank has a GPU, else the CPU
if device.type == "cuda":
    torch.cuda.set_device(device)
dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
# [end:device]
rank = dist.get_rank()


def dataset(n: int, seed: int) -> TensorDataset:
    """n points of 16 features, labelled 0-3 by a fixed random teacher (the same on every rank)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 16, generator=g)
    teacher = torch.randn(16, 4, generator=torch.Generator().manual_seed(99))
    return TensorDataset(x, (x @ teacher).argmax(1))


train_set, (val_x, val_y) = dataset(1024, seed=0), dataset(256, seed=1).tensors
sampler = DistributedSampler(train_set, shuffle=True, seed=0)  # each rank its own shard
loader = DataLoader(train_set, batch_size=32, sampler=sampler)
epochs = 2
total = epochs * len(loader)

torch.manual_seed(0)
# [start:wrap]
layers = [torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4)]
model = torch.nn.Sequential(*layers).to(device)  # on its device before DSSync wraps it
opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
sync = dssync.DSSync(model, optimizer=opt)  # no DDP wrapper: every rank starts from rank 0's model
# [end:wrap]
# [start:schedule]
sched = torch.optim.lr_scheduler.LambdaLR(  # unchanged: each rank steps its own, alike
    opt, lambda s: min(1.0, (s + 1) / 4) * 0.5 * (1 + math.cos(math.pi * s / total))
)
# [end:schedule]


@torch.no_grad()
def evaluate(net: torch.nn.Module) -> float:
    return F.cross_entropy(net(val_x.to(device)), val_y.to(device)).item()


step = 0
for epoch in range(epochs):
    sampler.set_epoch(epoch)
    for x, y in loader:
        # [start:step]
        loss = F.cross_entropy(model(x.to(device)), y.to(device))
        loss.backward()  # no all-reduce: each rank keeps its own gradient
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)  # clips this rank's gradient
        opt.step()  # the group averages parameters and gradients, then steps
        sched.step()
        opt.zero_grad()
        sync.step()  # once per optimizer step, on every rank
        # [end:step]
        step += 1
        # [start:evaluate]
        if step % 16 == 0 and rank == 0:  # rank 0's replica: the ranks differ between averages
            print(f"step {step}: validation loss of rank 0's replica {evaluate(model):.4f}")
        # [end:evaluate]

# [start:checkpoint]
folder = tempfile.mkdtemp()
state = {
    "model": model.state_dict(),
    "optimizer": opt.state_dict(),
    "scheduler": sched.state_dict(),
    "sync": sync.state_dict(),
}
dssync.save(state, f"{folder}/rank{rank}.pt")  # to resume: one file per rank
sync.average_all()  # every rank: one global average, then all hold the same model
if rank == 0:
    dssync.save(model.state_dict(), f"{folder}/model.pt")  # the final model
# [end:checkpoint]
weight_norm = model[0].weight.norm().item()
print(f"rank {rank}: validation loss {evaluate(model):.4f}, weight norm {weight_norm:.6f}")
dist.destroy_process_group()
