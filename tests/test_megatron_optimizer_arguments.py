"""A ds_config's optimizer, schedule, clipping, loss scaling and offload as Megatron flags
(gbmw.adapters.megatron.optimizer_arguments): each supported key's flag, each inexpressible key's note."""

from __future__ import annotations

import pytest

from gbmw.adapters.megatron import ds_config_training_arguments
from gbmw.errors import GbmwError

ADAM = {"type": "Adam", "params": {"lr": 3e-4, "betas": [0.9, 0.95], "eps": 1e-6, "weight_decay": 0.1}}


def flags(config, target="megatron-core", precision="bf16", **options):
    """({flag: value or True}, notes) of the translation."""
    result = ds_config_training_arguments(config, target, precision=precision, **options)
    values, words = {}, list(result.arguments)
    for index, word in enumerate(words):
        if word.startswith("--"):
            following = words[index + 1] if index + 1 < len(words) else "--"
            values[word] = True if following.startswith("--") else following
    assert len(values) == sum(word.startswith("--") for word in words), "a flag written twice"
    return values, list(result.notes)


@pytest.mark.parametrize("target", ["megatron-core", "megatron-deepspeed"])
def test_adam_and_warmup_decay_restated(target):
    values, notes = flags({"optimizer": ADAM, "gradient_clipping": 0.5, "steps_per_print": 7, "scheduler": {
        "type": "WarmupDecayLR", "params": {"warmup_min_lr": 0, "warmup_max_lr": 2e-4, "warmup_num_steps": 500,
                                            "total_num_steps": 9000, "warmup_type": "linear"}}}, target)
    assert values == {"--optimizer": "adam", "--adam-beta1": "0.9", "--adam-beta2": "0.95", "--adam-eps": "1e-06",
                      "--weight-decay": "0.1", "--lr": "0.0002", "--lr-decay-style": "linear",
                      "--lr-warmup-iters": "500", "--lr-decay-iters": "9000", "--min-lr": "0", "--clip-grad": "0.5",
                      "--log-interval": "7"}
    assert notes == []


