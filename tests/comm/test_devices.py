"""The device checks: gloo with CUDA tensors and nccl on the wrong device are refused at
construction, naming the fix; the lab refuses more workers than GPUs instead of gloo on CUDA."""

from __future__ import annotations

import pytest
import torch

from dssync.comm.devices import check_device, local_device
from dssync.errors import UsageError
from dssync.lab.train.device import backend_for


def test_gloo_with_a_cuda_model_is_refused_naming_nccl_and_set_device():
    with pytest.raises(UsageError) as e:
        check_device("gloo", torch.device("cuda", 1), current=1)
    assert "gloo" in str(e.value) and "init_process_group('nccl')" in str(e.value)
    assert "set_device" in str(e.value) and "LOCAL_RANK" in str(e.value)


def test_nccl_on_another_gpu_than_the_current_one_is_refused():
    with pytest.raises(UsageError) as e:
        check_device("nccl", torch.device("cuda", 1), current=0)
    assert "cuda:1" in str(e.value) and "cuda:0" in str(e.value) and "set_device" in str(e.value)


def test_nccl_with_a_cpu_model_is_refused():
    with pytest.raises(UsageError, match="nccl moves CUDA tensors only"):
        check_device("nccl", torch.device("cpu"), current=0)


def test_the_pairs_that_work_pass():
    check_device("gloo", torch.device("cpu"))
    check_device("nccl", torch.device("cuda", 2), current=2)
    check_device("nccl", torch.device("cuda"), current=0)  # no index: the current device
    check_device("nccl_like", torch.device("cpu"))  # test backends are not judged here
    check_device("gloo", None)


def test_local_device_is_the_gpu_of_local_rank_where_each_rank_has_one(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert local_device() == torch.device("cpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setenv("LOCAL_RANK", "3")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    assert local_device() == torch.device("cuda", 3)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "8")  # more ranks than GPUs: nccl would refuse
    assert local_device() == torch.device("cpu")
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")  # one GPU of its own per process
    assert local_device() == torch.device("cuda", 0)


def test_the_lab_refuses_more_workers_on_a_host_than_gpus(monkeypatch):
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(UsageError, match="--workers 1 or fewer, or --device cpu"):
        backend_for(torch.device("cuda", 0), ranks_per_host=2)
    assert backend_for(torch.device("cuda", 0), ranks_per_host=1) == "nccl"
    assert backend_for(torch.device("cpu"), ranks_per_host=4) == "gloo"


def test_a_dssync_on_gloo_refuses_a_cuda_model_before_any_message(monkeypatch):
    """The check sits where every averaging core is built (Router), fed the buckets' device."""
    import torch.distributed as dist

    from dssync.comm import averager

    seen = []
    monkeypatch.setattr(averager, "check_device", lambda b, d: seen.append((str(b), d)))
    store = dist.HashStore()
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        averager.Router(None, None, device=torch.device("cpu"))
    finally:
        dist.destroy_process_group()
    assert seen == [("gloo", torch.device("cpu"))]
