"""The one fixture layer of the tests: offline; tiny models from config and saved as model folders;
image folders; a factory of finished tiny runs, each trained once a session; the one assertion of a
user's mistake (`user_error`); runners for the real entry points."""

from __future__ import annotations

import csv
import hashlib
import json
import os
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest
import yaml

os.environ["HF_HUB_OFFLINE"] = "1"  # an accidental download fails loudly
os.environ["HF_DATASETS_OFFLINE"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# datasets reads its cache location once, at import: a private one per test session.
_SESSION_DIRS = [tempfile.mkdtemp(prefix="finetune-tests-datasets-")]
os.environ["HF_DATASETS_CACHE"] = _SESSION_DIRS[0]
# And a private Hugging Face home: accelerate's default config (`accelerate config`) is the machine's,
# not the tests'; read, it would change what every bare launch does (and what it warns about).
_SESSION_DIRS.append(tempfile.mkdtemp(prefix="finetune-tests-hf-home-"))
os.environ["HF_HOME"] = _SESSION_DIRS[1]


def _share_the_cores_among_workers() -> None:
    """Under pytest-xdist (`-n 2`, the default run's), each worker gets its own slice of the CPUs, before
    torch loads: the app gives a process all the cores it may use (finetune/runtime.py), so two
    unpinned workers ran 4 torch threads on 2 cores, and OpenMP threads spin while they wait (the
    entry points set OMP_WAIT_POLICY=PASSIVE, but a test module may import torch first): each test took
    2-3x as long as in one process. Pinned, a worker and the processes it launches keep to their slice."""
    worker, count = os.environ.get("PYTEST_XDIST_WORKER"), os.environ.get("PYTEST_XDIST_WORKER_COUNT")
    if not worker or not count or not hasattr(os, "sched_setaffinity"):
        return
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    cpus = sorted(os.sched_getaffinity(0))
    index, count = int(worker.removeprefix("gw")), int(count)
    if len(cpus) >= count:
        share = len(cpus) // count
        os.sched_setaffinity(0, cpus[index * share : (index + 1) * share] if index < count - 1
                             else cpus[index * share :])  # fmt: skip
    else:  # fewer CPUs than workers: one each, shared
        os.sched_setaffinity(0, {cpus[index % len(cpus)]})


_share_the_cores_among_workers()

# The longest files of the default run (those of 10 s or more, by their seconds on a pinned worker of a
# whole run), handed out first under xdist (`--dist loadfile` gives each worker a whole file, in
# collection order): the last file to start is then a short one, not test_onnx.py's exports or
# test_streams.py's signalled run while the other worker waits idle (pyproject.toml's
# --no-loadscope-reorder keeps this order).
LONGEST_FIRST = ["test_onnx.py", "test_evaluate_checkpoint.py", "test_bad_input.py", "test_rundir.py", "test_streams.py",
                 "test_data.py", "test_checks.py", "test_problems.py", "test_search.py", "test_images.py", "test_signals.py",
                 "test_tokens.py", "test_multiple_choice.py", "test_models.py", "test_launch.py", "test_ddp_equivalence.py",
                 "test_checkpoint.py",
                 "test_faults.py", "test_efficientnet.py", "test_run.py", "test_question_answering.py", "test_fuzz.py",
                 "test_slurm.py", "test_verify.py"]  # fmt: skip


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if os.environ.get("PYTEST_XDIST_WORKER"):  # every worker sorts alike; a plain run keeps the file order
        rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
        items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: a file's own order stays


def pytest_unconfigure(config: pytest.Config) -> None:
    """The session's private caches go with it (tens of MB each; a machine that runs the suite often
    would fill its temporary folder)."""
    for folder in _SESSION_DIRS:
        shutil.rmtree(folder, ignore_errors=True)

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "data"
TOKENIZER = DATA / "bert_minilm_l6_uncased"
ROTTEN = DATA / "rotten_tomatoes"

# A tiny BERT with no dropout, so that different batchings give the same math.
TINY_BERT = (
    "{model_type: bert, hidden_size: 32, num_hidden_layers: 2, num_attention_heads: 4, "
    "intermediate_size: 37, max_position_embeddings: 128, hidden_dropout_prob: 0.0, "
    "attention_probs_dropout_prob: 0.0}"
)
TINY_VIT = (
    "{model_type: vit, image_size: 28, patch_size: 7, num_channels: 3, hidden_size: 32, "
    "num_hidden_layers: 2, num_attention_heads: 4, intermediate_size: 37, hidden_dropout_prob: 0.0, "
    "attention_probs_dropout_prob: 0.0}"
)
# A tiny EfficientNet (BatchNorm, depthwise convolutions, squeeze-excite): 2 blocks, 5,934 weights, 32x32.
TINY_EFFICIENTNET = (
    "{model_type: efficientnet, image_size: 32, num_channels: 3, width_coefficient: 0.25, depth_coefficient: 0.25, "
    "hidden_dim: 320, kernel_sizes: [3, 3], in_channels: [32, 16], out_channels: [16, 24], num_block_repeats: [1, 1], "
    "strides: [1, 2], expand_ratios: [1, 6], depthwise_padding: [], hidden_act: relu6, dropout_rate: 0.0, "
    "drop_connect_rate: 0.0, batch_norm_momentum: 0.01}"
)
# Dropout on, so that an exact resume also needs the RNG state restored.
DROPOUT_BERT = TINY_BERT.replace("hidden_dropout_prob: 0.0", "hidden_dropout_prob: 0.1")


def reset_accelerate() -> None:
    """Forget the Accelerator of the run before, so that the next in-process run builds its own. After
    every test (below) and every run of the factory; call it by hand only between runs in one test that
    end otherwise than by returning (killed, stopped) or in one process that runs many (the fuzzer)."""
    from accelerate.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(True)
    GradientState._reset_state()


@pytest.fixture(autouse=True)
def _fresh_accelerate_state():
    """Each in-process run builds its own Accelerator from a clean slate."""
    yield
    reset_accelerate()


def write_csv(path: Path, rows: list[dict], fieldnames: list[str] | None = None) -> Path:
    fieldnames = fieldnames or list(rows[0])
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=fieldnames)
        writer.writeheader()
        writer.writerows(rows)
    return path


