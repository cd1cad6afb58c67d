# Run with `torchrun --nproc-per-node 2 train_accelerate.py` (on CPUs `accelerate launch` starts
# several processes only through MPI; on GPUs `accelerate launch --multi_gpu` works).
import torch
import torch.nn.functional as F
from accelerate import Accelerator
from torch.utils.data import DataLoader, TensorDataset

from dssync import Shuffle
from dssync.accelerate import DSSyncLocal

accelerator = Accelerator(cpu=True)  # without cpu=True on GPUs
x = torch.randn(512, 8, generator=torch.Generator().manual_seed(0))
y = x.sum(1, keepdim=True)
model = torch.nn.Linear(8, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
loader = DataLoader(TensorDataset(x, y), batch_size=32, shuffle=True)
model, optimizer, loader = accelerator.prepare(model, optimizer, loader)

# [start:loop]
with DSSyncLocal(accelerator, model, Shuffle(2, seed=0)) as ds:
    for _ in range(2):  # epochs
        for xb, yb in loader:
            accelerator.backward(F.mse_loss(model(xb), yb))
            optimizer.step()
            optimizer.zero_grad()
            ds.step()
# [end:loop]
with torch.no_grad():
    loss = F.mse_loss(model(x), y).item()
print(f"rank {accelerator.process_index}: loss {loss:.6f}")  # the same on every rank
accelerator.end_training()  # destroys the process group before exit
