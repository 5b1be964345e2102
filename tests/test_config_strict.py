"""Strict mode: every disagreement with an explicit value raises, with the warning's own text."""

from __future__ import annotations

import pytest

from checkpoints import deepseek_v3, eagle3_head, llama, mtp_head, silent, write_checkpoint
from specsure.config import ConfigConflictError, ConfigError, resolve


def _cases(root):
    llama_target = str(write_checkpoint(root / "target", llama(layers=4)))
    mtp_target = str(write_checkpoint(root / "dsv3", deepseek_v3(mtp_layers=1)))
    eagle3 = str(write_checkpoint(root / "eagle3-head", eagle3_head()))
    mtp_draft = str(write_checkpoint(root / "mtp-draft", deepseek_v3(mtp_layers=1)))
    eagle3_path = str(write_checkpoint(root / "eagle3", silent()))
    head = str(write_checkpoint(root / "head", mtp_head(modules=1)))
    n_predict = str(write_checkpoint(root / "n-predict", llama(layers=2, n_predict=3)))
    return {
        "method vs draft architectures": ({"method": "eagle", "model": eagle3}, llama_target, "method"),
        "method vs draft MTP layers": ({"method": "draft_model", "model": mtp_draft}, llama_target, "method"),
        "method vs path token": ({"method": "eagle", "model": eagle3_path}, llama_target, "method"),
        "model vs target MTP layers": ({"method": "mtp", "model": head}, mtp_target, "model"),
        "k vs draft n_predict": ({"method": "draft_model", "model": n_predict, "num_speculative_tokens": 5},
                                 llama_target, "num_speculative_tokens"),
    }


CASES = ("method vs draft architectures", "method vs draft MTP layers", "method vs path token",
         "model vs target MTP layers", "k vs draft n_predict")


@pytest.mark.parametrize("case", CASES)
def test_strict_raises_with_the_warning_text(tmp_path, case):
    spec, target, field = _cases(tmp_path)[case]
    [warning] = resolve(spec, model=target).warnings
    assert warning.startswith(f"{field}: you set ")
    with pytest.raises(ConfigConflictError) as info:
        resolve(spec, model=target, strict=True)
    said, kept = warning.split(" Keeping your value ")
    assert said in str(info.value)  # the same disagreement, with its signal
    # ... but an error keeps nothing: it says how to agree instead, and offers leaving strict off only
    # where the kept value would run
    assert "Keeping your value" not in str(info.value)
    try:
        resolve(spec, model=target).check_runnable(weights=False)
    except ConfigError as exc:
        assert "leave strict off" not in str(info.value)
        assert f"Leaving strict off would not run it either: {exc}" in str(info.value)
    else:
        assert "leave strict off" in str(info.value)
    assert isinstance(info.value, ConfigError) and isinstance(info.value, ValueError)


def test_strict_offers_leaving_strict_off_where_that_runs(tmp_path):
    """Both ways out are checked: the same kind of conflict, runnable and not."""
    runs = [case for case in CASES if _runs(*_cases(tmp_path)[case][:2])]
    assert runs and len(runs) < len(CASES)


def _runs(spec, target) -> bool:
    try:
        resolve(spec, model=target).check_runnable(weights=False)
    except ConfigError:
        return False
    return True


def test_strict_k_conflict_names_both_values_and_the_key(tmp_path):
    spec, target, _ = _cases(tmp_path)["k vs draft n_predict"]
    with pytest.raises(ConfigConflictError, match=r"you set 5, but the evidence suggests 3 .*n_predict=3"):
        resolve(spec, model=target, strict=True)


def test_strict_without_disagreement_resolves(tmp_path):
    target = str(write_checkpoint(tmp_path / "target", llama(layers=4)))
    head = str(write_checkpoint(tmp_path / "head", eagle3_head()))
    res = resolve({"method": "eagle3", "model": head}, model=target, strict=True)
    assert res.strict and res.config.method == "eagle3" and res.warnings == ()


def test_strict_allows_filling_unset_fields(tmp_path):
    """Detection filling an unset field is not a disagreement."""
    target = str(write_checkpoint(tmp_path / "target", llama(layers=4)))
    head = str(write_checkpoint(tmp_path / "head", eagle3_head()))
    res = resolve({"model": head}, model=target, strict=True)
    assert res.config.method == "eagle3"


def test_deprecated_alias_is_not_a_conflict_in_strict_mode(tmp_path):
    target = str(write_checkpoint(tmp_path / "dsv3", deepseek_v3(mtp_layers=1)))
    res = resolve({"method": "deepseek_mtp"}, model=target, strict=True)
    assert res.config.method == "mtp"
    assert any("deepseek_mtp" in w for w in res.warnings)