def rotten_rows(n: int, start: int = 0) -> list[dict]:
    with (ROTTEN / "train.csv").open() as f:
        rows = list(csv.DictReader(f))
    return rows[start : start + n]


@pytest.fixture
def small_text_data(tmp_path) -> dict[str, Path]:
    """37 training rows (not a multiple of any global batch used in tests) and 13 validation rows."""
    return {
        "train": write_csv(tmp_path / "train.csv", rotten_rows(37)),
        "validation": write_csv(tmp_path / "validation.csv", rotten_rows(13, start=100)),
    }


def tiny_text_args(data: dict[str, Path], out: Path, *extra: str) -> list[str]:
    return [
        "task=text-classification",
        f"model_config={TINY_BERT}",
        f"tokenizer_name={TOKENIZER}",
        f"train_file={data['train']}",
        f"validation_file={data['validation']}",
        "test_file=null",
        "max_train_samples=null",
        "max_eval_samples=null",
        "max_length=32",
        "label_names=null",
        "warmup_ratio=0.2",
        "learning_rate=1e-3",
        "logging_steps=1",
        # The default recipe freezes the embeddings and turns dropout off; tests choose for themselves.
        "freeze_embeddings=false",
        "dropout=null",
        f"output_dir={out}",
        *extra,
    ]


def recipe_text_args(data: dict[str, Path], out: Path, *extra: str) -> list[str]:
    """`tiny_text_args` under the default recipe's optimisation (its learning rate and warmup), batch 8."""
    keep = [a for a in tiny_text_args(data, out) if not a.startswith(("warmup_ratio=", "learning_rate=",
                                                                       "output_dir="))]  # fmt: skip
    return [*keep, "per_device_train_batch_size=8", f"output_dir={out}", *extra]


def tiny_image_args(data_dir: Path, out: Path, *extra: str) -> list[str]:
    """The tiny ViT on an image folder over the default recipe (its data files cleared), batch 4."""
    return ["task=image-classification", f"model_config={TINY_VIT}", "model_name_or_path=null", "train_file=null",
            "validation_file=null", "test_file=null", f"data_dir={data_dir}", "max_train_samples=null",
            "max_eval_samples=null", "freeze_embeddings=false", "label_names=null", "per_device_train_batch_size=4",
            "logging_steps=1", f"output_dir={out}", *extra]  # fmt: skip


def file_hashes(folder: Path) -> dict[str, str]:
    """sha256 of every file under `folder`, by relative path: what "nothing was changed" compares."""
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(Path(folder).rglob("*")) if p.is_file()}  # fmt: skip


