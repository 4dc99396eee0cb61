"""One rule for paths (vitkit.paths): nothing outside what the user named is read or written, through ``..``,
absolute paths or links; only regular files are read (a FIFO with no writer never blocks, a device is never
read), text read whole is capped; hub and bucket ids are parsed strictly; a run folder is new, empty or a run's."""

import contextlib
import errno
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from data_helpers import numbered_image, numbered_shards, png
from launch import child_env

from vitkit import ViTConfig, VisionTransformer
from vitkit.checkpoints import hub
from vitkit.cli import main
from vitkit.data import DatasetError, evaluation_loader, load_dataset
from vitkit.data import scan_folder
from vitkit.data.survey import AS_IS
from vitkit.errors import CheckpointError, ConfigError
from vitkit.paths import NotAFileError, id_segments, read_text, within

TINY = {"patch_size": 2, "dim": 16, "depth": 1, "num_heads": 2, "mlp_dim": 32, "in_chans": 1, "pool": "gap"}
TRAIN = ["train", "--model-args", json.dumps(TINY), "--steps", "1", "--batch-size", "16", "--threads", "1"]
SECRET = b"a file outside what the user named"


# Run apart, so that it runs while a reader holds the GIL in a blocked open (safetensors' does): every 20 s,
# each FIFO under the folder that a reader waits on is opened for writing and closed, which ends the read.
UNBLOCK = """
import os, stat, sys, time
while True:
    time.sleep(20)
    for folder, _, names in os.walk(sys.argv[1]):
        for name in names:
            path = os.path.join(folder, name)
            try:
                if stat.S_ISFIFO(os.lstat(path).st_mode):
                    os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))  # ENXIO unless a reader waits
                    print(path, flush=True)
            except OSError:
                pass
"""


