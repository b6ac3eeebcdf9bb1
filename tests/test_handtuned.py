"""Published hand-tuned configurations load and are costed as the framework that ran them; gbmw's runtime plan fits
and is at least as fast as each one that fits."""

import pytest

from gbmw.cli.compare import compare_handtuned
from gbmw.errors import SpecError
from gbmw.handwritten.handtuned_config import load_handtuned
from gbmw.specs.bundled import RECIPES_DIR
from gbmw.specs.jobs import load_job

CONFIGS = sorted(path.stem for path in (RECIPES_DIR / "handtuned").glob("*.yaml"))


def test_every_model_has_handtuned_configurations():
    applied = {load_handtuned(name).applies_to for name in CONFIGS}
    assert applied == {"gpt3-15b", "gpt3-39b", "gpt3-65b", "mixtral-8x7b"}


@pytest.mark.parametrize("name", CONFIGS)
def test_gbmw_fits_and_is_no_slower_than_a_handtuned_config_that_fits(name):
    config = load_handtuned(name)
    assert "http" in config.source
    job = load_job(f"{config.applies_to}_a100-80g-x32")
    comparison = compare_handtuned(job, config)
    label, handtuned, _ = comparison.rows[0]
    assert label.startswith("hand-tuned") and handtuned is not None and handtuned.target == config.target
    runtime = comparison.rows[1][1]
    assert runtime.global_batch == handtuned.global_batch and runtime.estimate.fits
    if handtuned.estimate.fits:
        assert runtime.estimate.samples_per_s >= handtuned.estimate.samples_per_s


def test_bad_handtuned_file(tmp_path):
    path = tmp_path / "x.yaml"
    path.write_text("name: x\ndescription: d\nsource: s\napplies_to: gpt3-15b\ntarget: megatron-core\npublished: {}\n"
                    "config: {tp: 3, colour: red}\n")
    with pytest.raises(Exception, match="cannot read 'colour=red'"):
        load_handtuned(path)
    with pytest.raises(SpecError, match="no such file or bundled recipe"):
        load_handtuned("no-such-config")
