"""The training loop: exact resume, divergence handling, accumulation, EMA, checkpoints, precision."""

import importlib
import json

import pytest
import torch

from vitkit import ViTConfig, VisionTransformer
from vitkit.train import EMA, Recipe, TrainingDiverged
from vitkit.train.checkpointing import list_checkpoints
from vitkit.train.run import prepare

TINY = dict(patch_size=2, dim=16, depth=2, num_heads=2, mlp_dim=32, in_chans=1)


def tiny_recipe(run_dir, **changes) -> Recipe:
    """Digits with every source of randomness on: dropout, drop-path, RandAugment, Mixup, EMA; ``changes`` by
    section (``optim={"lr": 0.1}``)."""
    base = Recipe(model=dict(image_size=8, args=dict(TINY, dropout=0.1, drop_path=0.1)), data=dict(dataset="digits"),
                  augment=dict(transform="pretrain", crop_scale=(0.5, 1.0), aug_level="light2", hflip=False),
                  schedule=dict(steps=8, batch_size=32, accum_steps=2, warmup_steps=2),
                  optim=dict(lr=3e-3, ema_decay=0.9),
                  run=dict(checkpoint_every=3, eval_every=4, keep_last=5, log_every=1, threads=1, dir=str(run_dir)))
    return base.replace(**changes)


def crash_at(trainer, step):
    objective = trainer.objective

    def failing(model, batch):
        if trainer.step == step:
            raise KeyboardInterrupt("simulated crash")
        return objective(model, batch)
    trainer.objective = failing


def state(trainer):
    return {**{f"model.{k}": v for k, v in trainer.model.state_dict().items()},
            **{f"ema.{k}": v for k, v in trainer.ema.state_dict().items()}}


def test_resume_after_interruption_is_bit_exact(tmp_path):
    straight = prepare(tiny_recipe(tmp_path / "straight")).trainer
    straight.fit()

    interrupted = prepare(tiny_recipe(tmp_path / "resumed")).trainer
    crash_at(interrupted, 5)
    with pytest.raises(KeyboardInterrupt):
        interrupted.fit()
    assert [p.name for p in list_checkpoints(tmp_path / "resumed")] == ["step-00000003"]

    resumed = prepare(tiny_recipe(tmp_path / "resumed", run={"seed": 0})).trainer
    resumed.fit(resume=True)
    assert resumed.step == straight.step == 8
    ours, theirs = state(resumed), state(straight)
    assert ours.keys() == theirs.keys()
    for key in ours:
        assert torch.equal(ours[key], theirs[key]), key
    for a, b in zip(resumed.optimizer.state.values(), straight.optimizer.state.values()):
        assert all(torch.equal(a[k], b[k]) for k in a)

    def records(run):
        lines = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
        return [{k: v for k, v in r.items() if k != "train/images_per_s"} for r in lines]
    assert records(tmp_path / "resumed") == records(tmp_path / "straight")


def test_nan_loss_stops_and_keeps_last_good_checkpoint(tmp_path):
    trainer = prepare(tiny_recipe(tmp_path, run={"checkpoint_every": 2}, optim={"ema_decay": 0.0})).trainer
    objective = trainer.objective

    def poisoned(model, batch):
        loss, metrics = objective(model, batch)
        return (loss * float("nan") if trainer.step == 5 else loss), metrics
    trainer.objective = poisoned
    with pytest.raises(TrainingDiverged, match="step 5: loss nan.*last good checkpoint"):
        trainer.fit()
    kept = list_checkpoints(tmp_path)
    assert kept[-1].name == "step-00000004"
    from safetensors.torch import load_file
    saved = load_file(kept[-1] / "model.safetensors")
    assert all(torch.isfinite(t).all() for t in saved.values())
    # the diverged step changed nothing: the model still holds the weights of step 5's start
    assert all(torch.isfinite(p).all() for p in trainer.model.parameters())


def test_gradient_accumulation_matches_the_large_batch(tmp_path):
    # SGD is linear in the gradient, so float-rounding differences stay as small as they start
    plain = dict(model={"args": TINY}, augment={"aug_level": "none", "transform": "eval"},
                 optim={"ema_decay": 0.0, "optimizer": "sgd", "lr": 0.5}, run={"checkpoint_every": 0, "eval_every": 0},
                 data={"val_fraction": 0.0})
    one = prepare(tiny_recipe(tmp_path / "a", schedule={"steps": 3, "accum_steps": 1}, **plain)).trainer
    four = prepare(tiny_recipe(tmp_path / "b", schedule={"steps": 3, "accum_steps": 4}, **plain)).trainer
    one.fit()
    four.fit()
    for a, b in zip(one.model.parameters(), four.model.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_keep_last_checkpoints_and_best(tmp_path):
    trainer = prepare(tiny_recipe(tmp_path, run={"checkpoint_every": 2, "keep_last": 2})).trainer
    trainer.fit()
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step-00000006", "step-00000008"]
    assert (tmp_path / "best" / "model.safetensors").is_file()
    evaluations = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()
                   if "val/accuracy" in line]
    assert [e["step"] for e in evaluations] == [4, 8]
    assert trainer.best == max(e["val/accuracy"] for e in evaluations)


