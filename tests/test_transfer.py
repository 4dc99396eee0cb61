"""The paper's evaluation suite (vitkit.transfer): the protocol's settings against appendix B.1.1 and table 4,
the table's rows and VTAB-1k group means against hand computations, where tasks are found (and refused when
partial), and a suite killed between tasks that resumes where it stopped."""

import dataclasses
import json
import logging

import numpy as np
import pytest
import torch

import vitkit
from vitkit import ViTConfig, create_model
from vitkit.cli import main
from vitkit.errors import ConfigError, DatasetError
from vitkit.transfer import BUDGETS, TASKS, find_task, group_means, run_transfer, table_row
from vitkit.transfer import suite as suite_module
from vitkit.transfer.suite import present_tasks, task_recipe
from vitkit.transfer.table import markdown

SMALL = BUDGETS["small"].note


def test_the_paper_protocol_of_each_task():
    """Appendix B.1.1 and table 4: SGD momentum 0.9, no weight decay, clipping at 1, cosine decay after a
    warm-up, batch 512, 384 px; the steps and learning-rate grid of each task; VTAB-1k at lr 0.01, 2,500 steps,
    trained on its 1,000 examples."""
    expected = {"imagenet": (20_000, (0.03,), 0.0, "train", "val"),
                "cifar10": (10_000, (0.001, 0.003, 0.01, 0.03), 0.02, "train", "test"),
                "cifar100": (10_000, (0.001, 0.003, 0.01, 0.03), 0.02, "train", "test"),
                "pets": (500, (0.001, 0.003, 0.01, 0.03), 0.10, "trainval", "test"),
                "flowers102": (500, (0.001, 0.003, 0.01, 0.03), 0.10, "trainval", "test"),
                "vtab-dtd": (2_500, (0.01,), 0.0, "train800val200", "test")}
    for name, (steps, lrs, held_out, train, test) in expected.items():
        task = TASKS[name]
        assert (task.steps, task.lrs, task.held_out, task.train_split, task.test_split) == (
            steps, lrs, held_out, train, test), name
    found = suite_module.Found(TASKS["pets"], "pets:/data", None, "/data/oxford-iiit-pet")
    recipe = task_recipe(found, "ckpt", BUDGETS["paper"], 0.003, 0.1, "runs/x", {})
    optim, schedule = recipe.optim, recipe.schedule
    assert (optim.optimizer, optim.momentum, optim.weight_decay, optim.clip_norm, schedule.decay) == (
        "sgd", 0.9, 0.0, 1.0, "cosine")
    assert (schedule.batch_size, recipe.model.image_size, schedule.steps, optim.lr, recipe.data.val_fraction) == (
        512, 384, 500, 0.003, 0.1)
    assert schedule.warmup_steps > 0 and recipe.data.train_split == "trainval" and recipe.model.init == "ckpt"
    small = BUDGETS["small"]
    assert [small.steps(TASKS[name]) for name in ("imagenet", "cifar10", "pets", "vtab-dtd")] == [100, 100, 10, 25]


def test_vtab_groups_hold_the_19_tasks():
    groups = {}
    for task in TASKS.values():
        if task.vtab:
            groups.setdefault(task.group, []).append(task.name.removeprefix("vtab-"))
    assert {group: len(names) for group, names in groups.items()} == {"natural": 7, "specialized": 4,
                                                                     "structured": 8}
    assert "clevr_distance" in groups["structured"] and "patch_camelyon" in groups["specialized"]