def one_error_line(status: int | None, err: str, *fragments: str) -> str:
    """The rule for a user's mistake, on an exit status and what went to stderr: status 2, exactly one
    line starting `error:` (beside progress bars) holding every fragment, no traceback. Returns the line."""
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert status == 2 and len(lines) == 1 and "Traceback" not in err, (status, err[-3000:])
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]


def user_error(capsys, main: Callable, argv: list[str], *fragments: str,
               untouched: Path | Sequence[Path] = (), rule: str | None = None) -> str:  # fmt: skip
    """Run an entry point's `main(argv)` in-process and assert the one rule of a user's mistake
    (`one_error_line`: exit 2, one `error:` line holding each fragment, no traceback), that every file
    under `untouched` (an earlier run, the user's own folder) keeps its bytes and, given `rule`, that the
    check that refused it is that rule (finetune/checks/). Returns the line."""
    folders = [untouched] if isinstance(untouched, Path) else list(untouched)
    before = [file_hashes(folder) for folder in folders]
    capsys.readouterr()  # only this command's output
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    line = one_error_line(exit_info.value.code, capsys.readouterr().err, *fragments)
    if rule is not None:  # the exit is raised while the UserError is handled: it is the exit's context
        assert getattr(exit_info.value.__context__, "rule", None) == rule, (exit_info.value.__context__, rule)
    for folder, hashes in zip(folders, before, strict=True):
        after = file_hashes(folder)
        assert after == hashes, f"{folder} changed: {sorted(set(after.items()) ^ set(hashes.items()))[:6]}"
    return line


def user_error_from_command(args: list[str], *fragments: str, untouched: Path | Sequence[Path] = (),
                            cwd: Path = REPO, rule: str | None = None) -> str:  # fmt: skip
    """`user_error` for the real command, `python <args>` in a process of its own (`args`: a script and
    its arguments, or `-m <module> ...`); given `rule`, the line is asked to name its rule
    (FINETUNE_SHOW_RULES=1: `error: [phase.name] ...`)."""
    folders = [untouched] if isinstance(untouched, Path) else list(untouched)
    before = [file_hashes(folder) for folder in folders]
    env = {**os.environ, "FINETUNE_SHOW_RULES": "1"} if rule is not None else None
    result = subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=180, cwd=cwd, env=env)
    line = one_error_line(result.returncode, result.stderr, *fragments)
    assert rule is None or line.startswith(f"error: [{rule}] "), (line, rule)
    assert [file_hashes(folder) for folder in folders] == before, "an earlier run's files changed"
    return line


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch_command(num_processes: int = 1, launcher: str = "accelerate.commands.launch") -> list[str]:
    """`accelerate launch` (or `finetune.launch`) with every flag given, so it warns about no default."""
    import psutil

    threads = max(1, (psutil.cpu_count(logical=False) or 1) // num_processes)  # what accelerate would choose
    cmd = [sys.executable, "-m", launcher, "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
           "--num_cpu_threads_per_process", str(threads)]  # fmt: skip
    if num_processes > 1:
        return cmd + ["--multi_gpu", "--num_processes", str(num_processes), "--main_process_port", str(free_port())]
    return cmd + ["--num_processes", "1", "--cpu"]  # as cpu.yaml (use_cpu: true): this machine has no GPU


def launch(args: list[str], num_processes: int = 1, script: str = "finetune/run.py", timeout: int = 300,
           env: dict | None = None) -> subprocess.CompletedProcess:
    """Run an entry point with `accelerate launch`, as a user does; several processes form CPU DDP."""
    cmd = launch_command(num_processes)
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    return subprocess.run(cmd + [str(REPO / script), *args], cwd=REPO, env=full_env, capture_output=True,
                          text=True, timeout=timeout)


def launch_runs(
    config_file: Path,
    runs: list[dict],
    root: Path,
    env: dict | None = None,
    num_processes: int = 2,
    timeout: int = 400,
) -> tuple[dict, str]:
    """Several runs of finetune.run.main in one `accelerate launch --config_file <file>` of
    tests/multi_run_worker.py (see there why); returns {(run name, rank): record} and the output."""
    records_dir = root / "records"
    records_dir.mkdir(parents=True, exist_ok=True)
    plan = root / "plan.json"
    plan.write_text(json.dumps({"record_dir": str(records_dir), "runs": runs}))
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(config_file),
           "--num_processes", str(num_processes), "--main_process_port", str(free_port()),
           str(REPO / "tests" / "multi_run_worker.py"), str(plan)]  # fmt: skip
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {}),
                "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}  # fmt: skip
    proc = subprocess.run(cmd, cwd=REPO, env=full_env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    records = {
        (r["name"], rank): json.loads((records_dir / f"{r['name']}-{rank}.json").read_text())
        for r in runs
        for rank in range(num_processes)
    }
    return records, proc.stdout + proc.stderr


def run_outputs(output: str) -> dict[str, str]:
    """What each run of a `launch_runs` launch printed on stdout (rank 0's lines from the worker's mark
    of that run to the next one's), by run name; the last run's text also holds the launch's stderr."""
    from multi_run_worker import RUN_MARK

    parts = output.split(RUN_MARK)[1:]
    return {part.split("\n", 1)[0].strip(): part.split("\n", 1)[-1] for part in parts}


def logged_losses(out: Path) -> dict[int, float]:
    """{optimizer step: logged loss} of a run."""
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["loss"] for r in records if "loss" in r}