def test_ema_is_the_polyak_average():
    model = torch.nn.Linear(2, 1)
    ema = EMA(model, decay=0.5)
    start = model.weight.detach().clone()
    with torch.no_grad():
        model.weight.fill_(1.0)
    ema.update(model)
    with torch.no_grad():
        model.weight.fill_(3.0)
    ema.update(model)
    torch.testing.assert_close(ema.state_dict()["weight"], 0.25 * start + 0.25 * 1.0 + 0.5 * 3.0)
    with ema.swapped_into(model) as swapped:
        torch.testing.assert_close(swapped.weight, ema.state_dict()["weight"])
    assert torch.all(model.weight == 3.0)


def test_activation_checkpointing_gives_the_same_gradients():
    config = ViTConfig(image_size=8, patch_size=2, dim=16, depth=2, num_heads=2, mlp_dim=32, num_classes=3)
    images = torch.randn(4, 3, 8, 8)
    grads = []
    for recompute in (False, True):
        torch.manual_seed(0)
        model = VisionTransformer(config)
        model.grad_checkpointing = recompute
        model(images).square().sum().backward()
        grads.append([p.grad for p in model.parameters()])
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b)


def test_bf16_autocast_runs_and_stays_close_to_fp32(tmp_path):
    norms = {}  # the zero-initialised head makes the first loss ln(10) either way; its gradient differs
    for precision in ("fp32", "bf16"):
        trainer = prepare(tiny_recipe(tmp_path / precision, run={"precision": precision, "checkpoint_every": 0,
                                                                  "eval_every": 0}, schedule={"steps": 1},
                                      model={"args": TINY}, augment={"aug_level": "none"})).trainer
        norms[precision] = trainer._train_step(iter(trainer.batches(0)))["train/grad_norm"]
    assert norms["fp32"] != norms["bf16"]
    assert norms["bf16"] == pytest.approx(norms["fp32"], rel=0.05)


def test_metrics_go_to_json_lines_and_tensorboard(tmp_path):
    accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
    trainer = prepare(tiny_recipe(tmp_path, schedule={"steps": 3},
                                  run={"checkpoint_every": 0, "eval_every": 0, "log_every": 1})).trainer
    trainer.fit()
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    losses = [r["train/loss"] for r in records if "train/loss" in r]
    assert [r["step"] for r in records] == [1, 2, 3, 3] and len(losses) == 3
    events = accumulator.EventAccumulator(str(tmp_path))
    events.Reload()
    logged = events.Scalars("train/loss")
    assert [e.step for e in logged] == [1, 2, 3]
    assert [e.value for e in logged] == pytest.approx(losses)
    assert events.Scalars("val/accuracy")[0].value == pytest.approx(records[-1]["val/accuracy"])


def test_a_run_finished_or_failed_leaves_no_tensorboard_thread(tmp_path):
    """TensorBoard's writer thread ends with the run (a process that trains many runs, as `vitkit transfer` does,
    would otherwise gather one per run), whether the run finishes or fails."""
    pytest.importorskip("tensorboard")
    import threading

    from vitkit.errors import ConfigError
    from vitkit.train.run import run

    def writers() -> int:
        return sum(type(thread).__name__ == "_AsyncWriterThread" for thread in threading.enumerate())

    before = writers()
    recipe = tiny_recipe(tmp_path, schedule={"steps": 2}, run={"checkpoint_every": 1, "eval_every": 0})
    assert run(recipe)["steps"] == 2 and (tmp_path / "metrics.jsonl").is_file()
    assert writers() == before
    with pytest.raises(ConfigError, match="already holds a run"):  # found once the trainer is built
        run(recipe)
    assert writers() == before


def test_a_crash_while_saving_leaves_the_previous_checkpoint(tmp_path, monkeypatch):
    trainer = prepare(tiny_recipe(tmp_path, run={"checkpoint_every": 2, "eval_every": 0},
                                  optim={"ema_decay": 0.0})).trainer
    real_save, calls = torch.save, []

    def disk_full_on_second_save(obj, path):
        calls.append(path)
        if len(calls) == 2:
            raise OSError("No space left on device")
        return real_save(obj, path)
    monkeypatch.setattr("vitkit.train.checkpointing.torch.save", disk_full_on_second_save)
    with pytest.raises(OSError, match="No space left"):
        trainer.fit()
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step-00000002"]
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["step-00000002"]  # no debris
    resumed = prepare(tiny_recipe(tmp_path, run={"checkpoint_every": 2, "eval_every": 0},
                                  optim={"ema_decay": 0.0})).trainer
    assert resumed.resume() and resumed.step == 2


