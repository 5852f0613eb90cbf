"""Workloads: the layer-graph types, the built-in zoo and user model files."""

from __future__ import annotations

from distsim.core.models.graph import FP16_MIXED, FP32, Block, Layer, Model, Precision
from distsim.core.models.loader import model_from_dict
from distsim.core.models.zoo import ALIASES, ZOO, get_model

__all__ = [
    "ALIASES",
    "FP16_MIXED",
    "FP32",
    "ZOO",
    "Block",
    "Layer",
    "Model",
    "Precision",
    "get_model",
    "model_from_dict",
]