def test_deepspeed_defaults_are_restated_where_megatron_differs():
    """No weight_decay: DeepSpeed's FusedAdam runs 0 (Megatron's default 0.01); no gradient_clipping: DeepSpeed does
    not clip (Megatron clips at 1.0); no scheduler: a constant rate (Megatron decays linearly)."""
    values, notes = flags({"optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}})
    assert values["--weight-decay"] == "0" and values["--clip-grad"] == "0"
    assert values["--lr"] == "0.001" and values["--lr-decay-style"] == "constant"
    assert (values["--adam-beta1"], values["--adam-beta2"], values["--adam-eps"]) == ("0.9", "0.999", "1e-08")
    assert notes == []
    torch_adamw, _ = flags({"optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "torch_adam": True}}})
    assert torch_adamw["--weight-decay"] == "0.01"  # torch.optim.AdamW's default


def test_warmup_lr_and_warmup_start():
    config = {"optimizer": ADAM, "scheduler": {"type": "WarmupLR", "params": {
        "warmup_min_lr": 1e-5, "warmup_num_steps": 100, "warmup_type": "linear"}}}
    core, core_notes = flags(config, "megatron-core")
    assert core["--lr"] == "0.0003" and core["--lr-decay-style"] == "constant" and core["--lr-warmup-iters"] == "100"
    assert core["--lr-warmup-init"] == "1e-05" and "--lr-decay-iters" not in core and core_notes == []
    deepspeed, notes = flags(config, "megatron-deepspeed")
    assert "--lr-warmup-init" not in deepspeed
    assert notes == ["ds_config: `scheduler.params.warmup_min_lr` is not carried to Megatron-DeepSpeed's arguments: "
                     "the warm-up starts at 1e-05; Megatron-DeepSpeed's warms up from 0"]


def test_warmup_cosine_is_a_ratio_of_the_optimizers_rate():
    values, notes = flags({"optimizer": ADAM, "scheduler": {"type": "WarmupCosineLR", "params": {
        "warmup_min_ratio": 0.5, "cos_min_ratio": 0.1, "warmup_num_steps": 1, "total_num_steps": 50,
        "warmup_type": "linear"}}})
    assert values["--lr-decay-style"] == "cosine" and values["--lr"] == "0.0003"
    assert float(values["--min-lr"]) == pytest.approx(3e-5) and float(values["--lr-warmup-init"]) == pytest.approx(1.5e-4)
    assert values["--lr-warmup-iters"] == "2"  # DeepSpeed warms up over at least 2 steps
    assert notes == []


def test_sgd():
    values, notes = flags({"optimizer": {"type": "SGD", "params": {"lr": 0.1, "momentum": 0.8, "nesterov": True}}})
    assert (values["--optimizer"], values["--lr"], values["--sgd-momentum"], values["--weight-decay"]) == (
        "sgd", "0.1", "0.8", "0")
    assert notes == ["ds_config: `optimizer.params.nesterov` is not carried to Megatron-LM's arguments: Megatron's sgd "
                     "has no such setting"]


def test_fp16_loss_scaling():
    config = {"optimizer": ADAM, "fp16": {"enabled": True, "initial_scale_power": 12, "loss_scale_window": 500,
                                          "hysteresis": 3, "min_loss_scale": 0.5, "consecutive_hysteresis": True}}
    values, notes = flags(config, precision="fp16")
    assert (values["--initial-loss-scale"], values["--loss-scale-window"], values["--hysteresis"],
            values["--min-loss-scale"]) == ("4096", "500", "3", "0.5")
    assert notes == ["ds_config: `fp16.consecutive_hysteresis` is not carried to Megatron-LM's arguments: Megatron has "
                     "no such setting"]
    default, _ = flags({"optimizer": ADAM, "fp16": {"enabled": True}}, precision="fp16")
    assert default["--initial-loss-scale"] == "65536"  # DeepSpeed's 2^16, not Megatron's 2^32
    static, _ = flags({"optimizer": ADAM, "fp16": {"enabled": True, "loss_scale": 128}}, precision="fp16")
    assert static["--loss-scale"] == "128" and "--initial-loss-scale" not in static
    bf16, _ = flags(config, precision="bf16")
    assert "--initial-loss-scale" not in bf16 and "--loss-scale" not in bf16


def test_offload():
    config = {"optimizer": ADAM, "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu", "ratio": 0.5},
                                                       "offload_param": {"device": "nvme", "pin_memory": True}}}
    deepspeed, deepspeed_notes = flags(config, "megatron-deepspeed", zero_stage=3)
    assert deepspeed["--cpu-optimizer"] is True and deepspeed["--remote-device"] == "nvme"
    assert deepspeed["--use-pin-memory"] is True and deepspeed_notes == []
    core, notes = flags(config, "megatron-core", distributed_optimizer=True)
    assert core["--optimizer-cpu-offload"] is True and core["--use-precision-aware-optimizer"] is True
    assert core["--optimizer-offload-fraction"] == "0.5"
    assert any("`zero_optimization.offload_param` is not carried to Megatron-LM's arguments: Megatron-LM has no "
               "parameter offload" == note.split(": ", 1)[1] for note in notes)
    plain, notes = flags(config, "megatron-core", distributed_optimizer=False)
    assert "--optimizer-cpu-offload" not in plain
    assert any("CPU offload needs the distributed optimizer" in note for note in notes)


@pytest.mark.parametrize("config, key, why", [
    ({"optimizer": {"type": "Lamb", "params": {"lr": 1e-3}}}, "optimizer.type", "'Lamb' has no Megatron counterpart"),
    ({"optimizer": {"type": "Adam", "params": {"lr": 1e-3, "adam_w_mode": False}}}, "optimizer.params.adam_w_mode",
     "Megatron's adam decouples weight decay"),
    ({"optimizer": {"type": "Adam", "params": {"lr": 1e-3, "amsgrad": True}}}, "optimizer.params.amsgrad",
     "Megatron's adam has no such setting"),
    ({"optimizer": ADAM, "scheduler": {"type": "OneCycle", "params": {"cycle_min_lr": 0}}}, "scheduler",
     "'OneCycle' has no Megatron schedule"),
    ({"optimizer": ADAM, "scheduler": {"type": "WarmupDecayLR", "params": {"warmup_num_steps": 10}}},
     "scheduler.params.warmup_type", "absent, so DeepSpeed warms up on its default log curve"),
    ({"optimizer": ADAM, "scheduler": {"type": "WarmupDecayLR", "params": {"warmup_type": "linear"}}},
     "scheduler.params.total_num_steps", "WarmupDecayLR needs it"),
    ({}, "optimizer", "the config has none, so the training script chose it"),
    ({"optimizer": {"type": "AdamW", "params": {"lr": "auto", "weight_decay": "auto"}}}, "optimizer.params.lr",
     "\"auto\" is filled by HF Trainer, which Megatron does not run; give --lr yourself"),
    ({"optimizer": ADAM, "gradient_clipping": "auto"}, "gradient_clipping", "give --clip-grad yourself"),
])
def test_inexpressible_keys_are_named_in_a_note(config, key, why):
    values, notes = flags(config)
    assert any(note.startswith(f"ds_config: `{key}` is not carried to Megatron-LM's arguments: ") and why in note
               for note in notes), notes


def test_auto_values_write_no_flag():
    values, notes = flags({"optimizer": {"type": "AdamW", "params": {"lr": "auto", "betas": "auto", "eps": "auto",
                                                                     "weight_decay": "auto"}},
                           "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": "auto", "warmup_max_lr": "auto",
                                                                        "warmup_num_steps": "auto"}}})
    for flag in ("--lr", "--adam-beta1", "--adam-eps", "--weight-decay", "--lr-warmup-iters", "--lr-warmup-init"):
        assert flag not in values
    assert len(notes) == 8  # lr, betas, eps, weight_decay, the three schedule values, warmup_type


