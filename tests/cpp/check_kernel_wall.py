"""The kernel wall: no file under csrc/recops/*/kernels/, nor any recops header such a file reaches
through its includes, may include ATen, torch or c10 (`make check-kernel-wall`, part of
`make test`). Kernels see raw pointers and the torch-free interfaces of csrc/recops/common/;
PyTorch stays in the adapters.

Usage: check_kernel_wall.py [KERNELS_DIR_NOT_YET_WALLED ...] (run from the repository root)
"""

import glob
import os
import re
import sys

CSRC = "csrc"
TORCH_INCLUDE = re.compile(r'^\s*#\s*include\s*[<"](ATen|torch|c10)/', re.MULTILINE)
RECOPS_INCLUDE = re.compile(r'^\s*#\s*include\s*"(recops/[^"]+)"', re.MULTILINE)


def main(pending):
    kernel_files = sorted(
        path
        for path in glob.glob(os.path.join(CSRC, "recops", "*", "kernels", "*"))
        if not any(path.startswith(p.rstrip("/") + "/") for p in pending)
    )
    reached_from = {path: None for path in kernel_files}  # file -> the file that includes it
    queue = list(kernel_files)
    while queue:
        path = queue.pop()
        with open(path) as f:
            text = f.read()
        for include in RECOPS_INCLUDE.findall(text):
            target = os.path.join(CSRC, include)
            if target not in reached_from:
                reached_from[target] = path
                queue.append(target)
    failures = []
    for path in sorted(reached_from):
        with open(path) as f:
            if TORCH_INCLUDE.search(f.read()):
                chain, at = [], path
                while at is not None:
                    chain.append(at)
                    at = reached_from[at]
                failures.append(" <- ".join(chain))
    if failures:
        print(
            "kernel wall broken: these files include ATen/torch/c10 and are reached from kernels/"
        )
        print("\n".join(failures))
        return 1
    headers = len(reached_from) - len(kernel_files)
    print(
        f"kernel wall: {len(kernel_files)} kernel files and {headers} headers they reach are clean"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
