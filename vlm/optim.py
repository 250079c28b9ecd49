"""The optimizers: AdamW, Muon over matrices of any rank stepped a shape at a time (``FlatMuon``), the two as one
(``Optimizers``), and the learning-rate schedule."""

import math
from typing import Any

import torch

from vlm.device import newton_schulz_dtype


def lr_factor(step: int, warmup_steps: int, total_steps: int, min_ratio: float) -> float:
    """Linear warmup to 1, then cosine down to ``min_ratio`` at ``total_steps``."""
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
    return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


def make_optimizer(model: torch.nn.Module, kind: str, lr: float, weight_decay: float) -> torch.optim.Optimizer:
    """Fused AdamW with weight decay on matrices only, as in nanoGPT; ``optimizer: muon``: Muon on the 2-D matrices of
    the encoder's and decoder's layers, its step scaled to AdamW's (``match_rms_adamw``, Liu et al. 2025: the same
    ``lr`` and ``weight_decay``), AdamW on the rest, as Keller Jordan's recipe has it; ``muon_conv``: Muon also on the
    perception's 3x3 conv filters (its 1x1 projections and output layers stay on AdamW). ``kind``: train.optimizer."""
    named = [(name, p) for name, p in model.named_parameters() if p.requires_grad]
    hidden = {name for name, p in named if kind != "adamw" and p.dim() == 2 and ".layers." in name}
    if kind == "muon_conv":  # the perception's 3x3 filter banks, each as its [out, in * 9] matrix
        hidden |= {name for name, p in named if name.startswith("extension.") and p.dim() == 4 and p.shape[-1] > 1}
    decay = [p for name, p in named if p.dim() >= 2 and name not in hidden]
    no_decay = [p for _, p in named if p.dim() < 2]
    adamw = torch.optim.AdamW([{"params": decay, "weight_decay": weight_decay},
                               {"params": no_decay, "weight_decay": 0.0}], lr=lr, betas=(0.9, 0.95), fused=True)
    if not hidden:
        return adamw
    muon = FlatMuon([p for name, p in named if name in hidden], lr=lr, weight_decay=weight_decay,
                    adjust_lr_fn="match_rms_adamw")
    return Optimizers(muon, adamw)


def as_matrix(tensor: torch.Tensor) -> torch.Tensor:
    """A ``[rows, -1]`` view of ``tensor``'s storage: a conv's ``[out, in, k, k]`` filters as ``[out, in * k * k]``,
    or as ``[out, k * k * in]`` when channels-last (Newton-Schulz commutes with a permutation of the columns)."""
    if tensor.dim() == 4 and not tensor.is_contiguous():
        tensor = tensor.permute(0, 2, 3, 1)
    return tensor.detach().view(tensor.shape[0], -1)


def newton_schulz(updates: torch.Tensor, coefficients: tuple[float, float, float], steps: int,
                  eps: float) -> torch.Tensor:
    """Muon's quintic Newton-Schulz iteration on a stack of matrices ``[G, rows, columns]``, each as
    ``torch.optim.Muon`` treats one (scaled to a Frobenius norm of at most 1, iterated on its wide orientation), in
    bf16 as it does on CUDA and in float32 on the CPU (``newton_schulz_dtype``)."""
    a, b, c = coefficients
    x = updates.to(newton_schulz_dtype(updates.device))
    tall = x.size(-2) > x.size(-1)
    if tall:
        x = x.mT
    x = x / x.flatten(1).norm(dim=1).clamp(min=eps)[:, None, None]
    for _ in range(steps):
        gram = x @ x.mT  # [G, r, r]
        x = torch.baddbmm(x, torch.baddbmm(gram, gram, gram, beta=b, alpha=c), x, beta=a)
    return x.mT if tall else x