@pytest.fixture
def no_hang(tmp_path):
    """Fail, rather than hang the suite, when a read blocks on a FIFO under ``tmp_path`` (see UNBLOCK)."""
    watchdog = subprocess.Popen([sys.executable, "-c", UNBLOCK, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    yield
    watchdog.kill()
    hung = watchdog.communicate()[0]
    assert not hung, f"a read blocked on {hung.split()}"


def run_cli(argv: list[str]) -> tuple[int, str]:
    """``vitkit ARGV`` in-process: its exit status and its stderr."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as exit_:
            code = exit_.code
    return code, err.getvalue()


def image_folder(root: Path, per_class: int = 2) -> Path:
    for label in ("ant", "bee"):
        (root / label).mkdir(parents=True)
        for index in range(per_class):
            (root / label / f"{index}.png").write_bytes(png(numbered_image(index)))
    return root


# ----------------------------------------------------------------------------------------------- containment
def test_within_follows_dot_dot_absolute_paths_and_links(tmp_path):
    root = tmp_path / "root"
    (root / "inside").mkdir(parents=True)
    (tmp_path / "secret").write_bytes(SECRET)
    (root / "out").symlink_to(tmp_path / "secret")
    (root / "in").symlink_to(root / "inside")
    real = root.resolve()
    assert within(real, "in/x.png", DatasetError) == real / "inside" / "x.png"
    for escape in ("../secret", str(tmp_path / "secret"), "out", "inside/../../secret"):
        with pytest.raises(DatasetError, match=rf"{escape}: path leads outside {real} \(to {tmp_path / 'secret'}\)"):
            within(real, escape, DatasetError)


@pytest.mark.parametrize("name, problem", [
    ("vit_models/../../../outside.npz", "a '..' segment"), ("/etc/outside.npz", "an absolute path"),
    ("vit_models\\..\\x.npz", "a backslash"), ("vit_models//x.npz", "an empty segment"),
    ("vit_models/./x.npz", "a '.' segment")])
def test_a_bucket_id_is_parsed_strictly_and_nothing_outside_the_cache_is_read(tmp_path, monkeypatch, name, problem):
    """Today ``gs://`` + ``..`` reads (and downloads into) a file beside the cache; an absolute object name too."""
    monkeypatch.setenv("VITKIT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("VITKIT_GS_URL", "http://127.0.0.1:9")  # nothing is downloaded: the id is refused first
    (tmp_path / "cache" / "gs").mkdir(parents=True)
    (tmp_path / "outside.npz").write_bytes(SECRET)
    with pytest.raises(CheckpointError, match=f"the id holds {problem}"):
        hub.resolve(f"gs://{name}")


def test_a_link_planted_in_the_bucket_cache_is_not_followed_out_of_it(tmp_path, monkeypatch):
    monkeypatch.setenv("VITKIT_CACHE", str(tmp_path / "cache"))
    (tmp_path / "cache" / "gs" / "vit_models").mkdir(parents=True)
    (tmp_path / "outside.npz").write_bytes(SECRET)
    (tmp_path / "cache" / "gs" / "vit_models" / "x.npz").symlink_to(tmp_path / "outside.npz")
    with pytest.raises(CheckpointError, match="gs://vit_models/x.npz: the cached copy leads outside"):
        hub.resolve("gs://vit_models/x.npz")


@pytest.mark.parametrize("name", ["hf-hub:org/../x", "hf-hub:org/name@../../main", "hf-hub:/abs/name",
                                  "hf-hub:org\\name"])
def test_a_hub_id_is_parsed_strictly(monkeypatch, name):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(CheckpointError, match="the id holds"):
        hub.resolve(name)


def test_id_segments_keeps_good_ids():
    assert id_segments("vit_models/augreg/B_16.npz", "gs://", CheckpointError) == ["vit_models", "augreg", "B_16.npz"]


def parquet_with_image_paths(root: Path, paths: list[str]) -> Path:
    pa, pq = pytest.importorskip("pyarrow"), pytest.importorskip("pyarrow.parquet")
    image = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    table = pa.table({"image": pa.array([{"bytes": None, "path": p} for p in paths], image),
                      "label": pa.array([0] * len(paths), pa.int64())})
    (root / "data").mkdir(parents=True)
    pq.write_table(table, root / "data" / "train-00000-of-00001.parquet")
    return root


def first_batch(spec: str):
    return next(iter(evaluation_loader(load_dataset(spec, "train"), AS_IS, batch_size=4, num_workers=0)))


def test_an_hf_row_whose_image_path_leads_outside_the_dataset_is_refused(tmp_path):
    """Today the row's absolute path is opened and the outside image read as the dataset's."""
    outside = tmp_path / "outside.png"
    outside.write_bytes(png(numbered_image(7)))
    root = parquet_with_image_paths(tmp_path / "ds", [str(outside)])
    with pytest.raises(DatasetError, match=rf"{outside}: .*row 0: the image path leads outside {root.resolve()}"):
        first_batch(f"hf:{root}")


def test_an_hf_row_whose_image_path_stays_inside_is_read(tmp_path):
    root = tmp_path / "ds"
    (root / "images").mkdir(parents=True)
    (root / "images" / "a.png").write_bytes(png(numbered_image(7)))
    parquet_with_image_paths(root, ["images/a.png"])
    images, labels = first_batch(f"hf:{root}")[:2]
    assert images.shape == (1, 3, 4, 4) and labels.tolist() == [0]


def test_a_link_in_an_image_folder_that_leads_outside_is_refused_naming_both(tmp_path):
    root = image_folder(tmp_path / "images")
    (tmp_path / "secret.png").write_bytes(png(numbered_image(9)))
    (root / "ant" / "sneaky.png").symlink_to(tmp_path / "secret.png")
    with pytest.raises(DatasetError, match=rf"sneaky.png: a link leads outside {root.resolve()} "
                                           rf"\(to {tmp_path / 'secret.png'}\)"):
        load_dataset(f"imagefolder:{root}", "train")


def test_links_that_stay_inside_an_image_folder_and_a_linked_root_work(tmp_path):
    root = image_folder(tmp_path / "images")
    (root / "bee" / "again.png").symlink_to(root / "ant" / "0.png")
    (tmp_path / "named").symlink_to(root)  # the folder the user names may itself be a link
    dataset = scan_folder(tmp_path / "named")
    assert len(dataset) == 5


def test_a_crafted_listing_cache_entry_naming_an_outside_file_is_not_trusted(tmp_path):
    """A listing entry is keyed by the folder and checked by its directories' stamps, which an attacker can copy;
    today the files it names are read wherever they are."""
    import vitkit.data.folders as folders
    root = image_folder(tmp_path / "images").absolute()
    (tmp_path / "secret.png").write_bytes(png(numbered_image(9)))
    listing = folders._walk(root)
    forged = np.array([os.fsencode(tmp_path / "images" / "ant" / ".." / ".." / "secret.png")] + list(listing.files[1:]))
    forged_listing = folders.Listing(listing.classes, forged, listing.counts, listing.directories, listing.stamps)
    entry = folders._entry(root)
    folders._store(entry, root, forged_listing)
    assert folders._cached(entry, root) is None  # walked again instead
    assert folders._cached(entry, root) is None
    folders._store(entry, root, listing)
    assert folders._cached(entry, root) is not None  # an honest entry is still used


def test_a_link_in_a_shard_folder_that_leads_outside_is_refused(tmp_path):
    numbered_shards(tmp_path / "outside", "train", [2])
    root = tmp_path / "shards"
    numbered_shards(root, "train", [2])
    (root / "train-000001.tar").symlink_to(tmp_path / "outside" / "train-000000.tar")
    with pytest.raises(DatasetError, match=r"train-000001.tar: a shard leads outside"):
        load_dataset(f"webdataset:{root}", "train")


def onnx_with_external_data(folder: Path, location: str) -> Path:
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper
    weights = helper.make_tensor("W", TensorProto.FLOAT, [4], np.zeros(4, np.float32).tobytes(), raw=True)
    weights.ClearField("raw_data")
    weights.data_location = TensorProto.EXTERNAL
    entry = weights.external_data.add()
    entry.key, entry.value = "location", location
    x = helper.make_tensor_value_info("images", TensorProto.FLOAT, [4])
    y = helper.make_tensor_value_info("logits", TensorProto.FLOAT, [4])
    graph = helper.make_graph([helper.make_node("Add", ["images", "W"], ["logits"])], "g", [x], [y], [weights])
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "model.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


@pytest.mark.parametrize("location", ["../secret.bin", "SECRET", "link.bin"])
def test_onnx_external_data_outside_the_model_folder_is_refused(tmp_path, location):
    from vitkit.checkpoints.onnx import OnnxModel
    (tmp_path / "secret.bin").write_bytes(b"\0" * 16)
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "link.bin").symlink_to(tmp_path / "secret.bin")
    path = onnx_with_external_data(tmp_path / "model", location.replace("SECRET", str(tmp_path / "secret.bin")))
    with pytest.raises(CheckpointError, match=rf"external data of tensor 'W' leads outside {path.parent.resolve()}"):
        OnnxModel(path)


# ------------------------------------------------------------------------------------------------ run folders
def test_a_run_folder_that_links_to_a_folder_of_other_files_is_refused_and_left_alone(tmp_path):
    """Today the run is written into whatever folder the link names (say /etc)."""
    other = tmp_path / "etc"
    other.mkdir()
    (other / "passwd").write_text("root:x:0:0")
    (tmp_path / "run").symlink_to(other)
    code, err = run_cli([*TRAIN, "--run-dir", str(tmp_path / "run")])
    assert code == 2, err
    assert f"{tmp_path / 'run'}: holds 'passwd', which a training run does not write" in err
    assert sorted(os.listdir(other)) == ["passwd"]


def test_a_run_folder_of_a_users_files_is_refused_naming_it(tmp_path):
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "a.txt").write_text("mine")
    (tmp_path / "notes" / "b.txt").write_text("mine")
    with pytest.raises(ConfigError, match=r"notes: holds 'a.txt' and 1 more, which a training run does not write"):
        from vitkit.train import Recipe
        from vitkit.train.run import prepare
        prepare(Recipe(model={"args": TINY}, schedule={"steps": 1}, run={"dir": str(tmp_path / "notes")}))


def test_a_run_folder_that_links_to_an_empty_folder_is_used(tmp_path):
    (tmp_path / "scratch").mkdir()
    (tmp_path / "run").symlink_to(tmp_path / "scratch")
    code, err = run_cli([*TRAIN, "--run-dir", str(tmp_path / "run")])
    assert code == 0, err
    assert (tmp_path / "scratch" / "recipe.json").is_file() and (tmp_path / "scratch" / "model").is_dir()


# -------------------------------------------------------------------------------------- regular files only
def fifo(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    os.mkfifo(path)
    return path


def native_with_fifo(tmp_path: Path, name: str) -> Path:
    directory = tmp_path / "ckpt"
    VisionTransformer(ViTConfig(image_size=8, num_classes=3, **TINY)).save(directory)
    (directory / name).unlink()
    fifo(directory / name)
    return directory


@pytest.mark.parametrize("make, says", [
    (lambda t: fifo(t / "w.safetensors"), "w.safetensors: .*a FIFO \\(named pipe\\), not a regular file"),
    (lambda t: fifo(t / "w.npz"), "w.npz: .*a FIFO \\(named pipe\\), not a regular file"),
    (lambda t: fifo(t / "w.pt"), "w.pt: .*a FIFO \\(named pipe\\), not a regular file"),
    (lambda t: native_with_fifo(t, "config.json"), "config.json: a FIFO \\(named pipe\\), not a regular file"),
    (lambda t: native_with_fifo(t, "model.safetensors"), "model.safetensors: .*a FIFO"),
])
def test_weights_and_configs_that_are_special_files_are_refused_without_blocking(tmp_path, no_hang, make, says):
    from vitkit import load
    with pytest.raises((CheckpointError, OSError), match=says):
        load(make(tmp_path))


def test_dev_zero_as_an_npz_is_refused(tmp_path, no_hang):
    from vitkit import load
    (tmp_path / "w.npz").symlink_to("/dev/zero")
    with pytest.raises(CheckpointError, match="w.npz: .*a character device, not a regular file"):
        load(tmp_path / "w.npz")


def test_an_image_that_is_a_fifo_is_named_not_waited_on(tmp_path, no_hang):
    root = image_folder(tmp_path / "images")
    fifo(root / "ant" / "2.png")
    dataset = scan_folder(root)
    position = [str(p) for p in dataset.files.tolist()].index(str(os.fsencode(root / "ant" / "2.png")))
    with pytest.raises(DatasetError, match=r"2.png: not a readable image \(.*a FIFO \(named pipe\), not a regular file"):
        dataset[position]


@pytest.mark.parametrize("special", ["fifo", "/dev/zero"])
def test_a_recipe_that_is_a_special_file_is_refused(tmp_path, no_hang, special):
    path = tmp_path / "recipe.yaml"
    fifo(path) if special == "fifo" else path.symlink_to(special)
    code, err = run_cli(["train", "--config", str(path)])
    assert code == 1 and "Traceback" not in err, err
    assert f"{path}: a {'FIFO (named pipe)' if special == 'fifo' else 'character device'}, not a regular file" in err


@pytest.mark.parametrize("special", ["fifo", "/dev/zero"])
def test_a_shard_or_class_list_that_is_a_special_file_is_refused(tmp_path, no_hang, special):
    root = tmp_path / "shards"
    numbered_shards(root, "train", [2])
    for name in ("train-000001.tar", "classes.txt"):
        path = root / name
        fifo(path) if special == "fifo" else path.symlink_to(special)
        escape = "a shard leads outside|the class list leads outside" if special != "fifo" else "not a regular file"
        with pytest.raises(DatasetError, match=rf"{name}: .*({escape})"):
            load_dataset(f"webdataset:{root}", "train")
        path.unlink()
    (root / "one.tar").symlink_to(special) if special != "fifo" else fifo(root / "one.tar")
    with pytest.raises(DatasetError, match=r"one.tar: a .*, not a regular file; expected a shard file"):
        load_dataset(f"webdataset:{root / 'one.tar'}", "train")


def test_a_parquet_file_that_is_a_fifo_is_refused(tmp_path, no_hang):
    fifo(tmp_path / "ds" / "data" / "train-00000-of-00001.parquet")
    with pytest.raises(DatasetError, match=r"train-00000-of-00001.parquet: .*a FIFO \(named pipe\), not a regular"):
        load_dataset(f"hf:{tmp_path / 'ds'}", "train")


def test_cache_entries_that_are_fifos_are_passed_over(tmp_path, no_hang, monkeypatch):
    """A FIFO planted where the shard index or a folder listing is cached is not waited on: the data is indexed
    (listed) again and the entry replaced."""
    import vitkit.data.folders as folders
    import vitkit.data.index_cache as index_cache
    monkeypatch.setenv("VITKIT_CACHE", str(tmp_path / "cache"))
    root = tmp_path / "shards"
    numbered_shards(root, "train", [3])
    stamp = index_cache._stamp(str(root / "train-000000.tar"), "tar")
    fifo(index_cache._entry(stamp))
    assert len(load_dataset(f"webdataset:{root}", "train")) == 3
    images = image_folder(tmp_path / "images").absolute()
    fifo(folders._entry(images))
    assert folders._cached(folders._entry(images), images) is None


def test_text_past_its_cap_is_refused_saying_the_cap(tmp_path):
    path = tmp_path / "classes.txt"
    path.write_text("a\n" * 10)
    with pytest.raises(OSError, match="larger than 16 bytes, the most a class list may hold") as raised:
        read_text(path, "class list", limit=16)
    assert raised.value.errno == errno.EFBIG and raised.value.filename == str(path)
    assert read_text(path, "class list", limit=20) == "a\n" * 10


def test_a_folder_where_a_file_is_expected_is_not_a_file(tmp_path):
    with pytest.raises(NotAFileError, match="Is a directory"):
        read_text(tmp_path, "recipe")


# ----------------------------------------------------------------------- loops and unreadable sub-folders
def test_a_symbolic_link_loop_in_an_image_folder_is_one_line(tmp_path):
    root = image_folder(tmp_path / "images")
    (root / "ant" / "loop").symlink_to(root / "ant")
    code, err = run_cli(["data", "info", f"imagefolder:{root}"])
    assert code == 1 and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert "a symbolic link loop" in err
    (root / "ant" / "loop").unlink()
    (root / "ant" / "self.png").symlink_to(root / "ant" / "self.png")  # a link to itself
    code, err = run_cli(["data", "info", f"imagefolder:{root}"])
    assert code == 1 and len(err.strip().splitlines()) == 1, err
    assert f"{root / 'ant' / 'self.png'}: cannot list the folder (Too many levels of symbolic links)" in err


@pytest.mark.skipif(os.geteuid() == 0 and not Path("/usr/bin/setpriv").exists(), reason="root ignores modes")
def test_an_unreadable_sub_folder_is_one_line(tmp_path):
    root = image_folder(tmp_path / "images")
    (root / "bee").chmod(0)
    prefix = ["setpriv", "--bounding-set=-dac_override,-dac_read_search"] if os.geteuid() == 0 else []
    try:
        result = subprocess.run([*prefix, sys.executable, "-m", "vitkit", "data", "info", f"imagefolder:{root}"],
                                env=child_env(), capture_output=True, text=True, timeout=120)
    finally:
        (root / "bee").chmod(0o755)
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
    assert result.stderr.strip().endswith(f"{root / 'bee'}: cannot list the folder (Permission denied)")
