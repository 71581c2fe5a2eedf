"""Typed inputs: the model, the training options, the parallel configuration, and the file loaders."""

from gplan.spec.model import LayerKind, ModelSpec
from gplan.spec.training import Precision, TrainingSpec

__all__ = ["LayerKind", "ModelSpec", "Precision", "TrainingSpec"]
