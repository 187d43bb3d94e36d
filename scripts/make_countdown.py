"""Write Countdown's train and test splits to data/tasks/countdown/ (deterministic; no problem in both splits).

    python scripts/make_countdown.py            # 10,000 train and 500 test problems, seeds 0 and 1

The generator is minigrpo/tasks/countdown.py: 3-4 numbers in 1..99, a target in 1..999 reachable using every
number exactly once, one solution kept as the row's "answer".
"""

import argparse
import json
from pathlib import Path

from minigrpo.tasks import get_task
from minigrpo.tasks.countdown import problem_key


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--train", type=int, default=10_000)
    p.add_argument("--test", type=int, default=500)
    args = p.parse_args()
    task = get_task("countdown")
    test = task.make_rows(args.test, seed=1)
    train = task.make_rows(args.train, seed=0, exclude={problem_key(r) for r in test})
    task.data_dir.mkdir(parents=True, exist_ok=True)
    for split, rows in (("train", train), ("test", test)):
        path = Path(task.data_dir) / f"{split}.jsonl"
        compact = [{k: v for k, v in row.items() if k != "prompt"} for row in rows]  # load() rebuilds the prompt
        path.write_text("".join(json.dumps(row) + "\n" for row in compact))
        print(f"{path}: {len(rows)} problems, {path.stat().st_size / 1e3:.0f} kB")


if __name__ == "__main__":
    main()