def assert_same_run(out: Path, reference: Path) -> None:
    """A resumed run ended as the uninterrupted one: its exported weights within 1e-6, the same losses."""
    from safetensors.torch import load_file

    a = load_file(reference / "model" / "model.safetensors")
    b = load_file(out / "model" / "model.safetensors")
    worst = max((a[k] - b[k]).abs().max().item() for k in a)
    assert worst <= 1e-6, f"resumed weights differ by {worst:.2e}"
    assert logged_losses(out) == pytest.approx(logged_losses(reference), abs=1e-6)


def logged_steps(out: Path) -> int:
    """Optimizer steps a run has logged a loss for so far."""
    path = out / "metrics.jsonl"
    return len([line for line in path.read_text().splitlines() if '"loss"' in line]) if path.exists() else 0


def wait_until(condition, proc: subprocess.Popen, timeout: float = 120) -> None:
    """Poll `condition` while `proc` runs; fail if it ends first or the time runs out."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert proc.poll() is None, "the run ended before the fault was injected"
        assert time.monotonic() < deadline, "timed out waiting for the run"
        time.sleep(0.005)


# Regression and multi-label data a tiny BERT can learn from in a few steps (finetune/problems.py).
def regression_rows(n: int, seed: int = 0) -> list[dict]:
    """Texts of 4-10 words; the score is (#good - #bad) + 0.5: decimals, so it reads as a regression."""
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        words = [rng.choice(["good", "bad", "movie", "film", "plot", "the"]) for _ in range(rng.randint(4, 10))]
        rows.append({"text": " ".join(words), "score": words.count("good") - words.count("bad") + 0.5})
    return rows


ANIMALS = ["cat", "dog", "bird"]


def multi_label_rows(n: int, seed: int = 0) -> list[dict]:
    """Texts naming 1-3 animals among filler words; the labels are the animals named."""
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        present = [a for a in ANIMALS if rng.random() < 0.5] or [rng.choice(ANIMALS)]
        words = present + [rng.choice(["the", "a", "park", "house", "saw"]) for _ in range(rng.randint(2, 6))]
        rng.shuffle(words)
        rows.append({"text": " ".join(words), "labels": present})
    return rows


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


# --- tiny models, saved as a user's model folders ----------------------------------------------------


def _sizes(spec: str) -> dict:
    sizes = yaml.safe_load(spec)
    sizes.pop("model_type")
    return sizes


def tiny_bert_config(**overrides):
    """TINY_BERT as a transformers `BertConfig` (the bundled tokenizer's vocabulary), with `overrides`."""
    from transformers import BertConfig

    return BertConfig(**{**_sizes(TINY_BERT), **overrides})


def tiny_vit_config(**overrides):
    """TINY_VIT as a transformers `ViTConfig`, with `overrides`."""
    from transformers import ViTConfig

    return ViTConfig(**{**_sizes(TINY_VIT), **overrides})


def save_tiny_bert(folder: Path, model_class: str = "BertForSequenceClassification", tokenizer: bool = True,
                   seed: int = 0, safetensors: bool = True, **overrides) -> Path:  # fmt: skip
    """A tiny BERT saved with `save_pretrained`, as a user's model folder: its config, random weights
    (from `seed`) and, with `tokenizer`, the bundled tokenizer. `model_class`: `BertForMaskedLM` is a
    "pretrained" model whose head the classifier does not use, `BertModel` a bare encoder;
    `safetensors=False`: the weights as a pickle, pytorch_model.bin."""
    import torch
    import transformers

    torch.manual_seed(seed)
    model = getattr(transformers, model_class)(tiny_bert_config(**overrides))
    if safetensors:
        model.save_pretrained(folder)
    else:  # what an older transformers wrote (today's save_pretrained writes safetensors only)
        model.config.save_pretrained(folder)
        torch.save(model.state_dict(), Path(folder) / "pytorch_model.bin")
    if tokenizer:
        transformers.AutoTokenizer.from_pretrained(TOKENIZER).save_pretrained(folder)
    return folder


def save_tiny_vit(folder: Path, labels: Sequence[str] = ("cat", "dog"), seed: int = 0, **overrides) -> Path:
    """A tiny ViT image classifier of `labels`, saved with `save_pretrained` beside its image processor
    (the PIL one where transformers has it: no torchvision needed)."""
    import torch
    from transformers import ViTForImageClassification

    try:
        from transformers import ViTImageProcessorPil as ViTImageProcessor
    except ImportError:
        from transformers import ViTImageProcessor

    config = tiny_vit_config(id2label=dict(enumerate(labels)), label2id={name: i for i, name in enumerate(labels)},
                             **overrides)  # fmt: skip
    torch.manual_seed(seed)
    ViTForImageClassification(config).save_pretrained(folder)
    size = config.image_size
    ViTImageProcessor(size={"height": size, "width": size}).save_pretrained(folder)
    return folder


def save_tiny_efficientnet(folder: Path, labels: Sequence[str] = ("cat", "dog"), seed: int = 0) -> Path:
    """TINY_EFFICIENTNET as a "pretrained" model folder, as data/efficientnet_lite0 is one: an ImageNet-style
    head of `labels`, running statistics that are not the initial 0 and 1 (a few batches in train mode),
    and its EfficientNet image processor (bicubic resize, (x-127)/128)."""
    import torch
    import transformers
    from transformers import EfficientNetConfig, EfficientNetForImageClassification

    processor = getattr(transformers, "EfficientNetImageProcessorPil", None) or transformers.EfficientNetImageProcessor
    config = EfficientNetConfig(**_sizes(TINY_EFFICIENTNET), id2label=dict(enumerate(labels)),
                                label2id={name: i for i, name in enumerate(labels)})  # fmt: skip
    torch.manual_seed(seed)
    model = EfficientNetForImageClassification(config)
    with torch.no_grad():
        for _ in range(5):
            model(pixel_values=torch.randn(8, 3, 32, 32) * 2 + 0.5)
    model.save_pretrained(folder)
    processor(size={"height": 32, "width": 32}, resample=3, do_center_crop=False, rescale_factor=1 / 255,
              image_mean=[127 / 255] * 3, image_std=[128 / 255] * 3, include_top=False).save_pretrained(folder)
    return folder


@pytest.fixture(scope="session")
def tiny_efficientnet_folder(tmp_path_factory) -> Path:
    """A tiny EfficientNet of 5 "pretrained" classes (a new head for the tests' 3), with its processor."""
    return save_tiny_efficientnet(tmp_path_factory.mktemp("models") / "tiny-efficientnet", ("a", "b", "c", "d", "e"))


@pytest.fixture(scope="session")
def tiny_bert_folder(tmp_path_factory) -> Path:
    """A tiny BERT sequence classifier with the bundled tokenizer, as a user's local model folder. Shared:
    read it, never write into it."""
    return save_tiny_bert(tmp_path_factory.mktemp("models") / "tiny-bert")


@pytest.fixture(scope="session")
def tiny_vit_folder(tmp_path_factory) -> Path:
    """A tiny ViT classifier of cat and dog with its image processor, evaluated without a run. Shared:
    read it, never write into it."""
    return save_tiny_vit(tmp_path_factory.mktemp("models") / "tiny-vit")


# --- image folders ---------------------------------------------------------------------------------

SAMPLE_PNG = DATA / "fashion_mnist" / "sample_png" / "train"


def image_folder(root: Path, classes: int = 2, per_class: int = 6,
                 mode: Callable[[int, int], str] | None = None) -> Path:  # fmt: skip
    """`root/train/<class>/<j>.png`: the first `per_class` bundled Fashion-MNIST PNGs (28x28 grayscale) of
    the first `classes` classes (0_tshirt_top, 1_trouser, ...); `mode(class index, j)` converts each to a
    PIL mode ("L", "RGB", "P", "RGBA", ...)."""
    from PIL import Image

    for i, folder in enumerate(sorted(SAMPLE_PNG.iterdir())[:classes]):
        dest = root / "train" / folder.name
        dest.mkdir(parents=True)
        for j, png in enumerate(sorted(folder.iterdir())[:per_class]):
            if mode is None:
                shutil.copy(png, dest / f"{j}.png")
            else:
                Image.open(png).convert(mode(i, j)).save(dest / f"{j}.png")
    return root


def drawn_images(root: Path, colors: dict[str, list[tuple[int, int, int]]], split: str = "train",
                 size: tuple[int, int] = (28, 28)) -> Path:  # fmt: skip
    """`root/<split>/<class>/<i>.png`: one plain RGB image of `size` for each colour of each class."""
    from PIL import Image

    for label, shades in colors.items():
        (root / split / label).mkdir(parents=True, exist_ok=True)
        for i, color in enumerate(shades):
            Image.new("RGB", size, color).save(root / split / label / f"{i}.png")
    return root


def class_folders(root: Path, classes: dict[str, list[str]], per_class: int = 3) -> Path:
    """`root/<split>/<class>/<i>.png` for each split's classes: `per_class` plain 28x28 images each, of a
    colour of their own (each class's and each split's: the same image in two classes is refused,
    splits.class_within_another)."""
    for s, (split, names) in enumerate(classes.items()):
        drawn_images(root, {name: [(40 * i, 90 + 20 * c, 150 + 9 * s) for i in range(per_class)]
                            for c, name in enumerate(names)}, split=split)  # fmt: skip
    return root


# --- finished runs: each trained once a session ----------------------------------------------------------

# The finished run that refusals and replacements aim at (tests/test_bad_input.py, the fuzzer, the output
# directory's and the faults' tests): two optimizer steps, checkpoints step-00000001 and step-00000002, an
# export. Frozen embeddings: no optimizer state for the 30522-row table, so a copy of it is 12 MB, not 28.
EARLIER_RUN = ("max_steps=2", "save_steps=1", "freeze_embeddings=true")
# A run to evaluate (tests/test_evaluate_checkpoint.py, and the old forms of tests/test_rundir.py), on
# "named+test": 5 optimizer steps of batch 8, checkpoints at steps 2 and 4, evaluation batches of 4.
EVALUATED_RUN = ("save_steps=2", "num_train_epochs=1", "per_device_train_batch_size=8", "per_device_eval_batch_size=4")
# The uninterrupted run that interrupted ones (a signal, kill -9, a save cut short) are compared with:
# dropout on, 37 samples in batches of 4 (10 steps an epoch), so the runs cross an epoch end.
STEPS = 12
UNINTERRUPTED = (f"model_config={DROPOUT_BERT}", f"max_steps={STEPS}", "per_device_train_batch_size=4",
                 "save_total_limit=null")  # fmt: skip

NAMES = {"0": "neg", "1": "pos"}


def _named(rows: list[dict]) -> list[dict]:
    return [{"text": r["text"], "label": NAMES[r["label"]]} for r in rows]


# The data sets a finished run is trained on: name -> {split: (file name, rows)}. 37 training rows (not a
# multiple of any global batch used in tests), 13 validation rows, 11 test rows (odd: 2 processes x
# batch 4 pad the last batch).
RUN_DATA: dict[str, Callable[[], dict[str, tuple[str, list[dict]]]]] = {
    "text": lambda: {"train": ("train.csv", rotten_rows(37)), "validation": ("validation.csv", rotten_rows(13, 100))},
    "text+test": lambda: {**RUN_DATA["text"](), "test": ("test.csv", rotten_rows(11, 200))},
    # string labels, so that mapping by name is what is tested
    "named+test": lambda: {split: (name, _named(rows)) for split, (name, rows) in RUN_DATA["text+test"]().items()},
    "multi_label": lambda: {"train": ("train.jsonl", multi_label_rows(32, seed=0)),
                            "validation": ("validation.jsonl", multi_label_rows(16, seed=1))},
    "multi_label+test": lambda: {"train": ("train.jsonl", multi_label_rows(40, seed=0)),
                                 "validation": ("validation.jsonl", multi_label_rows(16, seed=1)),
                                 "test": ("test.jsonl", multi_label_rows(12, seed=2))},
}  # fmt: skip


class FinishedRuns:
    """`finished_run(*settings, data="text")`: the output folder of `finetune.run.main(tiny_text_args(
    <data>, out, *settings))` (with `test_file=` where the data has a test split), trained the first time
    any test asks for it and shared by every test that asks the same. Read it, never write into it: a test
    that resumes, damages, evaluates into or overwrites a run works on `finished_run.copy(dest, ...)`.
    `finished_run.data(name)` is the data's files. The session's end checks that no shared run changed."""

    def __init__(self, root: Path):
        self.root, self.runs, self.hashes, self.files = root, {}, {}, {}

    def data(self, name: str = "text") -> dict[str, Path]:
        if name not in self.files:
            folder = self.root / "data" / name
            folder.mkdir(parents=True)
            write = {".csv": write_csv, ".jsonl": write_jsonl}
            self.files[name] = {split: write[Path(file).suffix](folder / file, rows)
                                for split, (file, rows) in RUN_DATA[name]().items()}  # fmt: skip
        return self.files[name]

    def __call__(self, *settings: str, data: str = "text", recipe: bool = False) -> Path:
        """`recipe`: `recipe_text_args` (the default recipe's optimisation) instead of `tiny_text_args`."""
        key = (data, recipe, settings)
        if key not in self.runs:
            from finetune.run import main

            files = self.data(data)
            out = self.root / f"run-{len(self.runs)}"
            test = [f"test_file={files['test']}"] if "test" in files else []
            main((recipe_text_args if recipe else tiny_text_args)(files, out, *test, *settings))
            reset_accelerate()
            self.runs[key], self.hashes[key] = out, file_hashes(out)
        return self.runs[key]

    def copy(self, dest: Path, *settings: str, data: str = "text", recipe: bool = False) -> Path:
        """A private copy of the run, at `dest`, for a test to change."""
        return Path(shutil.copytree(self(*settings, data=data, recipe=recipe), dest))

    def check_untouched(self) -> None:
        changed = [str(out) for key, out in self.runs.items() if file_hashes(out) != self.hashes[key]]
        assert not changed, f"a test wrote into a shared finished run (copy it first): {changed}"


@pytest.fixture(scope="session")
def finished_run(tmp_path_factory) -> FinishedRuns:
    runs = FinishedRuns(tmp_path_factory.mktemp("finished-runs"))
    yield runs
    runs.check_untouched()


# Two epochs of the tiny BERT, evaluated and saved at each epoch's end: 10 logged steps, 2 evaluations,
# checkpoints at steps 5 and 10 (tests/test_plots.py, tests/test_card.py).
TWO_EPOCHS = ("num_train_epochs=2", "per_device_train_batch_size=8", "save_at_epoch_end=true")


@pytest.fixture(scope="module")
def two_epoch_run(finished_run, tmp_path_factory) -> tuple[Path, dict]:
    """The module's own copy of the TWO_EPOCHS run (its tests redraw the curves and rewrite the card),
    and the run's results."""
    out = finished_run.copy(tmp_path_factory.mktemp("two-epochs") / "run", *TWO_EPOCHS)
    return out, json.loads((out / "results.json").read_text())


@pytest.fixture
def multi_label_export(finished_run) -> Path:
    """A tiny multi-label export with thresholds tuned per label (3 steps: probabilities near 1/2, so the
    tuned thresholds, not 0.5, decide), under the default recipe's optimisation. The factory's: read it."""
    run = finished_run("label_column=labels", "max_steps=3", "tune_threshold=per_label", data="multi_label",
                       recipe=True)  # fmt: skip
    return run / "model"


def predicted_by_evaluate(export: Path, rows: list[dict], out: Path) -> list[str]:
    """The labels `finetune/evaluate_checkpoint.py --predictions` gives the one row of `rows` (into `out`)."""
    from finetune.evaluate_checkpoint import main as evaluate

    data = write_jsonl(out.with_suffix(".jsonl"), rows)
    evaluate([str(export), "--data", str(data), "--output", str(out), "--predictions"])
    (line,) = (out / "predictions.jsonl").read_text().splitlines()
    return sorted(json.loads(line)["predictions"])
