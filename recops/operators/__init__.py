"""The Python side of recops' op families, one module per family (kernels in
csrc/recops/<family>/): each registers its ops' fake kernels and autograd formulas and holds the
wrappers and modules built on them; ``torchrec`` puts recops' kernels inside torchrec. The TBE
family is the package ``recops.embedding``. ``import recops`` imports every family module; their
public names are re-exported from ``recops``."""
