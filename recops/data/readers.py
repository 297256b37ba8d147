"""Readers of user-item interaction files: MovieLens as the recbole wheel ships ML-100K
(``ml-100k.inter``), and the files GroupLens distributes for ML-1M (``ratings.dat``) and ML-20M
(``ratings.csv``).

Every reader returns :class:`Interactions`: one row per interaction, users and items as dense ids
in order of first appearance (items from 1: 0 is the "no item" id of the models), and the raw ids
they stand for. A malformed line raises ``ValueError`` naming the file and the line.
"""

from __future__ import annotations

import array
import dataclasses
import importlib.metadata
import pathlib

import torch

ML_100K_IN_RECBOLE = "recbole/dataset_example/ml-100k/ml-100k.inter"


@dataclasses.dataclass(frozen=True)
class Interactions:
    users: torch.Tensor  # [R] int64, dense user ids 0..U-1
    items: torch.Tensor  # [R] int64, dense item ids 1..I
    timestamps: torch.Tensor  # [R] int64 seconds
    item_tokens: list[str]  # item_tokens[i - 1] is the raw id of dense item i
    source: str


@dataclasses.dataclass(frozen=True)
class _Format:
    separator: str
    # Names of the user, item and timestamp columns in the file's header line; None: the file
    # has no header and its lines are user, item, rating, timestamp.
    header_names: tuple[str, str, str] | None


_MOVIELENS_DAT = _Format(separator="::", header_names=None)
_MOVIELENS_CSV = _Format(separator=",", header_names=("userId", "movieId", "timestamp"))
_RECBOLE_INTER = _Format(separator="\t", header_names=("user_id", "item_id", "timestamp"))


def movielens_100k_path() -> pathlib.Path:
    """ML-100K as the recbole wheel ships it (installed with --no-deps; recbole is never
    imported): ``user_id, item_id, rating, timestamp``, tab-separated, one header line."""
    try:
        distribution = importlib.metadata.distribution("recbole")
    except importlib.metadata.PackageNotFoundError:
        raise FileNotFoundError(
            "ML-100K comes from the recbole wheel: pip install --no-deps recbole==1.2.1"
        ) from None
    path = pathlib.Path(distribution.locate_file(ML_100K_IN_RECBOLE))
    if not path.is_file():
        raise FileNotFoundError(f"the recbole distribution has no {ML_100K_IN_RECBOLE} ({path})")
    return path


def _format_of(path: pathlib.Path) -> _Format:
    if path.suffix == ".inter":
        return _RECBOLE_INTER
    if path.suffix == ".dat":
        return _MOVIELENS_DAT
    if path.suffix == ".csv":
        return _MOVIELENS_CSV
    raise ValueError(
        f"{path}: unknown interaction file type (expected MovieLens ratings.dat or ratings.csv, "
        "or a recbole .inter file)"
    )


def _header_columns(path, fmt, line):
    """(positions of the user, item and timestamp columns, number of fields) from a header line;
    recbole names its columns ``name:type``."""
    names = [field.split(":")[0].strip() for field in line.rstrip("\r\n").split(fmt.separator)]
    try:
        return tuple(names.index(name) for name in fmt.header_names), len(names)
    except ValueError:
        raise ValueError(
            f"{path}, line 1: header {names} lacks one of {list(fmt.header_names)}"
        ) from None


def _timestamp(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        value = float(text)  # recbole writes timestamps as a float column; ValueError if not
        if value != value or value in (float("inf"), float("-inf")):
            raise ValueError(text) from None
        return int(value)


def read_interactions(path) -> Interactions:
    """Reads ``ratings.dat`` (``user::item::rating::timestamp``), ``ratings.csv`` (header
    ``userId,movieId,rating,timestamp``) or a recbole ``.inter`` file (its header names the
    columns ``user_id``, ``item_id``, ``timestamp``). Blank lines are skipped; ratings are not
    read (every rating counts as an interaction, as in the SASRec and HSTU experiments)."""
    path = pathlib.Path(path)
    fmt = _format_of(path)
    user_ids: dict[str, int] = {}
    item_ids: dict[str, int] = {}
    users, items, timestamps = array.array("q"), array.array("q"), array.array("q")
    (user_col, item_col, time_col), fields = (0, 1, 3), 4
    with open(path, encoding="utf-8", newline="") as f:
        for number, line in enumerate(f, start=1):
            if number == 1 and fmt.header_names:
                (user_col, item_col, time_col), fields = _header_columns(path, fmt, line)
                continue
            line = line.rstrip("\r\n")
            if not line.strip():
                continue
            parts = line.split(fmt.separator)
            if len(parts) != fields:
                raise ValueError(
                    f"{path}, line {number}: expected {fields} fields separated by "
                    f"{fmt.separator!r}, got {len(parts)}: {line!r}"
                )
            user, item = parts[user_col].strip(), parts[item_col].strip()
            if not user or not item:
                raise ValueError(f"{path}, line {number}: empty user or item id: {line!r}")
            try:
                timestamps.append(_timestamp(parts[time_col].strip()))
            except ValueError:
                raise ValueError(
                    f"{path}, line {number}: timestamp {parts[time_col]!r} is not a number"
                ) from None
            users.append(user_ids.setdefault(user, len(user_ids)))
            items.append(item_ids.setdefault(item, len(item_ids) + 1))
    if not users:
        raise ValueError(f"{path}: no interactions")
    return Interactions(
        users=torch.frombuffer(users, dtype=torch.int64).clone(),
        items=torch.frombuffer(items, dtype=torch.int64).clone(),
        timestamps=torch.frombuffer(timestamps, dtype=torch.int64).clone(),
        item_tokens=list(item_ids),
        source=str(path),
    )
