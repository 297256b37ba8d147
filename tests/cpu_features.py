"""What this machine's CPU offers, for tests whose expectations depend on it."""


def cpu_has_bf16_dot() -> bool:
    """Whether the CPU has AVX512_BF16 dot products (recops' native bf16 tiles run)."""
    try:
        with open("/proc/cpuinfo") as f:
            return "avx512_bf16" in f.read()
    except OSError:
        return False
