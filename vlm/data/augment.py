"""Training augmentation (docs/architecture.md, data path): an image's draw comes from a generator seeded by ``(seed,
epoch, image_row)``, so 0 or N DataLoader workers yield identical batches; a flip swaps "left" and "right" in the text
(:mod:`vlm.data.mirror`)."""

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import torch

from vlm.config import check

MAX_HUE = 0.02  # fraction of the hue circle (±7 degrees): red/yellow/green stay apart


@dataclass
class AugmentConfig:
    """Colour jitter and the mirror only: the answers (the thirds, the path bands) and the heads' target maps come from
    the label boxes, which a rotation, crop or scale would move against the pixels; a mirror moves both exactly."""

    hflip_prob: float = 0.5  # probability of a mirrored image (with left/right swapped in the text)
    brightness: float = 0.2  # factor drawn from [1 - brightness, 1 + brightness]
    contrast: float = 0.2
    saturation: float = 0.2
    hue: float = 0.0  # shift drawn from [-hue, hue]; keep 0 or tiny, see MAX_HUE

    @property
    def jitters(self) -> bool:
        """Whether it changes the pixels beyond a flip (torchvision's transforms)."""
        return any((self.brightness, self.contrast, self.saturation, self.hue))

    @classmethod
    def mirror_only(cls, hflip_prob: float = 1.0) -> "AugmentConfig":
        """The mirror with probability ``hflip_prob``, no jitter."""
        return cls(hflip_prob=hflip_prob, brightness=0.0, contrast=0.0, saturation=0.0, hue=0.0)

    def validate(self, prefix: str = "augment") -> None:
        check(0.0 <= self.hflip_prob <= 1.0, f"{prefix}.hflip_prob", f"must be in [0, 1], got {self.hflip_prob}")
        for name in ("brightness", "contrast", "saturation"):
            value = getattr(self, name)
            check(0.0 <= value <= 0.5, f"{prefix}.{name}",
                  f"must be in [0, 0.5] (stronger jitter can change a traffic light's colour), got {value}")
        check(0.0 <= self.hue <= MAX_HUE, f"{prefix}.hue",
              f"must be in [0, {MAX_HUE}] (hue jitter changes traffic light colours), got {self.hue}")


@dataclass(frozen=True)
class AugmentParams:
    """The random draw for one image in one epoch."""

    hflip: bool
    brightness: float
    contrast: float
    saturation: float
    hue: float

    @property
    def jitters(self) -> bool:
        """Whether the draw changes the pixels beyond a flip (as :attr:`AugmentConfig.jitters` for the config)."""
        return (self.brightness, self.contrast, self.saturation, self.hue) != (1.0, 1.0, 1.0, 0.0)


def sample_augment_params(config: AugmentConfig, seed: int, epoch: int, image_row: int) -> AugmentParams:
    rng = np.random.default_rng((seed, epoch, image_row))
    draws = rng.uniform(-1.0, 1.0, size=4)
    return AugmentParams(hflip=bool(rng.random() < config.hflip_prob),
                         brightness=1.0 + config.brightness * float(draws[0]),
                         contrast=1.0 + config.contrast * float(draws[1]),
                         saturation=1.0 + config.saturation * float(draws[2]),
                         hue=config.hue * float(draws[3]))


@contextlib.contextmanager
def single_threaded_torch() -> Iterator[None]:
    """Run torch ops on the calling thread only (as in workers): reductions in one order, bit-identical images."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def transforms():
    """torchvision's functional transforms, imported on first use: its package loads its models and ops (about 2 s on
    the reference CPU), which answering (a flip at most) never needs. A dataset that jitters imports them
    when built, so the DataLoader workers forked from its process find them imported."""
    from torchvision.transforms.v2 import functional

    return functional


def augment_image(image: torch.Tensor, params: AugmentParams) -> torch.Tensor:
    """uint8 ``[3, H, W]`` -> augmented uint8 ``[3, H, W]``; call it inside ``single_threaded_torch()``."""
    if params.hflip:
        image = image.flip(-1)  # what torchvision's horizontal_flip does to an image tensor
    if not params.jitters:
        return image.contiguous()
    F = transforms()  # pylint: disable=invalid-name
    if params.brightness != 1.0:
        image = F.adjust_brightness(image, params.brightness)
    if params.contrast != 1.0:
        image = F.adjust_contrast(image, params.contrast)
    if params.saturation != 1.0:
        image = F.adjust_saturation(image, params.saturation)
    if params.hue != 0.0:
        image = F.adjust_hue(image, params.hue)
    return image.contiguous()
