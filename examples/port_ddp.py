# Run with `torchrun --nproc-per-node 2 port_ddp.py`: a DDP script with AdamW (see port_dssync.py).
import math
import os
import tempfile
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

local_rank = int(os.environ["LOCAL_RANK"])
device = torch.device(f"cuda:{local_rank}" if torch.cuda.is_available() else "cpu")
if device.type == "cuda":
    torch.cuda.set_device(device)
dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
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
layers = [torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4)]
model = torch.nn.Sequential(*layers).to(device)
model = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
sched = torch.optim.lr_scheduler.LambdaLR(  # 4 steps of warm-up, then cosine decay
    opt, lambda s: min(1.0, (s + 1) / 4) * 0.5 * (1 + math.cos(math.pi * s / total))
)


@torch.no_grad()
def evaluate(net: torch.nn.Module) -> float:
    return F.cross_entropy(net(val_x.to(device)), val_y.to(device)).item()


step = 0
for epoch in range(epochs):
    sampler.set_epoch(epoch)
    for x, y in loader:
        loss = F.cross_entropy(model(x.to(device)), y.to(device))
        loss.backward()  # DDP all-reduces the gradients here
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)  # clips the mean gradient
        opt.step()
        sched.step()
        opt.zero_grad()
        step += 1
        if step % 16 == 0 and rank == 0:
            print(f"step {step}: validation loss {evaluate(model.module):.4f}")

if rank == 0:
    torch.save(model.module.state_dict(), f"{tempfile.mkdtemp()}/model.pt")  # ranks are equal
weight_norm = model.module[0].weight.norm().item()
print(f"rank {rank}: validation loss {evaluate(model.module):.4f}, weight norm {weight_norm:.6f}")
dist.destroy_process_group()
# Works around a PyTorch 2.13 bug on gloo (docs/known-issues.md): a gloo thread may still be
# cleaning up DDP's last all-reduce as Python exits, and the process then aborts ("terminate
# called without an active exception"). A short pause avoids it; port_dssync.py needs none.
time.sleep(0.1)
