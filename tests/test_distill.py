"""DeiT's distillation: the loss equals timm's TokenDistillationTask's, a distilled student differs from the same
run without a teacher and converts to timm with timm's logits, teachers are checked, cached and kept on resume."""

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

import vitkit
from vitkit.checkpoints.timm import write_timm
from vitkit.cli import main
from vitkit.train.objectives import Distillation
from vitkit.train.teacher import load_teacher

timm = pytest.importorskip("timm", reason="could not import timm")

CLASSES = ["a", "b", "c", "d"]
DIGITS = ["--steps", "6", "--batch-size", "32", "--threads", "1", "--warmup-steps", "1"]


@pytest.mark.parametrize("kind", ["soft", "hard"])
def test_the_loss_is_timms_token_distillation_tasks(tmp_path, kind):
    from timm.task import TokenDistillationTask
    student = vitkit.create_model("ViT-Ti/16", num_classes=4, image_size=32, depth=2, dist_token=True)
    for head in (student.head, student.head_dist):
        torch.nn.init.normal_(head.weight)
    write_timm(student, tmp_path / "student.safetensors")
    theirs = timm.create_model("deit_tiny_distilled_patch16_224", num_classes=4, img_size=32, depth=2,
                               pretrained_cfg_overlay=dict(mean=(0.5,) * 3, std=(0.5,) * 3))
    theirs.load_state_dict(load_file(tmp_path / "student.safetensors"))
    cnn = timm.create_model("resnet18", num_classes=4)
    save_file(cnn.state_dict(), tmp_path / "teacher.safetensors")
    task = TokenDistillationTask(theirs, cnn, criterion=torch.nn.CrossEntropyLoss(), distill_type=kind,
                                 temperature=3.0, task_loss_weight=0.6, verbose=False).train()
    images, labels = torch.randn(4, 3, 32, 32), torch.tensor([0, 1, 2, 3])
    teacher = load_teacher(f"timm:resnet18={tmp_path / 'teacher.safetensors'}", CLASSES, student.config)
    loss, metrics = Distillation(teacher, kind, 3.0, 0.4, 4)(student.train(), (images, labels))
    torch.testing.assert_close(loss, task(images, labels)["loss"], rtol=1e-5, atol=1e-6)
    assert 0 <= metrics["teacher_agreement"] <= 1


@pytest.fixture
def digits_teacher(tmp_path):
    assert main(["train", "--steps", "40", "--batch-size", "64", "--threads", "1",
                 "--run-dir", str(tmp_path / "teacher")]) == 0
    return tmp_path / "teacher" / "model"


def test_a_distilled_student_differs_from_one_without_a_teacher_and_converts_to_timm(tmp_path, digits_teacher):
    common = ["train", *DIGITS, "--set", "pool=token"]
    assert main([*common, "--run-dir", str(tmp_path / "alone")]) == 0
    assert main([*common, "--objective", "distill", "--distill-teacher", str(digits_teacher),
                 "--run-dir", str(tmp_path / "taught")]) == 0
    taught, alone = vitkit.load(tmp_path / "taught" / "model"), vitkit.load(tmp_path / "alone" / "model")
    assert taught.config.dist_token and not alone.config.dist_token
    images = torch.randn(5, 1, 8, 8)
    assert not torch.allclose(taught.head(taught.forward_features(images)[:, 0]),
                              alone.head(alone.forward_features(images)[:, 0]))
    assert json.loads((tmp_path / "taught" / "teacher.json").read_text())["teacher"] == str(digits_teacher)
    assert main(["convert", str(tmp_path / "taught" / "model"), str(tmp_path / "timm.safetensors"),
                 "--to", "timm"]) == 0
    config = taught.config
    from timm.models.deit import VisionTransformerDistilled
    theirs = VisionTransformerDistilled(img_size=8, patch_size=2, in_chans=1, num_classes=10, embed_dim=config.dim,
                                        depth=config.depth, num_heads=config.num_heads,
                                        mlp_ratio=config.mlp_dim / config.dim).eval()
    theirs.load_state_dict(load_file(tmp_path / "timm.safetensors"))
    torch.testing.assert_close(theirs(images), taught(images), rtol=1e-5, atol=1e-5)


def test_a_teacher_is_asked_once_per_image_when_the_images_repeat(tmp_path, digits_teacher):
    config = vitkit.load(digits_teacher).config
    teacher = load_teacher(str(digits_teacher), list(config.provenance.classes), config, cached=True)
    calls = []
    teacher.model.register_forward_hook(lambda module, args, out: calls.append(len(args[0])))
    images = torch.randn(6, 1, 8, 8)
    first = teacher(images)
    again = teacher(torch.cat([images[3:], images[:3]]))
    torch.testing.assert_close(again, torch.cat([first[3:], first[:3]]))
    assert calls == [6]


def test_resuming_with_another_teacher_is_refused(tmp_path, digits_teacher, capsys):
    other = tmp_path / "other"
    model = vitkit.load(digits_teacher)
    torch.nn.init.normal_(model.head.weight)
    model.save(other)
    flags = ["train", *DIGITS, "--objective", "distill", "--checkpoint-every", "3", "--run-dir", str(tmp_path / "run")]
    assert main([*flags, "--distill-teacher", str(digits_teacher)]) == 0
    assert main([*flags, "--distill-teacher", str(other), "--resume"]) == 2
    assert "its weights are not those the run" in capsys.readouterr().err


def test_a_checkpoint_without_a_token_distils_through_its_head(tmp_path, digits_teacher, capsys):
    assert main(["finetune", str(digits_teacher), "--dataset", "digits", *DIGITS, "--objective", "distill",
                 "--distill-teacher", str(digits_teacher), "--distill-kind", "soft",
                 "--run-dir", str(tmp_path / "run")]) == 0
    assert not vitkit.load(tmp_path / "run" / "model").config.dist_token


@pytest.mark.parametrize("case", ["classes", "patch", "not-a-classifier", "kind-alone"])
def test_bad_teachers_are_one_line(tmp_path, digits_teacher, capsys, case):
    teacher = tmp_path / "teacher2"
    if case == "classes":
        vitkit.load(digits_teacher, num_classes=3).save(teacher)
    elif case == "patch":
        vitkit.create_model("ViT-Ti/16", num_classes=10, image_size=48, in_chans=1, depth=1).save(teacher)
    elif case == "not-a-classifier":
        vitkit.load(digits_teacher, num_classes=0).save(teacher)
    flags = ["--objective", "distill", "--distill-teacher", str(teacher)] if case != "kind-alone" else \
        ["--distill-kind", "soft"]
    assert main(["train", *DIGITS, *flags, "--run-dir", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    expected = {"classes": "classifies 3 classes", "patch": "--distill-teacher-size",
                "not-a-classifier": "without a classifier head", "kind-alone": "null unless objective.kind='distill'"}
    last = err.strip().splitlines()[-1]
    assert last.startswith("vitkit train: error: ") and expected[case] in last and "Traceback" not in err
