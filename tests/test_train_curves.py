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
