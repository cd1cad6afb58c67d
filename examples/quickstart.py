# Run with `torchrun --nproc-per-node 2 quickstart.py`: nccl with one GPU per rank, else gloo.
import torch
import torch.distributed as dist

import dssync

device = dssync.local_device()  # cuda:LOCAL_RANK where there are GPUs, else the CPU
if device.type == "cuda":
    torch.cuda.set_device(device)
dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
torch.manual_seed(dist.get_rank())  # each rank its own data
data = torch.utils.data.TensorDataset(torch.randn(512, 8), torch.randint(0, 2, (512,)))
loader = torch.utils.data.DataLoader(data, batch_size=32, shuffle=True)

model = torch.nn.Linear(8, 2).to(device)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
sync = dssync.DSSync(model, schedule=dssync.Shuffle(group_size=2, seed=0))  # rank 0's model

for x, y in loader:
    loss = torch.nn.functional.cross_entropy(model(x.to(device)), y.to(device))
    loss.backward()
    opt.step()
    opt.zero_grad()
    sync.step()  # average parameters inside this step's group
sync.average_all()  # one global average for the final model
print(f"rank {dist.get_rank()}: weight norm {model.weight.norm().item():.6f}")  # same everywhere
dist.destroy_process_group()
