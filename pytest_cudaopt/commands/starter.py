"""What `cudaopt init` leaves for the work: a starting kernel and its binding in kernels/ (templates/starter/), and the workdir's README.md."""

from __future__ import annotations

import shutil
import string
from pathlib import Path

from pytest_cudaopt.policy import TEMPLATES

DEVICES = ("cuda", "cpu")
STARTER = TEMPLATES / "starter"
# The README's kernels/ item: the starting kernel, or none for a model with a convolution (CV001: cuDNN).
KERNELS_ITEM = """\
- `kernels/starter$ext` and `kernels/starter_binding.cpp`: the starting kernel,
  `cuda_extension.starter(x)`, a copy of `x`$where. Write the model's kernels in their place:
  per op, `kernels/<op>$ext` (the kernels and an `extern "C"` `<op>_launcher`) and
  `kernels/<op>_binding.cpp` (the `TORCH_CHECK`s, `torch::empty*`, the call,
  `REGISTER_BINDING(<op>, register_<op>)`); rename `starter` in both files, or delete them."""
CONVOLUTION_ITEM = """\
- `kernels/`: empty. model.py uses a convolution, which kernels/ must do with cuDNN (rule
  CV001): per op, `kernels/<op>.cpp` (including `cudnn.h`, calling `cudnnConvolutionForward`,
  or `cudnnConvolutionBackwardData` for a transposed one), `kernels/<op>.cu` for the kernels of
  the other ops, and `kernels/<op>_binding.cpp` (the `TORCH_CHECK`s, `torch::empty*`, the call,
  `REGISTER_BINDING(<op>, register_<op>)`)."""
TEXT = {
    "cuda": {"ext": ".cu", "where": " on the GPU", "commands": (
        "pytest -m correctness    # the same function as Model on many shapes, against float64\n"
        "pytest -m perf           # faster than torch.compile (by cudaopt_min_speedup, 1.05x)\n"
        "pytest                   # every verdict")},
    "cpu": {"ext": ".cpp", "where": " in plain C++ on the CPU", "commands": (
        "pytest -m correctness    # the same function as Model on many shapes, on the CPU\n"
        "pytest -m perf           # the C++ kernels against torch.compile on the CPU\n"
        "pytest                   # every verdict (pyproject.toml's cudaopt_device = \"cpu\" says\n"
        "                         # where; --cudaopt-device=cuda overrides it)")},
}


def write(dest: Path, device: str, convolution: bool = False) -> None:
    """kernels/starter.cu (.cpp for the CPU) and starter_binding.cpp, or none for a convolution; and README.md."""
    kernels = Path(dest) / "kernels"
    if convolution:
        kernels.mkdir(parents=True, exist_ok=True)
        (kernels / ".gitkeep").write_text("", encoding="utf-8")
        item = CONVOLUTION_ITEM
    else:
        shutil.copytree(STARTER / device / "kernels", kernels, dirs_exist_ok=True)
        item = string.Template(KERNELS_ITEM).substitute(TEXT[device])
    readme = string.Template((STARTER / "README.md").read_text(encoding="utf-8"))
    (Path(dest) / "README.md").write_text(readme.substitute(kernels=item, commands=TEXT[device]["commands"]),
                                          encoding="utf-8")
