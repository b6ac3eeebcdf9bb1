"""Bundled cluster recipes cut down to 1 or 2 devices, for tests whose processes are the plan's whole world."""

from __future__ import annotations

from pathlib import Path


def small_a100_cluster(folder: Path, devices: int) -> Path:
    """The a100-80g-x8 recipe on `devices` devices (a YAML written into `folder`): every plan fits 1 or 2 processes,
    and the device has fp16 and bf16 rates, so a config in either precision plans."""
    import yaml

    from gbmw.specs.bundled import RECIPES_DIR

    cluster = yaml.safe_load((RECIPES_DIR / "clusters" / "a100-80g-x8.yaml").read_text())
    cluster.update(name=f"a100-80g-x{devices}", devices_per_node=devices)
    cluster["links"] = [{**cluster["links"][0], "devices": devices}]
    path = folder / f"a100-80g-x{devices}.yaml"
    path.write_text(yaml.safe_dump(cluster))
    return path
