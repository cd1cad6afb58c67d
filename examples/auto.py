# Run with `torchrun --nproc-per-node 2 auto.py`: `dssync train --sync auto` in a script.
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F

import dssync
from dssync.lab import auto

device = dssync.local_device()  # cuda:LOCAL_RANK where every rank has a GPU, else the CPU
if device.type == "cuda":
    torch.cuda.set_device(device)
dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
torch.manual_seed(dist.get_rank())  # each rank its own data
data = torch.utils.data.TensorDataset(torch.randn(512, 8), torch.randint(0, 2, (512,)))
loader = torch.utils.data.DataLoader(data, batch_size=32, shuffle=True)
model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 2))
model = model.to(device)
opt = torch.optim.SGD(model.parameters(), lr=0.1)

# [start:auto]
x, y = (t.to(device) for t in next(iter(loader)))  # a representative batch
sync, decision = auto(model, lambda: F.cross_entropy(model(x), y), optimizer=opt)
if dist.get_rank() == 0:
    print(decision.line(), file=sys.stderr)  # auto(): diloco: predicted ... against BSP's ...

for x, y in loader:
    F.cross_entropy(model(x.to(device)), y.to(device)).backward()
    opt.step()
    opt.zero_grad()
    sync.step()  # averages as the pick says (its groups, every, outer step, wire)
sync.average_all()
# [end:auto]
print(f"rank {dist.get_rank()}: weight norm {model[0].weight.norm().item():.6f}")
sync.close()
dist.destroy_process_group()
