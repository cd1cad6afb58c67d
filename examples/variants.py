# Run with `torchrun --nproc-per-node 2 variants.py`: the same loop with overlapped DS-Sync (the
# averaging runs behind the next step's compute) and with wait-avoiding DS-Sync (a slow rank does
# not hold up its partner).
import torch
import torch.distributed as dist

import dssync


def train(model, opt, after_step, steps=20):
    for _ in range(steps):
        x, y = torch.randn(16, 8), torch.randint(0, 2, (16,))
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        opt.zero_grad()
        after_step()


dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(rank)
model = torch.nn.Linear(8, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

# [start:overlap]
sync = dssync.DSSync(model, dssync.Shuffle(2, seed=0), optimizer=opt, overlap=True)
train(model, opt, sync.step)  # sync.step() starts this step's average and returns
sync.average_all()  # merges the average in flight, then one global average
sync.close()  # stops the lane's thread
# [end:overlap]
print(f"rank {rank}: overlapped, weight norm {model.weight.norm().item():.6f}")

# [start:async]
sync = dssync.AsyncDSSync(model, seed=0)  # even ranks ask, odd ranks answer from a thread
train(model, opt, sync.step)
sync.average_all()  # ends the asynchronous phase with one global average
# [end:async]
print(f"rank {rank}: wait-avoiding, weight norm {model.weight.norm().item():.6f}")
dist.barrier()
dist.destroy_process_group()
