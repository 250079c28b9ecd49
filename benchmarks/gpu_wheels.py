"""The wheels a GPU machine needs for the pipeline and lacks: DVC and dvclive with every package they need (at this
venv's pinned versions) that the machine's image does not hold, for its Python 3.12 on x86-64 Linux. The machine
reaches no package registry, so they travel with the working tree (the device tool's ``carry``, 64 MiB a call).

    .venv/bin/python benchmarks/gpu_wheels.py --out .whl     # here, where pip reaches the registries

and first on the GPU machine (``benchmarks/gpu_session.sh`` runs ``dvc``):

    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir .whl/*.whl

``--list`` prints the packages and versions without downloading.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement

ROOTS = ("dvc", "dvclive")
# The packages of the GPU machines' image ('cuda'), as the device tool's notes list them (read on such a machine on
# 2026-11-17): what is here is not carried, whatever its version there.
IMAGE = frozenset("""
absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs botorch build certifi
charset-normalizer chex click cloudpickle cmake colorama contourpy coverage cuda-bindings cuda-core cuda-pathfinder
cuda-toolkit cupy-cuda13x cycler cython diffrax e3nn einops equinox etils execnet filelock flatbuffers flax fonttools
formulaic frozenlist fsspec gpytorch grpcio h11 h5py hf-xet httpcore httpx huggingface-hub humanize hypothesis idna
imageio iniconfig interface-meta jax jax-cuda13-pjrt jax-cuda13-plugin jaxlib jaxtyping jinja2 joblib kiwisolver
lazy-loader lightning lightning-utilities linear-operator lineax llvmlite lxml markdown markdown-it-py markupsafe
matplotlib mdurl meson ml-dtypes mpi4py mpmath msgpack multidict multipledispatch mypy-extensions nanobind narwhals
networkx ninja numba numba-cuda numpy numpyro nvidia-cublas nvidia-cuda-cupti nvidia-cuda-nvrtc nvidia-cuda-runtime
nvidia-cudnn-cu13 nvidia-cufft nvidia-cufile nvidia-curand nvidia-cusolver nvidia-cusparse nvidia-cusparselt-cu13
nvidia-ml-py nvidia-nccl-cu13 nvidia-nvjitlink nvidia-nvshmem-cu13 nvidia-nvtx onnx onnx-ir onnxruntime onnxscript
opencv-python-headless optax opt-einsum opt-einsum-fx optimistix orbax-checkpoint packaging pandas pathspec patsy peft
pillow pip pluggy portalocker prometheus-client propcache protobuf psutil pyarrow pybind11 py-cpuinfo pygments
pyparsing pyproject-hooks pyre-extensions pytest pytest-benchmark pytest-cov pytest-mock pytest-timeout pytest-xdist
python-dateutil pytorch-lightning pyyaml regex requests rich sacrebleu safetensors scikit-build-core scikit-image
scikit-learn scipy seaborn sentencepiece sentence-transformers setuptools shellingham simplejson six sortedcontainers
statsmodels sympy tabulate tensorboard tensorboard-data-server tensorstore threadpoolctl tifffile tiktoken timm
tokenizers toolz torch torchaudio torchdiffeq torch-geometric torchmetrics torchvision tqdm transformers treescope
triton typer typing-extensions typing-inspect urllib3 uvloop wadler-lindig werkzeug wheel wrapt xarray xxhash yarl
zipp
""".split())
# The machine's Python and platform, for requirement markers and for pip's choice of wheel
MARKERS = {"extra": "", "python_version": "3.12", "python_full_version": "3.12.3", "sys_platform": "linux",
           "platform_system": "Linux", "platform_machine": "x86_64", "os_name": "posix",
           "implementation_name": "cpython", "platform_python_implementation": "CPython"}
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64",
             "manylinux1_x86_64")


def normalise(name: str) -> str:
    """A distribution's name as PEP 503 compares them."""
    return re.sub(r"[-_.]+", "-", name).lower()


def needed(roots: tuple[str, ...] = ROOTS, present: frozenset[str] = IMAGE) -> dict[str, str]:
    """name -> installed version of ``roots`` and everything they require (without extras, under :data:`MARKERS`),
    as installed here, less the ``present`` packages and what only they require."""
    found: dict[str, str] = {}
    todo = [normalise(root) for root in roots]
    while todo:
        name = todo.pop()
        if name in found or name in present:
            continue
        distribution = metadata.distribution(name)  # installed here: the pins of pyproject.toml
        found[name] = distribution.version
        for text in distribution.requires or []:
            requirement = Requirement(text)
            if requirement.marker is None or requirement.marker.evaluate(MARKERS):
                todo.append(normalise(requirement.name))
    return dict(sorted(found.items()))


def download(packages: dict[str, str], out: Path) -> None:
    """Each package's wheel for the machine into ``out`` (pip download, no dependencies: they are listed); one with
    no wheel of that version on the index (e.g. antlr4-python3-runtime 4.9.3, which hydra-core pins) is built here
    from its source (``pip wheel``: pure Python, so the wheel serves the machine too)."""
    platforms = [argument for platform in PLATFORMS for argument in ("--platform", platform)]
    for name, version in packages.items():
        fetch = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
                 "--python-version", "3.12", "--implementation", "cp", *platforms, "--dest", str(out),
                 f"{name}=={version}"]
        if subprocess.run(fetch, capture_output=True, check=False).returncode:
            subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--wheel-dir", str(out),
                            f"{name}=={version}"], check=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(".whl"), help="the wheels' folder (git-ignored)")
    parser.add_argument("--list", action="store_true", help="print the packages only")
    args = parser.parse_args(argv)
    packages = needed()
    for name, version in packages.items():
        print(f"{name}=={version}")
    if not args.list:
        args.out.mkdir(parents=True, exist_ok=True)
        download(packages, args.out)
        size = sum(path.stat().st_size for path in args.out.glob("*.whl"))
        print(f"{len(packages)} packages, {size / 2**20:.1f} MiB of wheels in {args.out}")


if __name__ == "__main__":
    main()
