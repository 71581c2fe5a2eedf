"""Typed inputs: the model, the training options, and their loaders."""

from gplan.spec.model import LayerKind, ModelSpec
from gplan.spec.training import Precision, TrainingSpec
from gplan.spec.loaders import load_model, load_yaml_file

__all__ = ["LayerKind", "ModelSpec", "Precision", "TrainingSpec", "load_model", "load_yaml_file"]
