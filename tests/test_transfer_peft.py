"""`vitkit transfer --peft`: every task fine-tuned with a PEFT method (VTAB-1k's at the PEFT papers' protocol, the
others at table 4's), each task's trained share of the parameters in the table against a count made here of the
adapted model, the checkpoint left as it was, and VTAB-1k's two averages (of the tasks, of the group means)
against hand computations and the group means the table prints."""

import json
import re
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import vitkit
from test_transfer import grey_npz, tiny_checkpoint, vtab_folder
from vitkit.checkpoints.adapters import AdapterSpec, adapt
from vitkit.cli import main
from vitkit.cli import transfer as transfer_command
from vitkit.errors import ConfigError
from vitkit.transfer import BUDGETS, TASKS, run_transfer
from vitkit.transfer import suite as suite_module
from vitkit.transfer.suite import task_recipe
from vitkit.transfer.table import TRAINED, average_lines, column_title, vtab_averages
from vitkit.transfer.tasks import PEFT_VTAB_STEPS, Found, peft_protocol

RANK = 2
SETTINGS = dict(budget="small", recipe={"schedule.steps": 3, "run.threads": 1, "schedule.batch_size": 16,
                                        "run.eval_batch_size": 64}, peft={"method": "lora", "lora_rank": RANK})
VTAB = {"dtd": "natural", "cifar": "natural", "eurosat": "specialized"}  # VPT's and NOAH's folder names


def vtab_task(root, name):
    """A VTAB-1k task folder whose listed images exist: grey 8x8 images, darker to brighter by class (i % 3)."""
    folder = vtab_folder(root, name)
    (folder / "images").mkdir()
    for i in range(1000):
        Image.fromarray(np.full((8, 8), 40 + 80 * (i % 3), np.uint8)).save(folder / "images" / f"{i}.jpg")


def files(folder):
    return {path.relative_to(folder): path.read_bytes() for path in sorted(folder.rglob("*")) if path.is_file()}


@pytest.fixture(scope="module")
def lora_suite(tmp_path_factory):
    """`--suite vtab1k mnist --peft lora --lora-rank 2` at the small budget, 3 steps a run, on three VTAB-1k tasks
    (two natural, one specialized) and MNIST's stand-in: the report, the suite folder, the data folder, the
    checkpoint and its files before the suite."""
    root = tmp_path_factory.mktemp("data")
    grey_npz(root / "mnist.npz")
    for name in VTAB:
        vtab_task(root, name)
    checkpoint = tiny_checkpoint(tmp_path_factory.mktemp("ckpt"))
    before = files(Path(checkpoint))
    out = tmp_path_factory.mktemp("suite") / "suite"
    report = run_transfer(checkpoint, ["vtab1k", "mnist"], root, out, say=lambda line: None, **SETTINGS)
    return report, out, root, checkpoint, before


def test_each_row_carries_the_trained_share_counted_here(lora_suite):
    """Each task's share is the one counted here of the checkpoint with the task's head and a rank-2 LoRA on
    qkv, fc1 and fc2 (``adapt``), and by hand: 2 x (16 + 48) + 2 x (16 + 32) + 2 x (32 + 16) LoRA weights and the
    16 x classes + classes of the head."""
    report, out, _, checkpoint, _ = lora_suite
    classes = {"mnist": 2, **{f"vtab-{task}": 3 for task in ("dtd", "cifar100", "eurosat")}}
    assert set(report["trained"]) == set(classes)
    for task, count in classes.items():
        model = vitkit.load(checkpoint)
        model.reset_head(count)
        adapt(model, AdapterSpec("lora", lora_rank=RANK))
        trained = sum(p.numel() for p in model.parameters() if p.requires_grad)
        share = trained / sum(p.numel() for p in model.parameters())
        assert trained == RANK * (16 + 48) + RANK * (16 + 32) + RANK * (32 + 16) + 17 * count
        assert report["trained"][task] == pytest.approx(share) and report["tasks"][task]["trained_share"] == share
    table = (out / "transfer.md").read_text().splitlines()
    trained_rows = [line for line in table if line.startswith(f"| {TRAINED} |")]
    mnist = f"{100 * report['trained']['mnist']:.2f}"
    vtab = " | ".join(f"{100 * report['trained'][f'vtab-{task}']:.2f}" for task in ("cifar100", "dtd", "eurosat"))
    assert trained_rows == [f"| {TRAINED} | {mnist} |  |  |  |", f"| {TRAINED} | {vtab} |"]
    assert table[table.index(trained_rows[0]) - 1].startswith("| fine-tuned |")  # under the row it is of
    assert list(report["rows"]) == ["fine-tuned"] and report["peft_method"] == "lora"


