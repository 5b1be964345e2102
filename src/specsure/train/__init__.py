"""Distilling draft heads from a target: self-distillation data, MTP and EAGLE-3 training, head folders.

Imports decode, proposers, models, sampling and config only (docs/architecture.md, "Layers"): the trained
module is the proposer's own class, and the data is generated on the engine.
"""

from specsure.train.checkpoint import check_out_dir, save_head, save_mtp_head
from specsure.train.data import Sample, self_distill
from specsure.train.eagle3 import Eagle3Evaluation, Eagle3TrainResult, Eagle3TrainSettings, train_eagle3
from specsure.train.mtp import Evaluation, MTPTrainResult, MTPTrainSettings, evaluate, initial_module, train_mtp

__all__ = ["Eagle3Evaluation", "Eagle3TrainResult", "Eagle3TrainSettings", "Evaluation", "MTPTrainResult",
           "MTPTrainSettings", "Sample", "check_out_dir", "evaluate", "initial_module", "save_head", "save_mtp_head",
           "self_distill", "train_eagle3", "train_mtp"]
