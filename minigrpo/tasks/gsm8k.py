"""``gsm8k``: grade-school math word problems (Cobbe et al. 2021), the task of TRL's and Unsloth's GRPO notebooks.

    question   "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May.
                How many clips did Natalia sell altogether in April and May?"
    answer     "Natalia sold 48/2 = <<48/2=24>>24 clips in May. ... #### 72"

Rows come from the hub (``openai/gsm8k``, config ``main``: 7,473 train and 1,319 test problems) through
`datasets`, or from a local copy in the hub's format (``--dataset path``: a folder with train/test
JSONL or parquet files, or one such file). Each row becomes a chat prompt with DeepSeek-R1's system prompt:

    prompt     [{"role": "system", "content": R1_SYSTEM_PROMPT}, {"role": "user", "content": question}]
    answer     "72"          the number after "####" (commas dropped)
    solution   the original worked answer, kept as a column (reward functions receive it too)

Grading is ``AnswerTask``'s: the completion's ``<answer>`` (else ``\\boxed{}``, else its last number) must equal
the reference as a number, so "72", "72.0", "$72" and "<answer> 72 </answer>" are right.
"""

from dataclasses import dataclass

from .answers import R1_SYSTEM_PROMPT, AnswerTask
from .base import DataError

__all__ = ["Gsm8kTask", "gsm8k_reference"]


def gsm8k_reference(solution: str) -> str:
    """The final answer of a GSM8K worked solution: what follows "####", commas dropped ("1,234" -> "1234")."""
    if "####" not in solution:
        raise DataError(f"gsm8k: a reference solution without '####': {solution[-80:]!r}")
    return solution.rsplit("####", 1)[1].strip().replace(",", "")


@dataclass(frozen=True)
class Gsm8kTask(AnswerTask):
    name: str = "gsm8k"
    max_completion_length: int = 512  # Qwen2.5-Instruct's solutions run ~150-300 tokens; 256 truncates some
    dataset: str | None = "openai/gsm8k"
    dataset_config: str | None = "main"

    def prepare_row(self, row: dict) -> dict:
        """A hub row {"question", "answer": "... #### 72"} -> {"prompt": [system, user], "answer": "72",
        "solution": ...}. A row that already has a "prompt" (data you prepared yourself) is kept as it is."""
        if "prompt" in row or "question" not in row:
            return row
        solution = str(row.get("answer", ""))
        return {
            "prompt": [{"role": "system", "content": R1_SYSTEM_PROMPT}, {"role": "user", "content": row["question"]}],
            "answer": gsm8k_reference(solution), "solution": solution,
        }
