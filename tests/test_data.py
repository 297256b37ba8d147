"""recops.data: interaction readers on fixture files, the chronological leave-one-out split,
jagged training / evaluation batches, and the synthetic generator."""

import importlib.util

import pytest
import torch

from recops.data import (
    UserSequences,
    eval_batches,
    load_dataset,
    read_interactions,
    request_batch,
    synthetic_sequences,
    train_batches,
)

# The same six interactions in each format: user u7 rated three items, u3 two (u3 is dropped by
# the split, which needs three), with a timestamp tie between items 20 and 10 of u7.
ROWS = [("7", "20", "4", "300"), ("3", "10", "5", "100"), ("7", "10", "3", "300")]
ROWS += [("3", "30", "1", "50"), ("7", "40", "2", "200"), ("9", "20", "5", "10")]
FORMATS = {
    "ratings.dat": ("", "::"),
    "ratings.csv": ("userId,movieId,rating,timestamp\n", ","),
    "ml.inter": ("user_id:token\titem_id:token\trating:float\ttimestamp:float\n", "\t"),
}


def write(path, header, separator, rows):
    path.write_text(header + "".join(separator.join(row) + "\n" for row in rows))
    return path


@pytest.mark.parametrize("name", FORMATS)
def test_readers_map_ids_in_order_of_appearance(tmp_path, name):
    header, separator = FORMATS[name]
    interactions = read_interactions(write(tmp_path / name, header, separator, ROWS))
    assert interactions.users.tolist() == [0, 1, 0, 1, 0, 2]
    assert interactions.items.tolist() == [1, 2, 2, 3, 4, 1]
    assert interactions.item_tokens == ["20", "10", "30", "40"]
    assert interactions.timestamps.tolist() == [300, 100, 300, 50, 200, 10]
    assert interactions.source.endswith(name)


def test_inter_header_locates_columns_and_float_timestamps(tmp_path):
    # recbole files may order columns freely and write timestamps as floats.
    path = tmp_path / "x.inter"
    path.write_text("timestamp:float\titem_id:token\tuser_id:token\n5.0\tA\tu\n\n7\tB\tu\n")
    interactions = read_interactions(path)
    assert interactions.timestamps.tolist() == [5, 7]
    assert interactions.item_tokens == ["A", "B"]


@pytest.mark.parametrize(
    "name, body, message",
    [
        ("ratings.dat", "1::2::3::4\n1::2::3\n", r"ratings\.dat, line 2: expected 4 fields"),
        ("ratings.dat", "1::2::3::4\n\n1::2::3::soon\n", r"line 3: timestamp 'soon' is not"),
        ("ratings.dat", "1::::3::4\n", r"line 1: empty user or item id"),
        ("ratings.csv", "userId,movieId,rating\n1,2,3\n", r"ratings\.csv, line 1: header"),
        ("ratings.csv", "userId,movieId,rating,timestamp\n1,2,3,4,5\n", r"line 2: expected 4"),
        ("ml.inter", "user_id:token\titem_id:token\ttimestamp:float\n1\t2\tnan\n", "line 2"),
    ],
)
def test_malformed_line_names_file_and_line(tmp_path, name, body, message):
    path = tmp_path / name
    path.write_text(body)
    with pytest.raises(ValueError, match=message):
        read_interactions(path)


def test_unknown_file_type_and_missing_data(tmp_path):
    with pytest.raises(ValueError, match="unknown interaction file type"):
        read_interactions(write(tmp_path / "ratings.txt", "", " ", ROWS))
    with pytest.raises(FileNotFoundError, match="not ml-100k, synthetic, or an existing file"):
        load_dataset(str(tmp_path / "absent.dat"))


def test_sequences_are_chronological_per_user(tmp_path):
    data = load_dataset(str(write(tmp_path / "ratings.dat", "", "::", ROWS)))
    # u7: item 40 at t=200, then items 20 and 10 tied at t=300 in file order; u3, u9 dropped.
    assert data.num_users == 1 and data.num_items == 4
    assert data.items.tolist() == [4, 1, 2]
    assert data.timestamps.tolist() == [200, 300, 300]
    assert data.offsets.tolist() == [0, 3]


