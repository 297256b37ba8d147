"""FBGEMM's INT8 table rows ("fused 8-bit rowwise", weights_precision=SparseType.INT8): a row of
dim D is D uint8 codes followed by a float32 scale and a float32 bias (ROW_TAIL bytes), element d
being scale * code[d] + bias. recops looks such tables up (FBGEMM's CPU module has no INT8
backward either)."""

import torch

ROW_TAIL = 8  # FBGEMM's INT8_EMB_ROW_DIM_OFFSET: the scale and bias after the codes


def stored_widths(dims, int8):
    """Elements per stored row of each table."""
    return [d + ROW_TAIL for d in dims] if int8 else list(dims)


def quantize_rows(values: torch.Tensor) -> torch.Tensor:
    """[rows, D] floats as [rows, D + ROW_TAIL] INT8 rows, FBGEMM's rule: per row, bias = min,
    scale = (max - min) / 255, code = round((x - min) * 255 / (max - min + 1e-8))."""
    values = values.float()
    low = values.min(dim=1, keepdim=True).values if values.shape[1] else values[:, :0]
    high = values.max(dim=1, keepdim=True).values if values.shape[1] else values[:, :0]
    span = high - low
    codes = torch.round((values - low) * (255.0 / (span + 1e-8))).clamp_(0, 255).to(torch.uint8)
    tail = torch.cat([span / 255.0, low], dim=1).contiguous().view(torch.uint8)
    return torch.cat([codes, tail], dim=1)


def dequantize_rows(rows: torch.Tensor) -> torch.Tensor:
    """[rows, D + ROW_TAIL] INT8 rows as [rows, D] float32."""
    codes = rows[:, :-ROW_TAIL].float()
    scale_bias = rows[:, -ROW_TAIL:].contiguous().view(torch.float32)
    return codes * scale_bias[:, :1] + scale_bias[:, 1:]
