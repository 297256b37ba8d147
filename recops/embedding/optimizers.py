"""The fused optimizers: each one's lookup op suffix, optimizer-state layout and names, and the
families that share hyper-parameters."""

from recops.embedding.config import OptimType

# Lookup op suffix and the layout of each optimizer-state buffer (momentum1, momentum2):
# "elementwise" holds D values per row, "rowwise" one.
OPTIMIZERS = {
    OptimType.EXACT_SGD: ("sgd", ()),
    OptimType.EXACT_ADAGRAD: ("adagrad", ("elementwise",)),
    OptimType.EXACT_ROWWISE_ADAGRAD: ("rowwise_adagrad", ("rowwise",)),
    OptimType.ADAM: ("adam", ("elementwise", "elementwise")),
    OptimType.PARTIAL_ROWWISE_ADAM: ("partial_rowwise_adam", ("elementwise", "rowwise")),
    OptimType.LAMB: ("lamb", ("elementwise", "elementwise")),
    OptimType.PARTIAL_ROWWISE_LAMB: ("partial_rowwise_lamb", ("elementwise", "rowwise")),
}
# The Adam family: moments with betas, bias-corrected by the step count `iter`. Adam's weight
# decay is decoupled (FBGEMM's); LAMB's is part of its update direction (weight_decay_mode NONE).
ADAM_FAMILY = (
    OptimType.ADAM,
    OptimType.PARTIAL_ROWWISE_ADAM,
    OptimType.LAMB,
    OptimType.PARTIAL_ROWWISE_LAMB,
)
LAMB_FAMILY = (OptimType.LAMB, OptimType.PARTIAL_ROWWISE_LAMB)
# get_optimizer_state's names for the state buffers, as torch.optim names them.
STATE_NAMES = {
    OptimType.EXACT_SGD: (),
    OptimType.EXACT_ADAGRAD: ("sum",),
    OptimType.EXACT_ROWWISE_ADAGRAD: ("sum",),
    OptimType.ADAM: ("exp_avg", "exp_avg_sq"),
    OptimType.PARTIAL_ROWWISE_ADAM: ("exp_avg", "exp_avg_sq"),
    OptimType.LAMB: ("exp_avg", "exp_avg_sq"),
    OptimType.PARTIAL_ROWWISE_LAMB: ("exp_avg", "exp_avg_sq"),
}