def muon_lr(lr: float, adjust_lr_fn: str | None, shape: torch.Size) -> float:
    """The step size ``torch.optim.Muon`` gives a ``[rows, columns]`` matrix: ``match_rms_adamw`` scales ``lr`` by
    0.2 sqrt(max(rows, columns)) so that the update's RMS is AdamW's (Liu et al. 2025); ``original`` (or None) by
    sqrt(max(1, rows / columns))."""
    rows, columns = shape[:2]
    if adjust_lr_fn in (None, "original"):
        ratio = math.sqrt(max(1, rows / columns))
    elif adjust_lr_fn == "match_rms_adamw":
        ratio = 0.2 * math.sqrt(max(rows, columns))
    else:
        raise ValueError(f"unknown Muon lr adjustment {adjust_lr_fn!r}")
    return lr * ratio  # the ratio first, as torch rounds it


class FlatMuon(torch.optim.Muon):
    """``torch.optim.Muon`` over parameters of any rank >= 2, each updated as its ``[rows, -1]`` matrix (a conv's
    filters as in Keller Jordan's CIFAR-10 speedrun): Muon steps matrix views of the parameters' storage, pointed
    at it anew before each step (``.to()`` may move a parameter) and given the parameters' gradients."""

    def __init__(self, params: list[torch.nn.Parameter], **kwargs):
        self.originals = params
        super().__init__([as_matrix(p) for p in params], **kwargs)

    def point_views(self) -> None:
        """Each matrix view at its parameter's storage and gradient."""
        flats = [flat for group in self.param_groups for flat in group["params"]]
        for original, flat in zip(self.originals, flats, strict=True):
            flat.data = as_matrix(original)
            flat.grad = None if original.grad is None else as_matrix(original.grad)

    @torch.no_grad()
    def step(self, closure=None):  # pylint: disable=unused-argument
        """``torch.optim.Muon``'s step with the matrices of one shape stacked: the same arithmetic (the same bits at
        the same precision, tested), a few kernels per shape instead of per matrix."""
        self.point_views()
        for group in self.param_groups:
            shapes: dict[torch.Size, list[torch.Tensor]] = {}
            for flat in group["params"]:
                if flat.grad is not None:
                    shapes.setdefault(flat.shape, []).append(flat)
            for shape, same in shapes.items():
                grads = [flat.grad for flat in same]
                for flat in same:
                    if "momentum_buffer" not in self.state[flat]:
                        self.state[flat]["momentum_buffer"] = torch.zeros_like(flat.grad)
                buffers = [self.state[flat]["momentum_buffer"] for flat in same]
                torch._foreach_lerp_(buffers, grads, 1 - group["momentum"])
                updates = torch._foreach_lerp(grads, buffers, group["momentum"]) if group["nesterov"] else buffers
                orthogonal = newton_schulz(torch.stack(updates), group["ns_coefficients"], group["ns_steps"],
                                           group["eps"])  # [G, rows, columns]
                torch._foreach_mul_(same, 1 - group["lr"] * group["weight_decay"])
                lr = muon_lr(group["lr"], group["adjust_lr_fn"], shape)
                torch._foreach_add_(same, orthogonal.unbind(0), alpha=-lr)

    def zero_grad(self, set_to_none: bool = True) -> None:
        super().zero_grad(set_to_none)
        for original in self.originals:
            if set_to_none:
                original.grad = None
            elif original.grad is not None:
                original.grad.zero_()


class Optimizers(torch.optim.Optimizer):
    """Several optimizers over disjoint parameters as one: one LR schedule over all groups, one resume state dict."""

    def __init__(self, *optimizers: torch.optim.Optimizer):  # pylint: disable=super-init-not-called
        self.optimizers = optimizers
        self.defaults = {}

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        """Every optimizer's groups, looked up each time: ``load_state_dict`` replaces an optimizer's groups."""
        return [group for optimizer in self.optimizers for group in optimizer.param_groups]

    def step(self, closure=None):  # pylint: disable=unused-argument
        for optimizer in self.optimizers:
            optimizer.step()

    def zero_grad(self, set_to_none: bool = True) -> None:
        for optimizer in self.optimizers:
            optimizer.zero_grad(set_to_none=set_to_none)

    def state_dict(self) -> dict[str, Any]:
        return {"optimizers": [optimizer.state_dict() for optimizer in self.optimizers]}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        for optimizer, state in zip(self.optimizers, state_dict["optimizers"], strict=True):
            optimizer.load_state_dict(state)
