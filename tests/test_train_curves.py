"""The training-curve plot of written heads (python -m specsure.train.curves)."""

from __future__ import annotations


def test_training_curves_are_drawn_from_training_json(tmp_path) -> None:
    import json

    from specsure.train.curves import curve_data, main

    head = tmp_path / "head"
    head.mkdir()
    training = {"method": "eagle3", "losses": [4.0, 2.0, 3.0],
                "curve": [{"step": 0, "heldout_acceptance_length": 1.0}, {"step": 3, "heldout_acceptance_length": 1.5}]}
    (head / "training.json").write_text(json.dumps(training))
    data = curve_data(training)
    assert data["loss"] == [4.0, 3.0, 3.0] and data["eval_steps"] == [0, 3] and data["acceptance"] == [1.0, 1.5]
    assert main([str(tmp_path / "c.png"), str(head)]) == 0 and (tmp_path / "c.png").stat().st_size > 1000
    assert main([str(tmp_path / "d.png"), str(tmp_path)]) == 2


def test_a_continued_head_draws_each_run_after_the_one_it_continued() -> None:
    from specsure.train.curves import head_curves

    first = {"method": "eagle3", "losses": [5.0, 4.0], "heldout": {"k": 1},
             "curve": [{"step": 0, "heldout_acceptance_length": 1.0}, {"step": 2, "heldout_acceptance_length": 1.4}]}
    second = {"method": "eagle3", "losses": [3.0, 3.0, 3.0], "heldout": {"k": 3}, "continued_from": first,
              "curve": [{"step": 0, "heldout_acceptance_length": 1.6}, {"step": 3, "heldout_acceptance_length": 2.0}]}
    one, two = head_curves(second)
    assert one["label"] == "eagle3 (k = 1)" and one["steps"] == [1, 2] and one["eval_steps"] == [0, 2]
    assert two["label"] == "eagle3 continued (k = 3)" and two["steps"] == [3, 4, 5] and two["eval_steps"] == [2, 5]
    assert two["acceptance"] == [1.6, 2.0] and two["loss"] == [3.0, 3.0, 3.0]
