"""From a TrainConfig to a strategy object: the one place that maps method names to classes."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from dssync.schedules import schedule_from_name
from dssync.strategies import BSP, AdaptiveDSSync, DSSync, Hierarchical, LocalSGD, Strategy
from dssync.train.config import TrainConfig

Builder = Callable[[TrainConfig, nn.Module, torch.optim.Optimizer], Strategy]


def _dssync(cfg: TrainConfig, module: nn.Module, opt: torch.optim.Optimizer) -> Strategy:
    schedule = schedule_from_name(cfg.schedule, cfg.group_size, seed=cfg.seed, period=cfg.period)
    return DSSync(module, schedule=schedule, optimizer=opt if cfg.average_momentum else None,
                  bucket_bytes=int(cfg.bucket_mb * 2**20), timeout_s=cfg.timeout_s)


def _bsp(cfg: TrainConfig, module: nn.Module, opt: torch.optim.Optimizer) -> Strategy:
    return BSP(module, bucket_cap_mb=cfg.bucket_mb)


def _local_sgd(cfg: TrainConfig, module: nn.Module, opt: torch.optim.Optimizer) -> Strategy:
    return LocalSGD(module, period=cfg.local_sgd_period, bucket_bytes=int(cfg.bucket_mb * 2**20))


STRATEGIES: dict[str, Builder] = {"dssync": _dssync, "bsp": _bsp, "local-sgd": _local_sgd}
STRATEGIES |= {"hierarchical": Hierarchical.from_config, "dssync-topo": AdaptiveDSSync.from_config}


def build_strategy(cfg: TrainConfig, module: nn.Module, opt: torch.optim.Optimizer) -> Strategy:
    try:
        builder = STRATEGIES[cfg.sync]
    except KeyError:
        raise ValueError(f"unknown --sync {cfg.sync!r}; choose one of {', '.join(STRATEGIES)}") from None
    return builder(cfg, module, opt)
