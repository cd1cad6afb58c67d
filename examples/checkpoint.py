# Run with `torchrun --nproc-per-node 2 checkpoint.py`: save a plain DSSync run and resume it.
# Between averages every rank holds its own model, so each rank writes its own file.
import tempfile

import torch
import torch.distributed as dist

import dssync


def make():
    model = torch.nn.Linear(8, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    sync = dssync.DSSync(model, schedule=dssync.Shuffle(2, seed=0), optimizer=opt)
    return model, opt, sync


def train(model, opt, sync, steps):
    for _ in range(steps):
        x, y = torch.randn(16, 8), torch.randint(0, 2, (16,))
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        opt.zero_grad()
        sync.step()


dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(rank)
folder = tempfile.mkdtemp()
model, opt, sync = make()
train(model, opt, sync, 10)
# [start:save]
state = {"model": model.state_dict(), "optimizer": opt.state_dict(), "sync": sync.state_dict()}
dssync.save(state, f"{folder}/rank{rank}.pt")  # one file per rank, with a checksum and its rank
# [end:save]

# A new run: construct first (DSSync starts every rank from rank 0's weights), then load.
# [start:resume]
model, opt, sync = make()
state = dssync.load(f"{folder}/rank{rank}.pt")  # refuses a damaged file or another rank's
model.load_state_dict(state["model"])  # after DSSync(...), or rank 0's broadcast overwrites it
opt.load_state_dict(state["optimizer"])
sync.load_state_dict(state["sync"])  # the schedule's step: the same partitions follow
# [end:resume]
assert all(torch.equal(t, state["model"][k]) for k, t in model.state_dict().items())
train(model, opt, sync, 10)
sync.average_all()
print(
    f"rank {rank}: resumed at step {state['sync']['steps']}, weight norm {model.weight.norm():.6f}"
)
dist.destroy_process_group()
