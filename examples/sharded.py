# Run with `torchrun --nproc-per-node 4 sharded.py`: 2 replicas of 2 shards (FSDP2), DS-Sync across.
import tempfile

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

from dssync import DSSync, Shuffle, checkpoint


def make(mesh):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
    # [start:shard]
    fully_shard(model[0], mesh=mesh["shard"])  # each block over the shard dimension only
    fully_shard(model, mesh=mesh["shard"])  # the root too: it takes the rest
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    sync = DSSync(model, Shuffle(2), optimizer=opt, process_group=mesh.get_group("replicate"))
    # [end:shard]
    return model, opt, sync


def train(model, opt, sync, steps):
    for _ in range(steps):  # every rank its own batch, as with FSDP
        x, y = torch.randn(16, 8), torch.randint(0, 2, (16,))
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        opt.zero_grad()
        sync.step()


dist.init_process_group("gloo")  # "nccl" on GPUs, with init_device_mesh("cuda", ...)
rank = dist.get_rank()
mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("replicate", "shard"))
folder = tempfile.mkdtemp() if rank == 0 else None
shared = [folder]
dist.broadcast_object_list(shared, src=0)
folder = shared[0]
model, opt, sync = make(mesh)
torch.manual_seed(1 + rank)
train(model, opt, sync, 10)
# [start:checkpoint]
checkpoint.save(f"{folder}/step10", model, opt, sync)  # every rank: model, optimizer, DSSync
model, opt, sync = make(mesh)  # a new run: construct first, then load
checkpoint.load(f"{folder}/step10", model, opt, sync)
# [end:checkpoint]
train(model, opt, sync, 10)
sync.average_all()  # every replica: the same full model
norm = sum(p.full_tensor().norm() ** 2 for p in model.parameters()) ** 0.5
print(f"rank {rank}: resumed at step {sync.steps - 10}, weight norm {norm:.6f}")
dist.destroy_process_group()