def test_gradients_are_clipped_at_the_global_norm(tmp_path):
    """With plain SGD (lr 1, first step) the update is the clipped gradient: its global norm is the clip."""
    trainer = prepare(tiny_recipe(tmp_path, optim=dict(optimizer="sgd", lr=1.0, weight_decay=0.0, clip_norm=0.01,
                                                       ema_decay=0.0),
                                  schedule=dict(warmup_steps=0, decay="constant", steps=1), model={"args": TINY},
                                  augment={"aug_level": "none"})).trainer
    before = [p.detach().clone() for p in trainer.model.parameters()]
    metrics = trainer._train_step(iter(trainer.batches(0)))
    change = torch.cat([(p.detach() - b).flatten() for p, b in zip(trainer.model.parameters(), before)])
    assert metrics["train/grad_norm"] > 0.01
    assert change.norm().item() == pytest.approx(0.01, rel=1e-4)


def test_label_smoothed_cross_entropy_closed_form():
    from vitkit.train import Classification

    logits = torch.tensor([[2.0, 0.0, -1.0], [0.5, 0.5, 3.0]])
    labels = torch.tensor([0, 1])
    model = lambda images: logits  # noqa: E731  (a 'model' with known outputs)
    loss, metrics = Classification(3, label_smoothing=0.3)(model, (torch.zeros(2), labels))
    log_p = logits.log_softmax(1)
    expected = (0.7 * -log_p[[0, 1], labels] + 0.3 * -log_p.mean(1)).mean()
    torch.testing.assert_close(loss, expected)
    assert metrics["accuracy"].item() == 0.5


def test_generators_restore_per_rank_and_from_one_rank_files(tmp_path):
    trainer = prepare(tiny_recipe(tmp_path)).trainer
    torch.manual_seed(7)
    saved = torch.get_rng_state()
    expected = torch.rand(3)
    torch.manual_seed(8)
    trainer.restore_generators({"rng_cpu": saved})  # one tensor: a file written before per-rank streams
    assert torch.equal(torch.rand(3), expected)
    with pytest.warns(UserWarning, match="saved by 2 rank"):
        trainer.restore_generators({"rng_cpu": [saved, torch.get_rng_state()]})
    assert torch.equal(torch.rand(3), expected), "rank 0 takes rank 0's generator"


@pytest.mark.parametrize("minutes, expected", [(1e-9, list(range(1, 9))), (0.0, [8])])
def test_checkpoints_by_wall_time(tmp_path, minutes, expected):
    """``checkpoint_minutes`` alone (no step interval): a checkpoint whenever that much time has passed
    (here: after every step), and with both off only the final one."""
    trainer = prepare(tiny_recipe(tmp_path, run=dict(checkpoint_every=0, checkpoint_minutes=minutes, keep_last=0,
                                                     eval_every=0))).trainer
    trainer.fit()
    assert [int(p.name.split("-")[1]) for p in list_checkpoints(tmp_path)] == expected


def test_resume_advice_is_a_command_to_paste_and_the_checkpoint_it_continues_from(tmp_path):
    """The one wording after a signal and after a lost rank; a folder with a space in its name is quoted."""
    run_dir = tmp_path / "a run"
    trainer = prepare(tiny_recipe(run_dir, steps=2, checkpoint_every=1, eval_every=0)).trainer
    command = f"vitkit train --run-dir '{run_dir}' --resume"
    assert trainer.where_to_resume() == f"{run_dir} holds no checkpoint yet: {command} starts the run over"
    trainer.fit()
    assert trainer.where_to_resume() == f"{command} continues the run from {run_dir}/checkpoints/step-00000002"


@pytest.mark.parametrize("name, home", [("Trainer", "vitkit.train.trainer"), ("LoopConfig", "vitkit.train.trainer"),
                                        ("EMA", "vitkit.train.ema"), ("MetricsLog", "vitkit.train.metrics_log"),
                                        ("StopRequest", "vitkit.train.signals"), ("autocast_dtype", "vitkit.runtime"),
                                        ("TRAINING_PRECISIONS", "vitkit.runtime")])
def test_the_names_of_the_old_loop_module_are_found_there_with_a_warning(name, home):
    module = importlib.import_module(home)
    with pytest.warns(DeprecationWarning, match=f"vitkit.train.loop.{name} is deprecated; import it from {home}$"):
        found = getattr(importlib.import_module("vitkit.train.loop"), name)
    assert found is getattr(module, name)
