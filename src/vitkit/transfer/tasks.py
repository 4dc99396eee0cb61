"""The tasks of the paper's evaluation suite (Table 2 and VTAB-1k), their fine-tuning protocol (appendix B.1.1,
table 4), and where each task's data is found under the folder a user names.

A task is found under ``DIR`` (``vitkit transfer --data-dir DIR``) in the first of its layouts that is there:

==================  ======================================================================================
task                folder under DIR (dataset spec it is read as)
==================  ======================================================================================
imagenet            ``imagenet/`` with ``train/`` and ``val/`` (``imagenet:DIR/imagenet``)
cifar10             ``cifar-10-batches-py/`` (torchvision's ``CIFAR10(DIR)``), or
                    ``cifar10-subset/cifar10_subset.npz`` (an npz file of x_/y_ train and test arrays)
cifar100            ``cifar-100-python/`` (torchvision's ``CIFAR100(DIR)``)
pets                ``oxford-iiit-pet/`` (torchvision's ``OxfordIIITPet(DIR)``: ``pets:DIR``)
flowers102          ``flowers-102/`` (torchvision's ``Flowers102(DIR)``: ``flowers102:DIR``)
mnist               ``MNIST/raw/`` (torchvision's ``MNIST(DIR)``; a stand-in, not in the paper's table)
fashion-mnist       ``FashionMNIST/raw/`` (torchvision's ``FashionMNIST(DIR)``; a stand-in)
digits              built in (a stand-in)
VTAB-1k tasks       ``vtab-1k/<folder>/`` with ``train800.txt``, ``val200.txt``, ``train800val200.txt`` and
                    ``test.txt`` (the VPT/NOAH layout; ``vtab:DIR/vtab-1k/<folder>``); the folder is named as
                    the task (``clevr_distance``) or as VPT and NOAH name it (``clevr_dist``)
==================  ======================================================================================

Every task but the VTAB-1k ones is also found as ``DIR/<task>/`` holding ``train/`` and ``test/`` class
folders (``imagefolder:``) or as ``DIR/<task>.npz``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from ..errors import ConfigError, DatasetError
from ..paths import read_text

PAPER_LRS = (0.001, 0.003, 0.01, 0.03)  # table 4's grid
# ImageNet: one learning rate, the middle of table 4's grid (0.003, 0.01, 0.03, 0.06), without the sweep: its own
# val split is the one it is tested on, and a run holds no validation part out of a train split beside its own val.
IMAGENET_LRS = (0.03,)
VTAB_LR, VTAB_STEPS, VTAB_TRAIN = 0.01, 2500, 1000  # one setting for every VTAB-1k task; 800 train + 200 val
VTAB_LISTS = ("train800.txt", "val200.txt", "train800val200.txt", "test.txt")
# VTAB-1k under a PEFT method: the protocol the VTAB-1k PEFT papers share rather than table 4's. NOAH (Zhang et al.
# 2022, "Neural Prompt Search", github.com/ZhangYuanhan-AI/NOAH: configs/{LoRA,VPT,Adapter}/VTAB,
# supernet_train_prompt.py) ran VPT, LoRA and adapters alike: AdamW, weight decay 1e-4, batch 64, 100 epochs of
# train800val200 (whole batches) with 10 of warm-up and cosine decay to 1e-5, images resized to 224 px without
# augmentation, stochastic depth 0.1, no clipping, no layer decay, one setting for every task.
# FacT (Jie & Deng 2023, github.com/JieShibo/PETL-ViT FacT/fact_tt.py) runs it at lr 1e-3, as vitkit does;
# NOAH's scripts run LoRA at 5e-3 and VPT at 1e-3 and 5e-3. VPT's own paper (Jia et al. 2022, github.com/KMnP/vpt
# tune_vtab.py) picked SGD's lr (0.05 to 50) and weight decay per task on val200; NOAH's shared AdamW protocol is
# used for every method here, so that methods are compared alike. The other tasks have no shared PEFT protocol:
# they keep table 4's, the method added.
PEFT_LR, PEFT_WEIGHT_DECAY, PEFT_BATCH, PEFT_SIZE, PEFT_DROP_PATH, PEFT_END_LR = 1e-3, 1e-4, 64, 224, 0.1, 1e-5
PEFT_EPOCHS, PEFT_WARMUP_EPOCHS = 100, 10
PEFT_VTAB_STEPS = PEFT_EPOCHS * (VTAB_TRAIN // PEFT_BATCH)  # 1,500: whole batches of the 1,000 training images
PEFT_PROTOCOL = (f"VTAB-1k tasks at the PEFT papers' protocol (NOAH, FacT: AdamW lr {PEFT_LR:g}, weight decay "
                 f"{PEFT_WEIGHT_DECAY:g}, batch {PEFT_BATCH}, {PEFT_EPOCHS} epochs, {PEFT_SIZE} px, no augmentation, "
                 f"no layer decay), the other tasks at table 4's with the method added")
VTAB_GROUPS = {
    "natural": ("caltech101", "cifar100", "dtd", "oxford_flowers102", "oxford_iiit_pet", "svhn", "sun397"),
    "specialized": ("patch_camelyon", "eurosat", "resisc45", "diabetic_retinopathy"),
    "structured": ("clevr_count", "clevr_distance", "dmlab", "kitti_distance", "dsprites_location",
                   "dsprites_orientation", "smallnorb_azimuth", "smallnorb_elevation"),
}
"""VTAB-1k's 19 tasks in its three groups, named as the VTAB paper names them."""
# The folder names of the VPT and NOAH code bases' vtab-1k/, where they differ from the task's name.
VTAB_FOLDERS = {"cifar100": "cifar", "clevr_distance": "clevr_dist", "kitti_distance": "kitti",
                "dsprites_location": "dsprites_loc", "dsprites_orientation": "dsprites_ori",
                "smallnorb_azimuth": "smallnorb_azi", "smallnorb_elevation": "smallnorb_ele"}
