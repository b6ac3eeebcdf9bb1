"""Published hand-tuned configurations (recipes/handtuned/): what the source states, and the uniform 3D
configuration (gbmw.handwritten.uniform_config) gbmw costs for it, by the same estimator as its own plans."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from gbmw.handwritten.uniform_config import UniformConfig
from gbmw.specs.bundled import resolve_recipe
from gbmw.specs.files import read_yaml
from gbmw.specs.schema import validate_as


class HandTunedConfig(BaseModel):
    """A published 3D configuration: what the source states, and the uniform config gbmw costs."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    description: str
    source: str
    applies_to: str
    """The model recipe it is compared on (e.g. gpt3-39b)."""
    target: str
    """The framework that ran it, as a gbmw target: megatron-core (Megatron-LM, NeMo) or megatron-deepspeed."""
    published: dict[str, Any]
    config: dict[str, Any]
    """--uniform keys: tp, pp, zero, ckpt, micro, optionally sp and batch."""
    notes: str = ""

    @property
    def uniform(self) -> UniformConfig:
        return UniformConfig.parse(",".join([f"{key}={value}" for key, value in self.config.items()]
                                            + [f"target={self.target}"]))


def load_handtuned(path: str | Path) -> HandTunedConfig:
    """Load a hand-tuned configuration (a path or a name under recipes/handtuned/)."""
    path = resolve_recipe(str(path), "handtuned")
    config = validate_as(HandTunedConfig, read_yaml(path), str(path))
    config.uniform  # an unreadable config fails here, naming its key
    return config
