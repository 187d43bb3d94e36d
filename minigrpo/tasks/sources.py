"""Where a task's rows come from: its shipped JSONL files, a file or folder of yours, or the Hugging Face hub.

    read_dataset("data/my_rows.jsonl", "train")      a JSONL, JSON-lines or parquet file
    read_dataset("path/to/gsm8k", "test")            a folder holding test.jsonl, test.parquet or test-*.parquet
                                                     (also under a config subfolder, as the hub lays them out)
    read_dataset("openai/gsm8k", "test", "main")     anything else: a hub dataset, through `datasets.load_dataset`

A single file is one pool of rows: its last tenth (at most 500 rows, at least 1) is held out as the "test" split
and the rest is "train", so evaluation never scores problems the policy trained on.

Rows come back as plain dicts, one per problem; every column is kept (TRL hands the columns other than
"prompt" to the reward functions, and so does minigrpo). Checking that the columns a task needs are there is
the task's job (base.check_row). Nothing here needs a model.
"""

import hashlib
import json
from pathlib import Path

from ..errors import MinigrpoError

__all__ = ["read_dataset", "held_out_size", "json_lines", "DataError", "dataset_rows", "hold_out", "describe_rows"]

FILE_SUFFIXES = (".jsonl", ".json", ".parquet")


class DataError(MinigrpoError, ValueError):
    """A task's data file that cannot be read as rows; the message names the file and the line."""


def json_lines(path: Path) -> list[tuple[int, object]]:
    """(line number, parsed value) for each non-empty line of a JSONL file; DataError naming file:line otherwise."""
    parsed = []
    with open(path) as f:
        for number, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                parsed.append((number, json.loads(line)))
            except json.JSONDecodeError as exc:
                raise DataError(f"{path}:{number}: not valid JSON ({exc.msg})") from None
    return parsed


def held_out_size(num_rows: int) -> int:
    """Rows a single file keeps back for evaluation: a tenth, at most 500, at least 1 (0 for a 1-row file)."""
    return 0 if num_rows < 2 else min(500, max(1, num_rows // 10))


def read_dataset(source: str, split: str | None, config: str | None = None) -> list[dict]:
    """The rows of ``split`` from a local file or folder, or from the hub (see the module docstring). A file with
    split None: all its rows."""
    path = Path(source).expanduser()
    if path.is_file():
        rows = _read_file(path)
        if split is None:
            return rows
        n_test = held_out_size(len(rows))
        if split == "test":
            return rows[len(rows) - n_test:]
        return rows[: len(rows) - n_test]
    if path.is_dir():
        return _read_file(_split_file(path, split, config))
    if source.startswith((".", "/", "~")) or source.endswith(FILE_SUFFIXES):
        raise DataError(f"dataset_name: {source} does not exist")
    return _read_hub(source, split, config)


def _split_file(folder: Path, split: str, config: str | None) -> Path:
    """The file of ``split`` in ``folder``: split.jsonl / split.json / split.parquet / split-*.parquet, looked for in
    folder/config/ first when a config is named (the hub's layout: main/test-00000-of-00001.parquet)."""
    for where in ([folder / config] if config else []) + [folder]:
        candidates = [where / f"{split}{suffix}" for suffix in FILE_SUFFIXES] + sorted(where.glob(f"{split}-*.parquet"))
        found = [c for c in candidates if c.is_file()]
        if len(found) > 1 and all(c.suffix == ".parquet" for c in found):
            raise DataError(f"dataset_name: {where} has {split} in {len(found)} parquet shards; merge them into one file")
        if found:
            return found[0]
    raise DataError(f"dataset_name: no {split!r} split in {folder} (looked for {split}.jsonl, {split}.json, "
                    f"{split}.parquet, {split}-*.parquet{f' under {config}/' if config else ''})")


def _read_file(path: Path) -> list[dict]:
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq  # comes with `datasets`

        try:
            return pq.read_table(path).to_pylist()
        except Exception as exc:  # noqa: BLE001 - one line naming the file
            raise DataError(f"{path}: not a readable parquet file ({exc})") from None
    rows = []
    for number, row in json_lines(path):
        if not isinstance(row, dict):
            raise DataError(f"{path}:{number}: expected a JSON object, got {type(row).__name__}")
        rows.append(row)
    return rows


def _read_hub(name: str, split: str, config: str | None) -> list[dict]:
    try:
        import datasets
    except ImportError:
        raise DataError(f"dataset_name: {name!r} is not a local file or folder, and loading it from the hub needs "
                        f"`pip install datasets`") from None
    try:
        dataset = datasets.load_dataset(name, config, split=split)
    except Exception as exc:  # noqa: BLE001 - offline, a typo, a missing split: one line, the cause kept
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise DataError(
            f"dataset_name: cannot load {name!r} (split {split!r}) from the Hugging Face hub: {reason[:300]}. "
            f"Offline? Give a local copy instead: a .jsonl/.parquet file or a folder with {split} files"
        ) from None
    return [dict(row) for row in dataset]


def dataset_rows(dataset, argument: str = "train_dataset") -> list[dict]:
    """A dataset handed over from Python as a list of row dicts: a `datasets.Dataset`, or a list of dicts (TRL's
    formats: a "prompt" string or list of messages, any other columns). A streaming IterableDataset, a
    DatasetDict or anything else is a one-line DataError naming the argument."""
    if isinstance(dataset, list) and all(isinstance(row, dict) for row in dataset):
        return [dict(row) for row in dataset]
    kind = type(dataset).__name__
    if kind == "DatasetDict":
        raise DataError(f"{argument}: a DatasetDict of splits ({', '.join(dataset)}); pass one split, e.g. "
                        f"dataset[{next(iter(dataset), 'train')!r}]")
    if kind == "IterableDataset" or not hasattr(dataset, "__len__") or not hasattr(dataset, "column_names"):
        raise DataError(f"{argument}: expected a datasets.Dataset or a list of dicts, got a {kind} (a streaming "
                        f"dataset must be materialised first: Dataset.from_list(list(stream.take(n))))")
    return [dict(row) for row in dataset]


def hold_out(rows: list[dict]) -> tuple[list[dict], list[dict]]:
    """(train, test) of one pool of rows, as for a single file: the last tenth (held_out_size) is the test split."""
    n_test = held_out_size(len(rows))
    return rows[: len(rows) - n_test], rows[len(rows) - n_test:]


def describe_rows(rows: list[dict], source: str = "rows") -> str:
    """What config.yaml records for rows handed over as an object: how many, their columns, and a hash of their
    content (the same rows give the same text, so a resumed run is checked against the data it started with)."""
    digest = hashlib.sha256()
    for row in rows:
        digest.update(json.dumps(row, sort_keys=True, default=str).encode())
    columns = sorted({key for row in rows for key in row})
    return f"<{source}: {len(rows)} rows, columns {', '.join(columns)}; sha256 {digest.hexdigest()[:12]}>"