def test_megatron_lm_names_what_it_does_not_read():
    _, notes = flags({"optimizer": ADAM, "wall_clock_breakdown": False, "train_batch_size": 8,
                      "zero_optimization": {"stage": 1, "overlap_comm": True}})
    assert notes == ["ds_config: Megatron-LM does not read a ds_config; settings not restated as its arguments: "
                     "`wall_clock_breakdown`, `zero_optimization.overlap_comm`"]
    _, notes = flags({"optimizer": ADAM, "wall_clock_breakdown": False}, "megatron-deepspeed")
    assert notes == []  # DeepSpeed reads the config itself


@pytest.mark.parametrize("config, message", [
    ({"optimizer": {"type": "Adam", "params": {"lr": "fast"}}}, "key `optimizer.params.lr`: value 'fast' is not a number"),
    ({"optimizer": {"type": "Adam", "params": {"betas": [0.9]}}}, "key `optimizer.params.betas`: value [0.9] is not a pair"),
    ({"optimizer": ADAM, "scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 2.5}}},
     "key `scheduler.params.warmup_num_steps`: value 2.5 is not a whole number ≥ 1"),
    ({"optimizer": ADAM, "gradient_clipping": -1}, "key `gradient_clipping`: value -1 is not a number ≥ 0"),
    ({"optimizer": ADAM, "scheduler": "WarmupLR"}, "key `scheduler`: value 'WarmupLR' is not an object"),
])
def test_bad_values_are_one_line(config, message):
    with pytest.raises(GbmwError) as error:
        ds_config_training_arguments(config, "megatron-core", precision="bf16", where="job.json")
    assert str(error.value).startswith("job.json: " + message) and "\n" not in str(error.value)
