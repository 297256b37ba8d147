"""Builds recops' operator library (recops/_C.so) against the installed PyTorch.

CPU sources (csrc/recops/**/*.cpp) are always compiled, among them the ATen backends of the
kernels' torch-free interfaces (csrc/recops/common/*_aten.cpp; tests/cpp links others). CUDA
sources (csrc/recops/**/*.cu, next to their family's CPU kernels) are added when torch is a CUDA
build, nvcc is found and its major version matches torch's; RECOPS_CUDA=0 forces a CPU-only build,
RECOPS_CUDA=1 makes a missing toolchain an error. RECOPS_SANITIZE=address,undefined builds with
those sanitizers (CPU only; `make test-asan`); RECOPS_DEBUG_INFO=1 keeps full debug information.
The C++ standard is the one torch's cpp_extension picks for the torch being built against (C++17
up to torch 2.12, C++20 from 2.13, whose headers need it).

The extension is bound to the ABI of the torch it was compiled with, so the package requires that
torch's major.minor release (``torch==X.Y.*``).
"""

import glob
import os
import subprocess

import torch
from setuptools import find_packages, setup
from torch.utils.cpp_extension import CUDA_HOME, BuildExtension, CppExtension, CUDAExtension

ROOT = os.path.dirname(os.path.abspath(__file__))
# The GPU recops' CUDA backend is built for when no GPU is visible to pick the architecture from
# (cpp_extension needs one); TORCH_CUDA_ARCH_LIST chooses others.
DEFAULT_CUDA_ARCH = "9.0"


def _version():
    scope = {}
    with open(os.path.join(ROOT, "recops", "_version.py")) as f:
        exec(f.read(), scope)
    return scope["__version__"]


def _torch_requirement():
    major, minor = torch.__version__.split("+")[0].split(".")[:2]
    return f"torch=={major}.{minor}.*"


def _sources(pattern):
    return sorted(glob.glob(os.path.join("csrc", "recops", "**", pattern), recursive=True))


def _binding_last(objects):
    """The objects with the FBGEMM binding's last."""
    binding = os.sep + os.path.join("csrc", "recops", "binding") + os.sep
    return [o for o in objects if binding not in o] + [o for o in objects if binding in o]


class _BuildExtension(BuildExtension):
    """Links the FBGEMM binding's objects last (setuptools sorts the sources). Static initialisers
    run in link order, and the binding's define torch.ops.fbgemm's schemas from the recops:: twins,
    with their kernels, that every other source registers (csrc/recops/binding/fbgemm_schemas.cpp).
    """

    def build_extension(self, ext):
        link = self.compiler.link_shared_object

        def link_binding_last(objects, *args, **kwargs):
            return link(_binding_last(objects), *args, **kwargs)

        self.compiler.link_shared_object = link_binding_last
        try:
            super().build_extension(ext)
        finally:
            self.compiler.link_shared_object = link


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
    # exception flags or errno. A sanitized build compiles at -O1 with line tables only (-g1),
    # the sanitizers' usual settings: half the compile time of -O3 -g, reports still name file
    # and line (their -g1 comes last). Other builds drop the -g that Python's own compile flags
    # bring (-g0 comes after it on the command line): full debug information of torch's templates
    # made every object 20 times larger and the build a quarter slower; RECOPS_DEBUG_INFO=1 asks
    # for it.
    sanitizers = os.environ.get("RECOPS_SANITIZE")
    cxx_flags = [
        "-O1" if sanitizers else "-O3",
        "-g" if os.environ.get("RECOPS_DEBUG_INFO") == "1" else "-g0",
        "-fopenmp",
        "-fno-trapping-math",
        "-fno-math-errno",
        "-Wall",
        "-Wextra",
        "-Wno-unused-parameter",
    ]
    link_flags = ["-fopenmp"]
    if sanitizers:
        # Every finding aborts (no recovery), so a sanitizer report fails the test that caused it.
        # vptr checks need RTTI of torch's own classes, which its release build does not give
        # UBSan, so they would only report torch's types, never recops' bugs.
        sanitize = [f"-fsanitize={sanitizers}", "-fno-sanitize-recover=all", "-fno-sanitize=vptr"]
        cxx_flags += [*sanitize, "-fno-omit-frame-pointer", "-g1"]
        link_flags += sanitize
    common = dict(
        name="recops._C",
        include_dirs=[os.path.join(ROOT, "csrc")],
        extra_link_args=link_flags,
        py_limited_api=False,
    )
    if not sanitizers and _build_cuda():
        if torch.cuda.device_count() == 0:
            os.environ.setdefault("TORCH_CUDA_ARCH_LIST", DEFAULT_CUDA_ARCH)
        return CUDAExtension(
            sources=_sources("*.cpp") + _sources("*.cu"),
            extra_compile_args={"cxx": cxx_flags, "nvcc": ["-O3"]},
            **common,
        )
    return CppExtension(sources=_sources("*.cpp"), extra_compile_args={"cxx": cxx_flags}, **common)


setup(
    version=_version(),
    install_requires=[_torch_requirement()],
    packages=find_packages(include=["recops", "recops.*"]),
    package_data={"recops": ["py.typed"]},
    ext_modules=[_extension()],
    cmdclass={"build_ext": _BuildExtension.with_options(use_ninja=True)},
)
