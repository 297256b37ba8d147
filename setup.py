"""Builds recops' operator library (recops/_C.so) against the installed PyTorch.

CPU sources (csrc/recops/**/*.cpp) are always compiled. CUDA sources (csrc/recops/**/*.cu, next to
their family's CPU kernels) are added when torch is a CUDA build, nvcc is found and its major
version matches torch's; RECOPS_CUDA=0 forces a CPU-only build, RECOPS_CUDA=1 makes a missing
toolchain an error.
"""

import glob
import os
import subprocess

import torch
from setuptools import find_packages, setup
from torch.utils.cpp_extension import CUDA_HOME, BuildExtension, CppExtension, CUDAExtension

ROOT = os.path.dirname(os.path.abspath(__file__))


def _sources(pattern):
    return sorted(glob.glob(os.path.join("csrc", "recops", "**", pattern), recursive=True))


def _nvcc_major():
    try:
        out = subprocess.check_output(
            [os.path.join(CUDA_HOME, "bin", "nvcc"), "--version"], text=True
        )
    except (OSError, subprocess.CalledProcessError, TypeError):
        return None
    release = out.rsplit("release ", 1)[-1].split(",")[0]
    return release.split(".")[0]


def _build_cuda():
    mode = os.environ.get("RECOPS_CUDA", "auto")
    if mode == "0":
        return False
    cu_sources = _sources("*.cu")
    torch_cuda = torch.version.cuda
    usable = (
        bool(cu_sources) and torch_cuda is not None and _nvcc_major() == torch_cuda.split(".")[0]
    )
    if mode == "1" and not usable:
        raise RuntimeError(
            "RECOPS_CUDA=1 but no usable nvcc matching torch's CUDA or no .cu sources"
        )
    return usable


def _extension():
    # -fno-trapping-math lets GCC vectorise loops with float selects (clamps) and -fno-math-errno
    # lets sqrt vectorise (the embedding optimizers); recops never relies on floating-point
    # exception flags or errno.
    cxx_flags = [
        "-O3",
        "-fopenmp",
        "-fno-trapping-math",
        "-fno-math-errno",
        "-Wall",
        "-Wextra",
        "-Wno-unused-parameter",
    ]
    common = dict(
        name="recops._C",
        include_dirs=[os.path.join(ROOT, "csrc")],
        extra_link_args=["-fopenmp"],
        py_limited_api=False,
    )
    if _build_cuda():
        return CUDAExtension(
            sources=_sources("*.cpp") + _sources("*.cu"),
            define_macros=[("RECOPS_WITH_CUDA", "1")],
            extra_compile_args={"cxx": cxx_flags, "nvcc": ["-O3"]},
            **common,
        )
    return CppExtension(sources=_sources("*.cpp"), extra_compile_args={"cxx": cxx_flags}, **common)


setup(
    name="recops",
    version="0.1.0",
    description="Fast C++ operators for recommendation-model training in PyTorch",
    packages=find_packages(include=["recops", "recops.*"]),
    ext_modules=[_extension()],
    cmdclass={"build_ext": BuildExtension.with_options(use_ninja=True)},
    python_requires=">=3.10",
)
