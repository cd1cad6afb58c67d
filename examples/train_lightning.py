# Run with `python train_lightning.py`: it starts 2 ranks on this machine's CPUs.
import lightning as L
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

import dssync.lightning  # noqa: F401  (registers strategy="dssync")


class Regression(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Linear(8, 1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return F.mse_loss(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)


if __name__ == "__main__":
    x = torch.randn(512, 8, generator=torch.Generator().manual_seed(0))
    y = x.sum(1, keepdim=True)
    model = Regression()
    # [start:trainer]
    trainer = L.Trainer(
        strategy="dssync",
        accelerator="cpu",
        devices=2,
        max_epochs=2,
        logger=False,
        enable_progress_bar=False,
    )
    trainer.fit(model, DataLoader(TensorDataset(x, y), batch_size=32, shuffle=True))
    # [end:trainer]
    loss = F.mse_loss(model.net(x), y).item()
    print(f"rank {trainer.global_rank}: loss {loss:.6f}")  # the same on every rank