VTAB_PREFIX = "vtab-"  # a VTAB-1k task's key: vtab-cifar100 is not the paper's CIFAR-100 task


@dataclass(frozen=True)
class Layout:
    """One way a task's data lies under DIR: ``path`` (relative), the ``required`` entries in it (a folder that
    lacks one is partial), what it is (``described``) and the dataset spec it is read as: ``spec`` with
    ``{path}`` (the found path) or ``{root}`` (DIR) filled in; ``data_dir`` whether DIR is the spec's data folder
    (torchvision's root)."""

    path: str
    required: tuple[str, ...]
    described: str
    spec: str
    data_dir: bool = False


@dataclass(frozen=True)
class Task:
    """A task of the suite and its protocol: the optimiser ``steps``, the learning-rate grid (one value: no
    sweep), the fraction of the training split ``held_out`` to pick the learning rate on, the split trained on
    in the final run and the split tested on, and the layouts it is found in."""

    name: str
    group: str  # "paper", "stand-in", or a VTAB-1k group
    steps: int
    lrs: tuple[float, ...]
    held_out: float
    train_split: str
    test_split: str
    layouts: tuple[Layout, ...]

    @property
    def vtab(self) -> bool:
        return self.group in VTAB_GROUPS


def _generic(name: str) -> tuple[Layout, ...]:
    """The layouts every task but VTAB-1k's is also found in: class folders or an npz file named as it."""
    return (Layout(name, ("train", "test"), "train/ and test/ class folders", "imagefolder:{path}"),
            Layout(f"{name}.npz", (), "an npz file of x_/y_ train and test arrays", "npz:{path}"))


def _torchvision(name: str, folder: str, files: tuple[str, ...], spec: str | None = None) -> Layout:
    return Layout(folder, files, f"torchvision's {name} layout", spec or name.lower(), data_dir=spec is None)


CIFAR10_FILES = (*(f"data_batch_{i}" for i in range(1, 6)), "test_batch", "batches.meta")
MNIST_FILES = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte",
               "t10k-labels-idx1-ubyte")


def _paper_tasks() -> list[Task]:
    cifar = dict(steps=10_000, lrs=PAPER_LRS, held_out=0.02, train_split="train", test_split="test")
    small = dict(steps=500, lrs=PAPER_LRS, held_out=0.10, train_split="trainval", test_split="test")
    return [
        Task("imagenet", "paper", 20_000, IMAGENET_LRS, 0.0, "train", "val",
             (Layout("imagenet", ("train", "val"), "train/ and val/ class folders", "imagenet:{path}"),)),
        Task("cifar10", "paper", **cifar, layouts=(
            _torchvision("CIFAR10", "cifar-10-batches-py", CIFAR10_FILES),
            Layout("cifar10-subset/cifar10_subset.npz", (), "an npz file of CIFAR-10 images", "npz:{path}"),
            *_generic("cifar10"))),
        Task("cifar100", "paper", **cifar, layouts=(
            _torchvision("CIFAR100", "cifar-100-python", ("train", "test", "meta")), *_generic("cifar100"))),
        Task("pets", "paper", **small, layouts=(
            _torchvision("OxfordIIITPet", "oxford-iiit-pet", ("images", "annotations/trainval.txt",
                                                              "annotations/test.txt"), "pets:{root}"),
            )),
        Task("flowers102", "paper", **small, layouts=(
            _torchvision("Flowers102", "flowers-102", ("jpg", "imagelabels.mat", "setid.mat"), "flowers102:{root}"),
            )),
    ]