def test_table_row_and_group_means_by_hand():
    accuracies = {"cifar10": 0.99, "imagenet": 0.8, "vtab-caltech101": 0.9, "vtab-cifar100": 0.8,
                  "vtab-eurosat": 0.6, "vtab-dmlab": 0.4}
    # natural (0.9 + 0.8) / 2; specialized 0.6; structured 0.4; VTAB: the mean of the 4 tasks, not of the groups
    means = group_means(accuracies)
    assert means["vtab-natural"] == (pytest.approx(0.85), 2)
    assert means["vtab-specialized"] == (pytest.approx(0.6), 1)
    assert means["vtab-structured"] == (pytest.approx(0.4), 1)
    assert means["vtab"] == (pytest.approx(0.675), 4)
    row = table_row(accuracies, real=0.85)
    assert list(row) == ["imagenet", "imagenet-real", "cifar10", "vtab-natural", "vtab-specialized",
                         "vtab-structured", "vtab"]
    assert row["imagenet-real"] == 0.85 and row["vtab"] == pytest.approx(0.675)
    lines = markdown({"fine-tuned": row}, {key: count for key, (_, count) in means.items()}, {})
    assert lines[0] == ("| | imagenet | ImageNet ReaL | cifar10 | VTAB natural (2 of 7) | VTAB specialized (1 of 4) | "
                        "VTAB structured (1 of 8) | VTAB (4 of 19) |")
    assert lines[2] == "| fine-tuned | 80.00 | 85.00 | 99.00 | 85.00 | 60.00 | 40.00 | 67.50 |"


def vtab_folder(root, name, train800val200=1000):
    folder = root / "vtab-1k" / name
    folder.mkdir(parents=True)
    for listed, count in (("train800.txt", 800), ("val200.txt", 200), ("train800val200.txt", train800val200),
                          ("test.txt", 50)):
        (folder / listed).write_text("".join(f"images/{i}.jpg {i % 3}\n" for i in range(count)))
    return folder


def test_tasks_are_found_in_their_layouts(tmp_path):
    vtab_folder(tmp_path, "clevr_dist")  # VPT's and NOAH's name of clevr_distance
    vtab_folder(tmp_path, "dtd")
    (tmp_path / "oxford-iiit-pet" / "images").mkdir(parents=True)
    (tmp_path / "oxford-iiit-pet" / "annotations").mkdir()
    for name in ("trainval.txt", "test.txt"):
        (tmp_path / "oxford-iiit-pet" / "annotations" / name).write_text("")
    found = find_task(TASKS["vtab-clevr_distance"], tmp_path)
    assert found.spec == f"vtab:{tmp_path / 'vtab-1k' / 'clevr_dist'}" and found.data_dir is None
    assert find_task(TASKS["pets"], tmp_path).spec == f"pets:{tmp_path}"
    assert find_task(TASKS["cifar10"], tmp_path) is None
    present, absent = present_tasks(["paper"], tmp_path)
    assert [where.task.name for where in present] == ["pets", "vtab-dtd", "vtab-clevr_distance"]
    assert len(absent) == 24 - 3 and "imagenet" in absent and "vtab-svhn" in absent
    assert find_task(TASKS["mnist"], tmp_path) is None


@pytest.mark.parametrize("make, task, message", [
    (lambda root: (root / "cifar-10-batches-py").mkdir() or (root / "cifar-10-batches-py" / "data_batch_1").write_text(""),
     "cifar10", "task cifar10: .*cifar-10-batches-py lacks data_batch_2, data_batch_3, data_batch_4, data_batch_5, "
                "test_batch, batches.meta"),
    (lambda root: (root / "vtab-1k" / "dtd").mkdir(parents=True) or (root / "vtab-1k" / "dtd" / "test.txt").write_text(""),
     "vtab-dtd", "task vtab-dtd: .*dtd lacks train800.txt, val200.txt, train800val200.txt"),
    (lambda root: vtab_folder(root, "eurosat", train800val200=999),
     "vtab-eurosat", "task vtab-eurosat: .*train800val200.txt lists 999 examples; VTAB-1k trains on 1,000"),
])
def test_partial_task_folders_are_refused_naming_the_task(tmp_path, make, task, message):
    make(tmp_path)
    with pytest.raises(DatasetError, match=message) as caught:
        find_task(TASKS[task], tmp_path)
    assert "\n" not in str(caught.value)


