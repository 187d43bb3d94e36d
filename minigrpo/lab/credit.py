"""Which tokens an advantage pushes up and down: the credit table of notebook 11.

For one batch with graded steps (a step reward function, step_rewards.py), every policy token belongs to a step (the
first step that ends at or after it) that is right or wrong, in a completion whose answer is right or wrong. For each
advantage scheme, the table counts the share of those tokens given a positive advantage (pushed up: more likely),
a negative one (pushed down) or 0 (not trained):

    answer  step    tokens   outcome: up / down / 0    process: up / down / 0
    right   right   ...
    wrong   right   ...      <- outcome supervision can only push these down; process supervision can push them up
    wrong   wrong   ...
"""

import torch

__all__ = ["token_steps", "credit_table", "format_credit_table"]


def token_steps(step_rewards: torch.Tensor, step_end: torch.Tensor, num_tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(step index (N, T), step right (N, T)) of every token: its step is the first whose end is at or after it
    (-1 past the last step); right when that step's reward is at least 0.5. step_rewards (N, K), NaN past a row's
    steps; step_end (N, K) token indices, rising along each row's steps."""
    graded = ~step_rewards.isnan()
    ends = step_end.masked_fill(~graded, num_tokens + 1).contiguous()  # padding sorts last
    t = torch.arange(num_tokens).expand(len(step_end), -1).contiguous()  # (N, T)
    index = torch.searchsorted(ends, t)  # (N, T) first step with end >= t
    has_step = index < graded.sum(1, keepdim=True)
    right = step_rewards.nan_to_num(0.0).gather(1, index.clamp(max=step_rewards.shape[1] - 1)) >= 0.5
    return index.masked_fill(~has_step, -1), right & has_step


def credit_table(advantages: dict[str, torch.Tensor], step_rewards: torch.Tensor, step_end: torch.Tensor,
                 mask: torch.Tensor, answer_right: torch.Tensor) -> list[dict]:
    """One row per (answer right?, step right?): its policy tokens and, per scheme, the fractions pushed up, down and
    left at 0. advantages: {scheme: (N,) or (N, T)}; mask (N, T) the policy's tokens; answer_right (N,) bool."""
    index, step_right = token_steps(step_rewards, step_end, mask.shape[1])
    on = mask.bool() & (index >= 0)
    rows = []
    for answer in (True, False):
        for step in (True, False):
            cell = on & (answer_right.unsqueeze(1) == answer) & (step_right == step)
            row = {"answer": "right" if answer else "wrong", "step": "right" if step else "wrong",
                   "tokens": int(cell.sum())}
            for name, adv in advantages.items():
                a = (adv.unsqueeze(1) if adv.dim() == 1 else adv).expand_as(mask)[cell]
                n = max(a.numel(), 1)
                row[name] = {"up": (a > 0).sum().item() / n, "down": (a < 0).sum().item() / n,
                             "zero": (a == 0).sum().item() / n, "mean": a.mean().item() if a.numel() else 0.0}
            rows.append(row)
    return rows


def format_credit_table(rows: list[dict]) -> str:
    """The table as text: for each scheme, % of the cell's tokens pushed up / down / left at 0, and the mean A."""
    schemes = [k for k in rows[0] if k not in ("answer", "step", "tokens")]
    head = f"{'answer':7s} {'step':6s} {'tokens':>7s}" + "".join(f"   {s + ': up / down / 0, mean A':>34s}" for s in schemes)
    lines = [head]
    for r in rows:
        cells = "".join(f"   {100 * r[s]['up']:9.0f}% {100 * r[s]['down']:5.0f}% {100 * r[s]['zero']:5.0f}% "
                        f"{r[s]['mean']:+7.2f}" for s in schemes)
        lines.append(f"{r['answer']:7s} {r['step']:6s} {r['tokens']:7d}{cells}")
    return "\n".join(lines)
