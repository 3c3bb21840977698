"""When a warm-up has settled: one rank's step times agreeing (:func:`settled`), and every rank agreeing to stop
(:func:`agree_settled`), so that the ranks keep running the same number of steps."""

from __future__ import annotations


def settled(times: list[float], count: int, tolerance: float) -> bool:
    """True when the last ``count`` step times agree within ``tolerance`` of their median.

    >>> settled([3.0, 1.02, 1.0], 2, 0.1), settled([3.0, 1.5, 1.0], 2, 0.1), settled([1.0], 2, 0.1)
    (True, False, False)
    """
    if count < 1 or len(times) < count:
        return False
    last = sorted(times[-count:])
    middle = last[len(last) // 2]
    return middle > 0 and (last[-1] - last[0]) <= tolerance * middle


def agree_settled(mine: bool, cuda: bool) -> bool:
    """True when every rank's warm-up settled (a MIN all-reduce: one rank still moving keeps them all going)."""
    import torch
    import torch.distributed as dist

    flag = torch.tensor([1 if mine else 0], dtype=torch.int32)
    if cuda:
        flag = flag.cuda()
    dist.all_reduce(flag, op=dist.ReduceOp.MIN)
    return bool(flag.item())
