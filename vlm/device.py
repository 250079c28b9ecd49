"""Where the model runs: the one place that picks the device and its mixed precision."""

from contextlib import AbstractContextManager, nullcontext

import torch


def pick_device(local_rank: int = 0) -> torch.device:
    """CUDA (this process's GPU under torchrun) when there is one, else the CPU."""
    return torch.device("cuda", local_rank) if torch.cuda.is_available() else torch.device("cpu")


def autocast(device: torch.device) -> AbstractContextManager:
    """bf16 autocast on CUDA; float32 on the CPU (bf16 there is slower, measured)."""
    if device.type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return nullcontext()