def test_the_checkpoint_is_left_as_it_was_and_each_run_wrote_its_adapter(lora_suite):
    _, out, _, checkpoint, before = lora_suite
    assert files(Path(checkpoint)) == before
    for task in ("mnist", "vtab-dtd"):
        assert (out / task / "final" / "adapter" / "adapter_config.json").is_file()


def test_vtab_runs_at_the_peft_papers_protocol_and_the_others_at_table_4s(lora_suite):
    """VTAB-1k's runs: AdamW at lr 1e-3, weight decay 1e-4, no layer decay or clipping, whole images without
    augmentation, warm-up a tenth of the run; MNIST's: the paper's SGD sweep, with the method added. The
    run's own flags (--recipe) still win: 3 steps of 16."""
    _, out, _, _, _ = lora_suite
    recipe = json.loads((out / "vtab-dtd" / "final" / "recipe.json").read_text())
    assert recipe["optim"] == {**recipe["optim"], "optimizer": "adamw", "lr": 1e-3, "weight_decay": 1e-4,
                               "layer_decay": None, "clip_norm": 0.0}
    assert recipe["augment"]["transform"] == "eval" and recipe["model"]["args"] == {"drop_path": 0.1}
    assert (recipe["schedule"]["steps"], recipe["schedule"]["batch_size"], recipe["schedule"]["warmup_steps"]) == (
        3, 16, BUDGETS["small"].steps(peft_protocol(TASKS["vtab-dtd"])) // 10)
    assert recipe["peft"]["method"] == "lora" and recipe["peft"]["lora_rank"] == RANK
    mnist = json.loads((out / "mnist" / "final" / "recipe.json").read_text())
    assert (mnist["optim"]["optimizer"], mnist["augment"]["transform"], mnist["peft"]["method"]) == (
        "sgd", "finetune", "lora")
    assert sorted(path.name for path in (out / "mnist").iterdir() if path.is_dir()) == [
        "final", "lr-0.001", "lr-0.003", "lr-0.01", "lr-0.03"]


def test_the_protocol_at_the_paper_budget():
    """At the paper's budget a VTAB-1k task under PEFT trains 100 epochs of 64 (1,500 steps, 150 warming up) at
    224 px; without a method, and for the other tasks, the protocol is table 4's."""
    dtd = Found(TASKS["vtab-dtd"], "vtab:/data/vtab-1k/dtd", None, "/data/vtab-1k/dtd")
    peft = task_recipe(Found(peft_protocol(dtd.task), dtd.spec, None, dtd.where), "ckpt", BUDGETS["paper"], 1e-3,
                       0.0, "runs/x", {"peft.method": "vpt-deep"})
    assert (peft.optim.optimizer, peft.optim.lr, peft.optim.weight_decay, peft.optim.layer_decay) == (
        "adamw", 1e-3, 1e-4, None)
    assert (peft.schedule.steps, peft.schedule.warmup_steps, peft.schedule.batch_size, peft.model.image_size) == (
        PEFT_VTAB_STEPS, 150, 64, 224) and PEFT_VTAB_STEPS == 1500 and peft.peft.method == "vpt-deep"
    table_4 = task_recipe(dtd, "ckpt", BUDGETS["paper"], 0.01, 0.0, "runs/x", {})
    assert (table_4.optim.optimizer, table_4.schedule.steps, table_4.schedule.batch_size,
            table_4.model.image_size) == ("sgd", 2500, 512, 384)
    pets = Found(TASKS["pets"], "pets:/data", None, "/data/oxford-iiit-pet")
    assert peft_protocol(pets.task) == pets.task
    lora = task_recipe(pets, "ckpt", BUDGETS["paper"], 0.003, 0.1, "runs/x", {"peft": {"method": "lora"}})
    full = task_recipe(pets, "ckpt", BUDGETS["paper"], 0.003, 0.1, "runs/x", {})
    assert lora.replace(peft={"method": "none"}) == full


def test_the_mean_of_group_means_line_is_the_mean_of_the_printed_group_means(lora_suite):
    report, out, _, _, _ = lora_suite
    table = (out / "transfer.md").read_text().splitlines()
    header = [cell.strip() for cell in table[2].strip("|").split("|")]
    fine_tuned = [cell.strip() for cell in next(line for line in table if line.startswith("| fine-tuned")).strip(
        "|").split("|")]
    printed = {title: float(cell) for title, cell in zip(header, fine_tuned) if title.startswith("VTAB ")}
    assert list(printed) == ["VTAB natural (2 of 7)", "VTAB specialized (1 of 4)", "VTAB (3 of 19)"]
    line = next(line for line in table if line.startswith("VTAB-1k fine-tuned: "))
    tasks, groups = map(float, re.match(r"VTAB-1k fine-tuned: ([\d.]+) as the mean of 3 of the 19 tasks \(the ViT "
                                        r"paper's VTAB, the table's column\); ([\d.]+) as the mean of 2 of the 3 "
                                        r"group means \(the PEFT papers' average", line).groups())
    assert tasks == printed["VTAB (3 of 19)"]
    assert groups == pytest.approx((printed["VTAB natural (2 of 7)"] + printed["VTAB specialized (1 of 4)"]) / 2,
                                   abs=0.01)
    assert report["vtab_averages"]["fine-tuned"] == {**report["vtab_averages"]["fine-tuned"], "tasks": 3, "groups": 2}


def test_the_two_vtab_averages_by_hand():
    """Natural (0.9 + 0.8) / 2, specialized 0.6, structured 0.4: the mean of the 4 tasks is 0.675, the mean of
    the 3 group means (the PEFT papers') (0.85 + 0.6 + 0.4) / 3."""
    averages = vtab_averages({"cifar10": 0.99, "vtab-caltech101": 0.9, "vtab-cifar100": 0.8, "vtab-eurosat": 0.6,
                              "vtab-dmlab": 0.4})
    assert averages == {"mean_of_tasks": pytest.approx(0.675), "tasks": 4,
                        "mean_of_groups": pytest.approx((0.85 + 0.6 + 0.4) / 3), "groups": 3}
    assert average_lines({"fine-tuned": averages}) == [
        "VTAB-1k fine-tuned: 67.50 as the mean of 4 of the 19 tasks (the ViT paper's VTAB, the table's column); "
        "61.67 as the mean of the 3 group means (the PEFT papers' average, NOAH's and FacT's)"]
    assert vtab_averages({"cifar10": 0.99}) is None
    assert column_title("vtab", {"vtab": 19}) == "VTAB (19 tasks)" and column_title("vtab-natural", {
        "vtab-natural": 7}) == "VTAB natural"


def test_a_finished_suite_resumes_only_with_the_same_method(lora_suite, monkeypatch):
    report, out, root, checkpoint, _ = lora_suite

    def no_run(recipe, resume=False, device=None):
        raise AssertionError(f"trained {recipe.run.dir} again")

    monkeypatch.setattr(suite_module, "run", no_run)
    again = run_transfer(checkpoint, ["vtab1k", "mnist"], root, out, say=lambda line: None, **SETTINGS)
    assert again["trained"] == report["trained"] and again["rows"] == report["rows"]
    with pytest.raises(ConfigError, match=r"holds a suite run with other settings \(peft\)"):
        run_transfer(checkpoint, ["vtab1k", "mnist"], root, out, say=lambda line: None,
                     **{**SETTINGS, "peft": {"method": "lora", "lora_rank": 4}})


def test_a_method_typo_exits_2_naming_the_methods(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["transfer", "ckpt", "--suite", "mnist", "--data-dir", str(tmp_path), "--peft", "lorra"])
    err = capsys.readouterr().err.strip().splitlines()
    assert exit_.value.code == 2 and err[-1].startswith("vitkit transfer: error: argument --peft: ")
    assert "'lora', 'dora', 'vpt-shallow', 'vpt-deep', 'adaptformer', 'bitfit', 'linear'], got 'lorra'" in err[-1]


@pytest.mark.parametrize("flags, says", [
    (["--peft", "lora", "--no-finetune"], "--peft lora: a method of fine-tuning; drop --no-finetune, or --peft"),
    (["--lora-rank", "4"], "--peft: lora_rank given without a method; expected --peft METHOD as well"),
])
def test_a_method_that_cannot_run_is_one_line(tmp_path, capsys, flags, says):
    grey_npz(tmp_path / "mnist.npz")
    assert main(["transfer", "ckpt", "--suite", "mnist", "--data-dir", str(tmp_path), "--out", str(tmp_path / "out"),
                 *flags]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and says in err[0]
    assert not (tmp_path / "out").exists()


def test_the_method_and_its_settings_reach_the_suite(tmp_path, monkeypatch):
    called = {}
    monkeypatch.setattr(transfer_command, "run_transfer", lambda *args, **kwargs: called.update(args=args))
    assert main(["transfer", "ckpt", "--suite", "vtab1k", "--data-dir", str(tmp_path), "--peft", "lora",
                 "--lora-rank", "4", "--peft-targets", "q,v"]) == 0
    assert called["args"][-1] == {"method": "lora", "lora_rank": 4, "targets": ("q", "v")}
