"""FBGEMM's table layout as plain arithmetic: tables back to back in one flat buffer (weights, and
each optimizer-state buffer alike), described per feature for the ops (feature f reads table
``feature_table_map[f]``), and per-table views of such a buffer."""

import itertools

import torch


def running_offsets(sizes):
    """Where each of ``sizes``' blocks starts when laid back to back, then the total."""
    return [0, *itertools.accumulate(sizes)]


def block_offsets(rows, widths):
    """Where each table's ``rows x width`` block starts in a flat buffer, then the total."""
    return running_offsets(r * w for r, w in zip(rows, widths, strict=True))


def state_widths(layout, dims):
    """Values per row of an optimizer-state buffer: the table's dim ("elementwise") or one
    ("rowwise")."""
    return list(dims) if layout == "elementwise" else [1] * len(dims)


def checked_feature_table_map(feature_table_map, num_tables):
    """``feature_table_map`` as a list (one feature per table when None), naming every table."""
    ftm = list(range(num_tables)) if feature_table_map is None else list(feature_table_map)
    if sorted(set(ftm)) != list(range(num_tables)):
        raise ValueError("feature_table_map must name every table, and only tables, in range")
    return ftm


def per_feature(per_table, feature_table_map):
    """A per-table list read per feature."""
    return [per_table[t] for t in feature_table_map]


def feature_buffers(rows, dims, feature_table_map, row_widths=None):
    """The per-feature descriptions of the weights buffer the ops take, name -> (values, dtype):
    columns of each feature in the output (``D_offsets``), its dim, its table's rows, where its
    table starts in the weights (rows of ``row_widths`` elements, default ``dims``), and its
    table's first row among all tables (then the total)."""
    feature_dims = per_feature(dims, feature_table_map)
    table_offsets = block_offsets(rows, dims if row_widths is None else row_widths)
    row_offsets = running_offsets(rows)
    return {
        "D_offsets": (running_offsets(feature_dims), torch.int32),
        "feature_dims": (feature_dims, torch.int64),
        "rows_per_table": (per_feature(rows, feature_table_map), torch.int64),
        "weights_offsets": (per_feature(table_offsets, feature_table_map), torch.int64),
        "hash_size_cumsum": (
            [*per_feature(row_offsets, feature_table_map), row_offsets[-1]],
            torch.int64,
        ),
    }


def table_views(flat, rows, widths, as_matrix):
    """Per table, its block of ``flat`` (``block_offsets(rows, widths)``): ``[rows, width]`` when
    ``as_matrix``, else ``[rows * width]``."""
    offsets = block_offsets(rows, widths)
    views = []
    for offset, r, w in zip(offsets, rows, widths, strict=False):
        block = flat[offset : offset + r * w]
        views.append(block.view(r, w) if as_matrix else block)
    return views