def _stand_ins() -> list[Task]:
    """Datasets at hand that stand in for the paper's tasks, run with CIFAR's protocol."""
    cifar = dict(steps=10_000, lrs=PAPER_LRS, held_out=0.02, train_split="train", test_split="test")
    return [
        Task("mnist", "stand-in", **cifar, layouts=(
            _torchvision("MNIST", "MNIST/raw", MNIST_FILES), *_generic("mnist"))),
        Task("fashion-mnist", "stand-in", **cifar, layouts=(
            Layout("FashionMNIST/raw", MNIST_FILES, "torchvision's FashionMNIST layout", "fashion-mnist",
                   data_dir=True), *_generic("fashion-mnist"))),
        Task("digits", "stand-in", **cifar, layouts=(Layout("", (), "built in", "digits"),)),
    ]


def _vtab_tasks() -> list[Task]:
    return [Task(VTAB_PREFIX + name, group, VTAB_STEPS, (VTAB_LR,), 0.0, "train800val200", "test",
                 tuple(Layout(f"vtab-1k/{folder}", VTAB_LISTS, "the VTAB-1k file-list layout", "vtab:{path}")
                       for folder in dict.fromkeys((name, VTAB_FOLDERS.get(name, name)))))
            for group, names in VTAB_GROUPS.items() for name in names]


TASKS: dict[str, Task] = {task.name: task for task in (*_paper_tasks(), *_vtab_tasks(), *_stand_ins())}
"""Every task, in the table's order: the paper's, VTAB-1k's 19 (``vtab-<name>``), then the stand-ins."""
SUITES: dict[str, tuple[str, ...]] = {
    "vtab1k": tuple(name for name, task in TASKS.items() if task.vtab),
    "paper": tuple(name for name, task in TASKS.items() if task.group == "paper" or task.vtab),
}
"""The named suites: ``paper`` (Table 2: ImageNet, CIFAR-10/100, Pets, Flowers-102 and VTAB-1k), ``vtab1k``."""


def peft_protocol(task: Task) -> Task:
    """``task`` as a PEFT method trains it: a VTAB-1k task at the PEFT papers' steps and learning rate
    (``PEFT_VTAB_STEPS``, ``PEFT_LR``), another as it is (table 4's protocol)."""
    return replace(task, steps=PEFT_VTAB_STEPS, lrs=(PEFT_LR,)) if task.vtab else task


def suite_tasks(names: list[str] | tuple[str, ...]) -> dict[str, tuple[Task, bool]]:
    """The tasks ``names`` ask for (suites' names or task names; ``vtab-`` may be left off a VTAB-1k task), each
    with whether it was named one by one (then it must be there; a suite's may be absent); a ConfigError naming
    an unknown one."""
    tasks: dict[str, tuple[Task, bool]] = {}
    for name in names:
        key = name if name in TASKS or name in SUITES else VTAB_PREFIX + name
        if key in SUITES:
            tasks.update({task: (TASKS[task], tasks.get(task, (None, False))[1]) for task in SUITES[key]})
        elif key in TASKS:
            tasks[key] = (TASKS[key], True)
        else:
            raise ConfigError(f"--suite {name}: expected paper, vtab1k or task names ({', '.join(TASKS)})")
    return {name: tasks[name] for name in TASKS if name in tasks}  # in the table's order


@dataclass(frozen=True)
class Found:
    """A task's data as found: the dataset spec and data folder the runs read it with."""

    task: Task
    spec: str
    data_dir: str | None
    where: str  # the folder or file it was found at, for the output


def find_task(task: Task, root: Path) -> Found | None:
    """Where ``task`` lies under ``root``: the first of its layouts present (None when none is); a DatasetError
    naming the task when the present one is partial (lacks a required entry) or, for VTAB-1k, lists fewer than
    1,000 training examples."""
    for layout in task.layouts:
        path = root / layout.path
        if layout.path and not path.exists():
            continue
        missing = [entry for entry in layout.required if not (path / entry).exists()]
        if missing:
            raise DatasetError(f"task {task.name}: {path} lacks {', '.join(missing)} (expected {layout.described}: "
                               f"{', '.join(layout.required)})")
        if task.vtab:
            check_vtab_size(task, path)
        spec = layout.spec.format(path=path, root=root)
        return Found(task, spec, str(root) if layout.data_dir else None, str(path) if layout.path else "built in")
    return None


def check_vtab_size(task: Task, folder: Path) -> None:
    """Refuse a VTAB-1k task whose ``train800val200.txt`` lists fewer than the 1,000 examples it trains on."""
    path = folder / "train800val200.txt"
    try:
        listed = sum(1 for line in read_text(path, "VTAB-1k file list").splitlines() if line.strip())
    except UnicodeDecodeError as error:
        raise DatasetError(f"task {task.name}: {path} is not a text file ({error})") from error
    if listed < VTAB_TRAIN:
        raise DatasetError(f"task {task.name}: {path} lists {listed} examples; VTAB-1k trains on {VTAB_TRAIN:,} "
                           f"(800 train + 200 val)")


def expected_places(task: Task, root: Path) -> str:
    """Where ``task`` is looked for under ``root``, for a message: its layouts' paths."""
    return " or ".join(str(root / layout.path) for layout in task.layouts if layout.path) or "built in"