@pytest.mark.skipif(importlib.util.find_spec("recbole") is None, reason="recbole not installed")
def test_movielens_100k_from_the_recbole_wheel():
    data = load_dataset("ml-100k")
    assert (data.num_users, data.num_items, data.items.numel()) == (943, 1682, 100_000)
    for u in (0, 500, 942):
        ts = data.timestamps[data.offsets[u] : data.offsets[u + 1]]
        assert bool((ts[1:] >= ts[:-1]).all())


def small_data():
    return synthetic_sequences(30, 40, 3, 12, num_groups=4, seed=3)


def user_items(data, user):
    return data.items[data.offsets[user] : data.offsets[user + 1]]


def test_leave_one_out_split():
    data = small_data()
    lengths = data.lengths
    assert torch.equal(data.history_lengths("train"), lengths - 2)
    assert torch.equal(data.history_lengths("valid"), lengths - 2)
    assert torch.equal(data.history_lengths("test"), lengths - 1)
    with pytest.raises(ValueError, match="unknown split"):
        data.history_lengths("dev")


def test_train_batches_predict_each_next_item():
    data, max_len = small_data(), 6
    batches = list(train_batches(data, 8, max_len, torch.Generator().manual_seed(0)))
    seen_users = []
    for batch in batches:
        lengths = batch.lengths
        assert int(lengths.max()) <= max_len and batch.padded_len == int(lengths.max())
        assert torch.equal(batch.targets, batch.item_ids[batch.query_rows + 1])
        assert torch.equal(torch.nonzero(batch.predicts_next).flatten(), batch.query_rows)
        assert batch.query_rows.numel() == int((lengths - 1).sum())  # all rows but the last
        assert not batch.predicts_next[batch.seq_offsets[1:] - 1].any()
        for b in range(batch.batch_size):
            rows = batch.item_ids[batch.seq_offsets[b] : batch.seq_offsets[b + 1]]
            # Find the user whose training history ends with these rows (the last max_len).
            matches = [
                u
                for u in range(data.num_users)
                if torch.equal(user_items(data, u)[:-2][-max_len:], rows)
            ]
            assert matches
            seen_users.append(matches[0])
    # Every user with two training items (one to predict from, one to predict), once.
    trainable = torch.nonzero(data.history_lengths("train") >= 2).flatten().tolist()
    assert sorted(seen_users) == trainable


def test_eval_batches_end_with_a_request_token():
    data, max_len = small_data(), 5
    batch = next(eval_batches(data, "test", 64, max_len))
    for b in range(batch.batch_size):
        start, end = int(batch.seq_offsets[b]), int(batch.seq_offsets[b + 1])
        items = user_items(data, b)
        times = data.timestamps[data.offsets[b] : data.offsets[b + 1]]
        assert batch.item_ids[end - 1] == 0 and batch.query_rows[b] == end - 2
        assert batch.timestamps[end - 1] == times[-1]  # the test target's time
        assert torch.equal(batch.item_ids[start : end - 1], items[:-1][-(max_len - 1) :])
        assert batch.targets[b] == items[-1]
        offsets, items_seen = batch.seen
        seen = items_seen[offsets[b] : offsets[b + 1]]
        assert torch.equal(seen, items[:-1])  # the whole history, not only the window


def test_request_batch_rejects_empty_history():
    with pytest.raises(ValueError, match="at least one item"):
        request_batch(
            torch.tensor([3]), torch.tensor([1]), torch.tensor([0, 0, 1]), torch.tensor([2, 2]), 4
        )


def test_synthetic_is_reproducible_and_well_formed():
    a, b = small_data(), small_data()
    assert torch.equal(a.items, b.items) and torch.equal(a.timestamps, b.timestamps)
    assert isinstance(a, UserSequences)
    assert int(a.lengths.min()) >= 3 and int(a.lengths.max()) <= 12
    assert int(a.items.min()) >= 1 and int(a.items.max()) <= 40
    for u in range(a.num_users):
        times = a.timestamps[a.offsets[u] : a.offsets[u + 1]]
        assert bool((times[1:] > times[:-1]).all())
        groups = (user_items(a, u) - 1) // 10
        assert bool((groups == groups[0]).all())  # one group per user
    with pytest.raises(ValueError, match="multiple of num_groups"):
        synthetic_sequences(2, 10, 3, 4, num_groups=3)
