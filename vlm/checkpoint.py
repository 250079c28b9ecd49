"""Every checkpoint file is written and read here: the model (``models/vlm.pt``, a ``torch.save`` dict whose keys
docs/architecture.md lists, train) and the resume state (:func:`save_resume`, :func:`read_resume`)."""

import hashlib
import io
import logging
import os
import pickle
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from vlm.io import atomic_path, existing_file
from vlm.models.paligemma import PaliGemma
from vlm.models.perception.targets import TargetTransform
from vlm.models.pretrained import load_strict
from vlm.processor import Processor
from vlm.scenes.schema import Scene
from vlm.tokenizer import TrafficCommandTokenizer
from vlm.traffic_vlm import VLMConfig, build_vlm

log = logging.getLogger(__name__)

FORMAT_VERSION = 5  # 5: the grounding head's light tokens; 4: one stride-4 map for the fine heads, the counts head
REQUIRED = ("format_version", "config", "state_dict", "vocab", "vocab_sha256", "answers", "image_size", "resample")


def file_sha256(path: str | os.PathLike) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def save(path: str | os.PathLike, payload: dict[str, Any]) -> None:
    """``torch.save`` atomically, serialised in memory first: the archive then does not record the temporary file's
    random name (same payload, same bytes), and a full disk is the ``OSError`` of a plain write (naming ``path``)."""
    buffer = io.BytesIO()
    torch.save(payload, buffer)
    with atomic_path(path) as tmp, open(tmp, "wb") as f:
        f.write(buffer.getbuffer())


def model_payload(model: PaliGemma, info: dict[str, Any], metrics: dict[str, Any]) -> dict[str, Any]:
    """The model checkpoint of ``model``'s current weights, ``info`` the fields beside them (docs/architecture.md)."""
    state_dict = {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}
    return {"format_version": FORMAT_VERSION, **info, "state_dict": state_dict, "metrics": metrics}


def save_resume(path: str | os.PathLike, fingerprint: str, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                scheduler: Any, state: dict[str, Any]) -> None:
    """Everything a run needs to go on from here: weights, optimizer, scheduler, torch's RNG and ``state``."""
    save(path, {"fingerprint": fingerprint, "model": model.state_dict(), "optimizer": optimizer.state_dict(),
                "scheduler": scheduler.state_dict(), "torch_rng": torch.get_rng_state(), "state": state})


def read_resume(path: Path, fingerprint: str) -> dict[str, Any] | None:
    """The resume checkpoint at ``path`` if it belongs to the run ``fingerprint``, else None."""
    if not path.is_file():
        return None
    saved = read(path, "resume checkpoint")
    if saved.get("fingerprint") != fingerprint:
        log.info("ignoring %s: it belongs to a run with other params or data", path)
        return None
    return saved


def _first_line(error: Exception) -> str:
    return str(error).strip().splitlines()[0] if str(error).strip() else ""


def read(path: str | os.PathLike, what: str = "checkpoint") -> dict[str, Any]:
    """Load a checkpoint dict with errors that name the file and what is wrong."""
    path = existing_file(path, what)
    try:  # weights_only: tensors and plain containers only; a pickled object that would run code is refused
        payload = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        unsafe = re.search(r"Unsupported global: GLOBAL (\S+)", str(e))
        if unsafe:
            raise ValueError(f"{path}: refused: loading this {what} would run code ({unsafe[1]}); only tensors and "
                             "plain values are loaded (torch.load(weights_only=True))") from e
        raise ValueError(f"{path}: not a readable {what} ({type(e).__name__}: {_first_line(e)})") from e
    except Exception as e:  # torch raises many types for a damaged file
        raise ValueError(f"{path}: not a readable {what} ({type(e).__name__}: {_first_line(e)})") from e
    if not isinstance(payload, dict):
        raise ValueError(f"{path}: not a {what} (a dict was expected, got {type(payload).__name__})")
    return payload


@dataclass
class LoadedModel:
    model: PaliGemma
    tokenizer: TrafficCommandTokenizer
    answers: list[str]
    image_size: int
    resample: str
    checkpoint: dict[str, Any]

    @property
    def image_width(self) -> int | None:
        """The input images' width; None: square (``image_size``)."""
        return self.checkpoint.get("image_width")

    @property
    def processor(self) -> Processor:
        """Images and questions -> the model's Batch, as trained: squashed to ``image_size`` square, or (native
        aspect) letterboxed to the training frames' aspect (else the input's) and resized to ``W x H``."""
        aspect = None
        if self.image_width is not None:
            frame_width, frame_height = self.checkpoint.get("frame_size") or (self.image_width, self.image_size)
            aspect = frame_width / frame_height
        return Processor(self.tokenizer, self.image_size, self.resample, self.image_width, aspect)

    def label_targets(self) -> TargetTransform | None:
        """The transform of the label maps a model reads when answering (``model.perception.oracle``), else None."""
        extension = self.model.extension
        if extension is None or not extension.reads_targets:
            return None
        return extension.targets(self.model.config.siglip.height_width, tuple(self.checkpoint["frame_size"]))

    def label_maps(self, scenes: Iterable[Scene]) -> torch.Tensor | None:
        """The label maps ``[N, cells, C]`` of ``scenes`` for a model that reads them (:meth:`label_targets`), else
        None (``scenes`` then not read)."""
        transform = self.label_targets()
        return None if transform is None else torch.from_numpy(np.stack([transform.of_scene(s) for s in scenes]))

    def candidates(self) -> list[list[int]]:
        """Token ids of every answer, for ``PaliGemma.answer``."""
        return [self.tokenizer.encode_answer(a) for a in self.answers]


def load_model(path: str | os.PathLike, vocab_path: str | os.PathLike | None = None,
               device: str | torch.device = "cpu") -> LoadedModel:
    """Rebuild a trained model in eval mode from ``path``; ``vocab_path`` must be the vocabulary it was trained with."""
    path = Path(path)
    payload = read(path)
    missing = [key for key in REQUIRED if key not in payload]
    if missing:
        raise ValueError(f"{path}: not a model checkpoint (missing {', '.join(missing)})")
    if payload["format_version"] != FORMAT_VERSION:
        raise ValueError(f"{path}: checkpoint format {payload['format_version']}, this code reads {FORMAT_VERSION}")
    if vocab_path is not None:
        actual = file_sha256(vocab_path)
        if actual != payload["vocab_sha256"]:
            raise ValueError(f"{vocab_path}: vocabulary does not match the checkpoint {path} "
                             f"(sha256 {actual[:12]}... vs {payload['vocab_sha256'][:12]}... it was trained with)")
    vocab = payload["vocab"]
    tokenizer = TrafficCommandTokenizer(vocab["vocab"], max_length=vocab["config"]["max_length"],
                                        statistics=vocab.get("statistics"), config=vocab["config"])
    config = VLMConfig.from_dict(payload["config"], what=f"{path}: config")
    if config.gemma.vocab_size != tokenizer.vocab_size:
        raise ValueError(f"{path}: model vocabulary size {config.gemma.vocab_size} does not match its "
                         f"tokenizer's {tokenizer.vocab_size}")
    model = build_vlm(config, pretrained=False)
    load_strict(model, payload["state_dict"], f"{path}: its weights do not fit the model its config describes")
    model.to(device).eval()
    return LoadedModel(model, tokenizer, list(payload["answers"]), int(payload["image_size"]), payload["resample"],
                       payload)
