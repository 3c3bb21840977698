"""The grid baseline under ask-and-tell: exhausting the grid must not crash the loop's tell."""

import optuna

from tuner.study import AskTellGridSampler


def test_exhausted_grid_does_not_raise_on_tell() -> None:
    study = optuna.create_study(sampler=AskTellGridSampler({"stage": [0, 1], "micro_batch": [1, 2]}, seed=0))
    seen = set()
    for _ in range(6):  # more asks than grid points
        trial = study.ask()
        seen.add((trial.suggest_categorical("stage", [0, 1]), trial.suggest_categorical("micro_batch", [1, 2])))
        study.tell(trial, 1.0)
    assert len(seen) == 4