def test_a_missing_named_task_is_one_line(tmp_path, capsys):
    assert main(["transfer", "ckpt", "--suite", "pets", "--data-dir", str(tmp_path)]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"task pets: not under {tmp_path} (expected {tmp_path / 'oxford-iiit-pet'}" in err[0]
    assert main(["transfer", "ckpt", "--suite", "vtab1k", "--data-dir", str(tmp_path)]) != 0
    assert "no task under" in capsys.readouterr().err


def grey_npz(path, seed=0, per_class=25):
    """Two classes of 8x8 grey images: dark and bright, with noise."""
    rng = np.random.default_rng(seed)

    def images(count):
        labels = np.arange(count) % 2
        pixels = (labels[:, None, None] * 150 + rng.integers(0, 100, (count, 8, 8))).astype(np.uint8)
        return pixels, labels.astype(np.int64)

    x_train, y_train = images(2 * per_class)
    x_test, y_test = images(20)
    np.savez(path, x_train=x_train, y_train=y_train, x_test=x_test, y_test=y_test)
    return path


def tiny_checkpoint(folder):
    """A fresh model the shape of the digits preset's (8 px grey, patch 2), smaller; saved."""
    model = create_model(ViTConfig(image_size=8, patch_size=2, dim=16, depth=1, num_heads=2, mlp_dim=32, in_chans=1,
                                   pool="gap"), num_classes=10)
    model.save(folder / "model")
    return str(folder / "model")


@pytest.fixture(scope="module")
def resumed_suite(tmp_path_factory):
    """`--suite vtab1k mnist fashion-mnist` at the small budget (3 steps a run) with few-shot rows, killed in fashion-mnist's
    third learning-rate run, then run again: the calls to the training run of each invocation and the output."""
    root = tmp_path_factory.mktemp("data")
    grey_npz(root / "mnist.npz")
    grey_npz(root / "fashion-mnist.npz", seed=1)
    checkpoint = tiny_checkpoint(tmp_path_factory.mktemp("ckpt"))
    out = tmp_path_factory.mktemp("suite") / "suite"
    calls = [[], []]
    real_run = suite_module.run

    def counted(invocation, stop_at=None):
        def run(recipe, resume=False, device=None):
            where = "/".join(recipe.run.dir.split("/")[-2:])
            calls[invocation].append(where)
            if where == stop_at:
                raise KeyboardInterrupt
            return real_run(recipe, resume, device)
        return run

    settings = dict(budget="small", fewshot=True, recipe={"schedule.steps": 3, "run.threads": 1, "schedule.batch_size": 16, "run.eval_batch_size": 64})
    patch = pytest.MonkeyPatch()
    lines, logged = [], []
    handler = logging.Handler()
    handler.emit = lambda record: logged.append(record.getMessage())  # what the training runs log
    logger = logging.getLogger("vitkit")
    level = logger.level
    try:
        patch.setattr(suite_module, "run", counted(0, stop_at="fashion-mnist/lr-0.01"))
        with pytest.raises(KeyboardInterrupt):
            run_transfer(checkpoint, ["vtab1k", "mnist", "fashion-mnist"], root, out, say=lambda line: None, **settings)
        patch.setattr(suite_module, "run", counted(1))
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
        report = run_transfer(checkpoint, ["vtab1k", "mnist", "fashion-mnist"], root, out, say=lines.append, **settings)
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
        patch.undo()
    return report, calls, (lines, logged), out, root


def test_a_killed_suite_resumes_at_the_task_it_stopped(resumed_suite):
    report, (first, second), (lines, _), out, _ = resumed_suite
    assert first == ["mnist/lr-0.001", "mnist/lr-0.003", "mnist/lr-0.01", "mnist/lr-0.03", "mnist/final",
                     "fashion-mnist/lr-0.001", "fashion-mnist/lr-0.003", "fashion-mnist/lr-0.01"]
    assert second == ["fashion-mnist/lr-0.01", "fashion-mnist/lr-0.03", "fashion-mnist/final"]  # mnist finished: its result is read back
    assert any(line.endswith(f"mnist: finished earlier, {100 * report['tasks']['mnist']['accuracy']:.2f}% "
                             f"(from {out / 'mnist' / 'result.json'})") for line in lines)


def test_every_line_says_the_small_budget_and_absent_tasks_are_named(resumed_suite):
    _, _, (lines, logged), _, root = resumed_suite
    assert lines and all(line.startswith(SMALL) for line in lines)
    assert any("fine-tuning" in line for line in logged) and all(line.startswith(SMALL) for line in logged)
    absent = [line for line in lines if "absent" in line]
    assert absent == [SMALL + f"absent under {root}: " + ", ".join(name for name in TASKS if name.startswith("vtab-"))]


def test_the_table_holds_each_task_measured_by_hand(resumed_suite):
    """The fine-tuned row's mnist cell is the final model's top-1 on the npz's test images, computed here from
    the arrays (normalised as the model was trained, argmax of its logits)."""
    report, _, (lines, _), out, root = resumed_suite
    arrays = np.load(root / "mnist.npz")
    model = vitkit.load(out / "mnist" / "final" / "model")
    mean, std = model.config.input_statistics
    images = (torch.from_numpy(arrays["x_test"]).float()[:, None] / 255 - mean[0]) / std[0]
    with torch.no_grad():
        by_hand = float((model(images).argmax(1).numpy() == arrays["y_test"]).mean())
    row = report["rows"]["fine-tuned"]
    assert list(row) == ["mnist", "fashion-mnist"] and row["mnist"] == pytest.approx(by_hand)
    # 25 images a class: 25 shots leave none to choose the regulariser on, so that row is left out
    assert list(report["rows"]) == ["fine-tuned", "1-shot linear", "5-shot linear", "10-shot linear"]
    assert list(report["rows"]["5-shot linear"]) == ["mnist", "fashion-mnist"]
    assert report["tasks"]["mnist"]["lr"] in TASKS["mnist"].lrs and len(report["tasks"]["mnist"]["sweep"]) == 4
    written = json.loads((out / "transfer.json").read_text())
    assert written["rows"] == report["rows"] and written["absent"][0] == "vtab-caltech101"
    table = (out / "transfer.md").read_text().splitlines()
    assert table[0].startswith(SMALL) and table[2] == "| | mnist | fashion-mnist |"
    assert table[4] == f"| fine-tuned | {100 * by_hand:.2f} | {100 * row['fashion-mnist']:.2f} |"
    assert lines[-1] == SMALL + f"table in {out / 'transfer.md'} and {out / 'transfer.json'}"


def test_a_suite_folder_of_other_settings_is_refused(resumed_suite):
    _, _, _, out, root = resumed_suite
    with pytest.raises(ConfigError, match="holds a suite run with other settings .budget"):
        run_transfer("ckpt", ["mnist"], root, out, budget="paper", fewshot=True,
                     recipe={"schedule.steps": 3, "run.threads": 1, "schedule.batch_size": 16, "run.eval_batch_size": 64})


def test_evaluating_as_is_needs_the_tasks_classes(tmp_path):
    grey_npz(tmp_path / "mnist.npz")
    checkpoint = tiny_checkpoint(tmp_path)
    with pytest.raises(ConfigError, match="task mnist: .* predicts 10 classes but npz:.*mnist.npz has 2; expected "
                                          "a head of 2 classes to evaluate without fine-tuning"):
        run_transfer(checkpoint, ["mnist"], tmp_path, tmp_path / "out", finetune=False, say=lambda line: None)


def test_the_learning_rate_is_never_picked_on_the_test_split(monkeypatch, tmp_path):
    """ImageNet is tested on its val split: a dataset whose sweep runs measured that split (its own val) instead
    of a part held out of training is refused."""
    swept = dataclasses.replace(TASKS["imagenet"], lrs=(0.003, 0.01, 0.03, 0.06), held_out=0.01)  # a sweep beside
    found = suite_module.Found(swept, "imagenet:/data/imagenet", None, "/data/imagenet")  # its own val split
    monkeypatch.setattr(suite_module, "sub_run", lambda recipe, device: {"val/accuracy": 0.5, "test/split": "val"})
    with pytest.raises(DatasetError, match="task imagenet: imagenet:/data/imagenet measures its own val split, "
                                           "which it is tested on"):
        suite_module.finetune_task(found, "ckpt", BUDGETS["paper"], tmp_path, None, {}, lambda line: None)
    monkeypatch.setattr(suite_module, "sub_run", lambda recipe, device: {
        "val/accuracy": float(recipe.optim.lr == 0.01), "test/split": "val" if recipe.data.val_fraction == 0 else "test",
        "test/accuracy": 0.7, "test/images": 50, "steps": recipe.schedule.steps})
    result = suite_module.finetune_task(found, "ckpt", BUDGETS["paper"], tmp_path, None, {}, lambda line: None)
    assert result["lr"] == 0.01 and result["steps"] == 20_000 and result["accuracy"] == 0.7
