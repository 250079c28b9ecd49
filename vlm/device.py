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


def newton_schulz_dtype(device: torch.device) -> torch.dtype:
    """Muon's orthogonalisation precision: bf16 on CUDA (``torch.optim.Muon``'s); float32 on the CPU, where a CPU
    without AVX-512 BF16 runs bf16 matmuls on a scalar path, 35x slower than float32's (a stack of [4, 128, 512]
    matrices on a 2-core AMD EPYC: 0.41 s against 0.012 s)."""
    return torch.bfloat16 if device.type == "cuda" else torch.float32
