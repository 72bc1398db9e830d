"""The checkpoint format: save, find the latest complete one, load.

    <output_dir>/checkpoints/step-00000120/
        model.safetensors, optimizer.bin, scheduler.bin, random_states_<rank>.pkl   (Accelerate)
        manifest.json    step, epoch, samples consumed in the epoch, seed, world size, accumulation,
                         precision, label names, metrics, versions, the resolved config; a streamed
                         run's position in its stream (finetune/streams.py), each process's
        COMPLETE         written last; a directory without it is ignored

A checkpoint is written into a hidden temporary directory, flushed to disk, marked complete and
only then renamed into place, so a process killed in the middle of a save leaves the previous
checkpoint as "latest" and loadable; a save that fails (a full disk) removes its temporary directory.
Pruning removes the COMPLETE marker first, so a kill during a deletion never leaves a half-deleted
directory that looks complete. Before a resume, `checkpoint_problem` looks for damage without reading
the tensors (manifest, safetensors header, the end of each torch file): `latest` skips a damaged
checkpoint for the newest one that loads and says so; a checkpoint named by path is refused in one
line naming the damaged file.

Trust: a checkpoint is code-free to load. The weights are safetensors; optimizer.bin,
scheduler.bin and random_states_<rank>.pkl are torch pickles, which Accelerate's `load_state` reads
with `torch.load(weights_only=True)` (tensors, numbers, numpy RNG arrays — no arbitrary objects).
`load_checkpoint` asks for that explicitly and refuses a checkpoint whose files need more, so a
checkpoint from elsewhere cannot run code through pickle. One exception: under FSDP with
SHARDED_STATE_DICT, Accelerate saves the weights with torch.distributed.checkpoint, whose `.metadata`
file torch reads with plain pickle — resume those only from storage you trust.
"""

from __future__ import annotations

import json
import math
import os
import platform
import shutil
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError

from finetune import checks
from finetune.checks import Rule, runs
from finetune.errors import EXIT_DIVERGED, PeerFailed, TrainingStopped, write_failure
from finetune.layout import (
    CHECKPOINTS,
    COMPLETE,
    MANIFEST,
    PREFIX,
    as_umask_allows,
    is_complete,
    list_checkpoints,
)
from finetune.runtime import agreed


def package_versions() -> dict[str, str]:
    import accelerate
    import datasets
    import torch
    import transformers

    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "accelerate": accelerate.__version__,
        "transformers": transformers.__version__,
        "datasets": datasets.__version__,
    }


def _fsync_tree(path: Path) -> None:
    for root, _, files in os.walk(path):
        for name in files:
            with open(os.path.join(root, name), "rb") as f:
                os.fsync(f.fileno())
    _fsync_dir(path)


def fsync_tree(path: Path) -> None:
    """Flush every file under `path`, and the folder, to disk: where a failing disk (EIO) or a network
    file system's quota (EDQUOT) shows, before anything is marked whole (the export uses it too)."""
    _fsync_tree(path)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def save_checkpoint(accelerator, output_dir: str | Path, step: int, manifest: dict[str, Any]) -> Path:
    """Save the full training state at optimizer step `step`, atomically. All processes call this."""
    root = Path(output_dir) / CHECKPOINTS
    final = root / f"{PREFIX}{step:08d}"
    tmp = root / f".tmp-{PREFIX}{step:08d}"
    old = root / f".old-{PREFIX}{step:08d}"
    # `agreed`: a process that fails (its disk is full) says so; the others end quietly, not at a barrier.
    with agreed(accelerator):
        if accelerator.is_main_process:
            root.mkdir(parents=True, exist_ok=True)
            shutil.rmtree(tmp, ignore_errors=True)
    try:
        with agreed(accelerator):
            accelerator.save_state(str(tmp))  # each process writes its own RNG state
        with agreed(accelerator):
            if accelerator.is_main_process:
                as_umask_allows(tmp)
                # What the checkpoint holds, so that a file put in it later is known as not its own (rundir.py)
                manifest = {**manifest, "files": sorted({*(p.name for p in tmp.iterdir()), MANIFEST, COMPLETE})}
                (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2, default=str))
                _fsync_tree(tmp)
                (tmp / COMPLETE).write_text(str(step))
                _fsync_tree(tmp)
                if final.exists():  # re-saving a step (a resumed run): swap, never leave a gap
                    shutil.rmtree(old, ignore_errors=True)
                    os.replace(final, old)
                    os.replace(tmp, final)
                    shutil.rmtree(old, ignore_errors=True)
                else:
                    os.replace(tmp, final)
                _fsync_dir(root)
    except Exception as e:  # a full disk, a quota: the half-written save goes, the checkpoints stay
        failure = None if isinstance(e, PeerFailed) else write_failure(e, tmp)
        if failure is None and not isinstance(e, PeerFailed):
            raise
        if accelerator.is_main_process:
            shutil.rmtree(tmp, ignore_errors=True)
            if old.exists() and not final.exists():
                os.replace(old, final)
        if failure is not None:
            raise failure from None
        raise
    return final


def load_checkpoint(accelerator, path: Path, exact: bool = True) -> None:
    """Restore weights, optimizer, scheduler and this process's RNG from `path`, pickles weights-only.

    Accelerate swallows a failure to read the RNG file (it logs "Could not load random states" at
    info level and goes on), which would make a resume silently inexact: that file is read here first.
    With `exact=False` (a resume onto another topology) a process with no RNG file of its own is fine.
    """
    import pickle

    from accelerate.utils import DistributedType
    from accelerate.utils import load as accelerate_load  # torch.load, weights_only, numpy RNG allowed

    fsdp = accelerator.distributed_type == DistributedType.FSDP  # sharded weights, in their own format
    rng = path / f"random_states_{accelerator.process_index}.pkl"
    checks.gate(runs.LOAD, path, rng, fsdp, exact)
    try:
        if rng.is_file():
            accelerate_load(rng, weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, EOFError, OSError) as e:
        raise checks.explain(runs.RNG_FAILED, rng, e) from None
    try:
        accelerator.load_state(str(path), load_kwargs={"weights_only": True})
    except (pickle.UnpicklingError, EOFError, SafetensorError, OSError, RuntimeError, KeyError, ValueError) as e:
        # not plain data (damaged, or a pickle with code); weights of other shapes; other parameter groups
        raise checks.explain(runs.LOAD_FAILED, path, e) from None


def read_manifest(path: str | Path) -> dict[str, Any]:
    """A checkpoint's manifest.json, refused when damaged (finetune/checks/runs.py, `MANIFEST`)."""
    checkpoint = runs.Checkpoint(path)
    found = checks.first(runs.MANIFEST, checkpoint)
    if found is not None:
        raise runs.damaged(found)
    manifest = checkpoint.manifest
    # How the state was saved (older manifests do not say): FSDP's sharded files, or whole.
    manifest.setdefault("state", "sharded" if checkpoint.sharded else "whole")
    return manifest


def checkpoint_damage(path: Path) -> tuple[Rule, str] | None:
    """What keeps a checkpoint from loading, naming the file, and the rule that found it; or None. Cheap: it
    reads the manifest, the safetensors header (which must cover the whole file) and the end of each torch
    file (a zip archive, whose directory is its last bytes: a cut-off or empty file has none), not the
    tensors (finetune/checks/runs.py, `PROBLEMS`)."""
    return checks.first(runs.PROBLEMS, runs.Checkpoint(path))


def checkpoint_problem(path: Path) -> str | None:
    """`checkpoint_damage`'s line alone."""
    found = checkpoint_damage(path)
    return found[1] if found is not None else None


def resolve_checkpoint(spec: str, output_dir: str | Path, said: checks.Said | None = None) -> Path:
    """`latest` → the newest checkpoint of this run that loads, saying which newer ones it skipped;
    otherwise a checkpoint directory, which must load."""
    if spec == "latest":
        return _latest(output_dir, said if said is not None else checks.Said())
    path = Path(spec)
    checks.gate(runs.NAMED, spec, path)  # a file, not there, an export, a run, a run's checkpoints/, incomplete
    found = checkpoint_damage(path)
    if found is not None:
        raise runs.damaged(found, path)
    return path


def _latest(output_dir: str | Path, said: checks.Said) -> Path:
    """The newest complete checkpoint of the run in `output_dir` that loads; the newer ones it passed over
    are said (renamed, cut short, damaged), or, when none loads, each one's damage is the refusal."""
    latest = runs.Latest.find(output_dir)
    checks.gate(runs.LATEST, latest)
    for path in latest.marked:
        problem = checkpoint_problem(path)
        if problem is None:
            for skipped, why in latest.skipped:
                checks.gate(runs.SKIPPED, skipped, why, said=said)
            return path
        latest.skipped.append((path, problem))
    raise checks.explain(runs.NONE_LOADS, latest)


def prune_checkpoints(output_dir: str | Path, keep_last: int | None, best: Path | None) -> list[Path]:
    """Delete all but the last `keep_last` complete checkpoints; never the best nor the latest."""
    found = list_checkpoints(output_dir)
    if keep_last is None or len(found) <= keep_last:
        return []
    keep = set(found[-keep_last:]) | {found[-1]}
    if best is not None:
        keep.add(best)
    removed = [p for p in found if p not in keep]
    for p in removed:
        (p / COMPLETE).unlink(missing_ok=True)  # first: a half-deleted directory is never "complete"
        shutil.rmtree(p, ignore_errors=True)
    return removed


# --- during a run: which checkpoint is best, when the run must stop, whether a resume fits ----------


class Checkpointer:
    """Writes a run's checkpoints: the manifest, the best one by `metric_for_best_model`, retention.
    Remembers the last good checkpoint, which a run that must stop names."""

    def __init__(self, accelerator, cfg, output_dir: Path, labels, train_samples: int,
                 command: str | None = None, train_data: dict[str, str] | None = None,
                 said: checks.Said | None = None, stream=None):  # fmt: skip
        self.accelerator, self.cfg, self.out, self.labels = accelerator, cfg, output_dir, labels  # a Labels
        self.train_samples, self.command = train_samples, command  # the run's first launch command
        self.train_data = train_data  # finetune.data.train_data_fingerprint
        self.best: dict[str, Any] = {}
        self.last: Path | None = None
        self.resumed_with: list[dict[str, Any]] = []  # the settings each resume changed (resume_changes)
        self.said = said if said is not None else checks.Said()
        self.stream = stream  # a streamed run's training stream (finetune/streams.py): its position is saved

    def resumed_from(self, path: Path, manifest: dict[str, Any], say) -> None:
        """A resume from `path`: its best and history carried on, and the settings this resume changes said
        in one line and added to the history, which every later manifest and results.json hold."""
        self.best, self.last = dict(manifest.get("best") or {}), path
        if self.best.get("step") is not None:  # by its step in this run's folder: a copied or moved run's own
            here = self.out / CHECKPOINTS / f"{PREFIX}{self.best['step']:08d}"
            if is_complete(here):
                self.best["path"] = str(here)
            else:  # deleted by hand, or a copy made without it: the best is chosen again from here on
                checks.gate(runs.BEST, self.best, self.out / CHECKPOINTS, said=self.said)
                self.best = {}
        self.resumed_with = list(manifest.get("resumed_with") or [])
        if self.stream is not None:  # each process goes on from its position in the stream
            self.stream.restore(manifest.get("stream"))
        changed = resume_changes(manifest, self.cfg)
        if changed:
            self.resumed_with.append({"step": manifest["step"], "changed": changed})
            say("resumed with changed settings: " + ", ".join(
                f"{key} {runs.setting_value(old)} -> {runs.setting_value(new)}" for key, (old, new) in changed.items()))  # fmt: skip

    def save(self, model, step: int, epoch: int, samples_in_epoch: int, metrics: dict | None = None) -> Path:
        """The checkpoint of optimizer step `step` (once a step), then retention. All processes call it. A
        save that fails on the disk is one line, said by the process that met it (finetune/checks/runs.py,
        `SAVE_FAILED`); weights that became NaN stop the run, keeping the last good checkpoint."""
        accelerator = self.accelerator
        if self.last is not None and self.last.name == f"{PREFIX}{step:08d}":
            return self.last  # saved at this step already
        if not all_finite(model, accelerator):  # NaN weights never recover: keep the last good checkpoint
            raise diverged("the weights became NaN or infinite", step, self.last)
        self._judge(step, metrics)
        try:
            path = save_checkpoint(accelerator, self.out, step, self._manifest(step, epoch, samples_in_epoch, metrics))
        except OSError as e:
            raise checks.explain(runs.SAVE_FAILED, e, step, self.last) from None
        self.last = path
        if accelerator.is_main_process:
            best_path = Path(self.best["path"]) if self.best.get("path") else None
            prune_checkpoints(self.out, self.cfg.save_total_limit, best_path)
        accelerator.print(f"saved checkpoint {path}")
        return path

    def _judge(self, step: int, metrics: dict | None) -> None:
        """This step's checkpoint becomes the best if it was evaluated and beats the best so far."""
        cfg, best = self.cfg, self.best
        value = (metrics or {}).get(cfg.metric_for_best_model)
        if isinstance(value, (int, float)) and (
            not best or (value > best["value"] if cfg.greater_is_better else value < best["value"])
        ):
            self.best = {
                "metric": cfg.metric_for_best_model,
                "value": value,
                "step": step,
                "path": str(self.out / CHECKPOINTS / f"{PREFIX}{step:08d}"),
            }

    def _manifest(self, step: int, epoch: int, samples_in_epoch: int, metrics: dict | None) -> dict[str, Any]:
        """What the checkpoint says of itself: where the run is, how it ran, and the resolved config."""
        cfg, accelerator = self.cfg, self.accelerator
        return {
            "step": step,
            "epoch": epoch,
            "samples_in_epoch": samples_in_epoch,
            "seed": cfg.seed,
            "world_size": accelerator.num_processes,
            "gradient_accumulation_steps": cfg.gradient_accumulation_steps,
            "per_device_train_batch_size": cfg.per_device_train_batch_size,
            "mixed_precision": accelerator.mixed_precision,
            "distributed_type": str(accelerator.distributed_type.value),
            "state": "sharded" if sharded_state(accelerator) else "whole",
            "train_samples": self.train_samples,
            "train_data": self.train_data,
            "command": self.command,
            "task": cfg.task,
            **self.labels.manifest(),
            "metrics": metrics or {},
            "best": self.best,
            "resumed_with": self.resumed_with,
            "versions": package_versions(),
            "config": cfg.to_dict(),
            **({"stream": self.stream.state()} if self.stream is not None else {}),
        }


def sharded_state(accelerator) -> bool:
    """Whether this run's checkpoints hold the state in shards (FSDP with SHARDED_STATE_DICT)."""
    from accelerate.utils import DistributedType

    plugin = getattr(accelerator.state, "fsdp_plugin", None)
    return accelerator.distributed_type == DistributedType.FSDP and "SHARDED" in str(
        getattr(plugin, "state_dict_type", "")
    )


def all_finite(model, accelerator) -> bool:
    """Whether every parameter, on every process (FSDP shards differ), is finite. A host sync: saves only."""
    # FSDP: each process checks its own shard (a DTensor's local part).
    local = [p.to_local() if hasattr(p, "to_local") else p for p in model.parameters()]
    flags = torch.stack([p.detach().isfinite().all().to(accelerator.device) for p in local])
    return bool(accelerator.gather(flags.all().float().reshape(1)).min().item())


def diverged(why: str, step: int, last_checkpoint: Path | None) -> TrainingStopped:
    then = "then resume from that checkpoint or start again" if last_checkpoint else "then start again"
    kept = f"the last good checkpoint is {last_checkpoint}" if last_checkpoint else "no checkpoint was saved"
    return TrainingStopped(
        f"{why} (optimizer step {step}); {kept}; lower learning_rate or check the data, {then}", EXIT_DIVERGED
    )


def apply_learning_rate(optimizer, scheduler, manifest: dict[str, Any], learning_rate: float, say) -> None:
    """A resumed run's learning rate is this run's: another learning_rate (after a divergence: lower it,
    then resume) scales the restored schedule by new / saved, so warmup and decay keep their shape; and
    the optimizer's rate is set from the schedule at the resumed step, so a changed plan (a larger
    max_steps) applies from the first resumed step, not from the second (the checkpoint holds the old
    plan's rate, 0 at its end). Unchanged, both give back exactly the saved rates."""
    inner = getattr(scheduler, "scheduler", scheduler)  # Accelerate's wrapper
    stored = optimizer.param_groups[0]["lr"]  # the checkpoint's rate at its step, before any scaling
    saved = (manifest.get("config") or {}).get("learning_rate")
    if isinstance(saved, (int, float)) and saved > 0 and saved != learning_rate:
        ratio = learning_rate / saved
        inner.base_lrs = [lr * ratio for lr in inner.base_lrs]
        inner._last_lr = [lr * ratio for lr in inner.get_last_lr()]
        for group in optimizer.param_groups:
            group["lr"] *= ratio
            if "initial_lr" in group:
                group["initial_lr"] *= ratio
        say(f"learning_rate {saved:g} in the checkpoint, {learning_rate:g} from here: the schedule is scaled")
    lambdas = getattr(inner, "lr_lambdas", None)  # transformers' schedules are LambdaLR
    if lambdas is None:
        return
    planned = [base * fn(inner.last_epoch) for fn, base in zip(lambdas, inner.base_lrs, strict=True)]
    restored = [group["lr"] for group in optimizer.param_groups]
    if not all(math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-15) for a, b in zip(planned, restored, strict=True)):
        for group, lr in zip(optimizer.param_groups, planned, strict=True):
            group["lr"] = lr
        inner._last_lr = planned
        say(f"learning rate {stored:.3g} at the checkpoint's step, {planned[0]:.3g} from here on this run's schedule")


# What makes a run what it is: the data order (seed, grouping, the samples), what a sample is (its
# columns, max_length and the windows, the tokenizer or image processor and image size, the held-out share, the image augmentation), the model built from a config
# (model_config), the weights that train (freezing, LoRA), the loss and labels (task, problem type,
# subword labels, label smoothing, class weights) and what "best" means. A resume keeps them all; one
# that differs is named, with the checkpoint's value.
# The topology (processes, batch, accumulation) may change only with resume_allow_topology_change.
FIXED_ON_RESUME = ("task", "problem_type", "model_config", "seed", "group_by_length", "freeze_embeddings",
                   "freeze_layers", "peft", "label_all_tokens", "max_length", "text_column", "text_pair_column",
                   "image_column", "tokens_column", "tags_column", "label_column", "label_columns",
                   "validation_split_percentage", "random_flip", "augment", "label_smoothing", "class_weights",
                   "metric_for_best_model", "greater_is_better", "tokenizer_name", "image_processor_name",
                   "text_windows", "doc_stride", "image_size", "freeze_batchnorm", "streaming",
                   "stream_buffer")  # fmt: skip
# Settings that say where and how the processes run, not what is trained (or that are checked apart:
# label_names with the labels, the samples by their count): a resume changes them without a word.
# Any other setting may change on a resume (learning_rate, weight_decay, dropout, max_steps, the cadences
# ...): the resume says each change in one line, and the manifest's `resumed_with` (then results.json)
# keeps them, so that config.yaml, which holds the last values, is not read as the whole run's.
UNNOTED_ON_RESUME = ("resume_from_checkpoint", "resume_allow_topology_change", "overwrite_output_dir", "output_dir",
                     "log_level", "dataloader_num_workers", "dataloader_pin_memory", "ddp_timeout", "cpu_threads",
                     "push_to_hub_model_id", "report_to", "label_names", "model_parallel", "devices", "max_memory",
                     "pipeline_chunks")  # fmt: skip


def resume_changes(manifest: dict[str, Any], cfg) -> dict[str, list]:
    """The settings this resume changes that a resume may change: {name: [the checkpoint's, this run's]}."""
    saved, now = manifest.get("config") or {}, cfg.to_dict()
    skip = (*FIXED_ON_RESUME, *UNNOTED_ON_RESUME)
    return {key: [saved[key], value] for key, value in now.items()
            if key in saved and key not in skip and saved[key] != value}  # fmt: skip


def check_resume_fits(manifest: dict[str, Any] | None, path: Path | None, total_steps: int, cfg) -> None:
    """A resume starts at the checkpoint's step: a run planned shorter (a smaller max_steps or
    num_train_epochs) would export the checkpoint's weights under settings that say otherwise."""
    checks.gate(runs.PLAN, manifest, path, total_steps, cfg)


def apply_optimizer_settings(optimizer, cfg) -> None:
    """A restored optimizer holds the checkpoint's weight decay, betas and epsilon (torch's load_state_dict
    takes the saved param groups' values): this run's settings replace them (unchanged: the same values).
    The groups are run.make_optimizer's: [decayed weights, biases and LayerNorm (no decay)]."""
    for i, group in enumerate(optimizer.param_groups):
        group["weight_decay"] = cfg.weight_decay if i == 0 else 0.0
        group["betas"], group["eps"] = (cfg.adam_beta1, cfg.adam_beta2), cfg.adam_epsilon


def check_resume_compatible(
    manifest: dict[str, Any], cfg, num_processes: int, labels: list[str], train_samples: int, fsdp: bool,
    train_data: dict[str, str] | None = None,
) -> bool:
    """A resumed run must be the run that saved the checkpoint (FIXED_ON_RESUME, the labels, the training
    data's bytes and number of samples, how the state was saved) and split the data the same way;
    returns whether the topology changed (allowed only with resume_allow_topology_change). The rules:
    finetune/checks/runs.py, `RESUME`."""
    resume = runs.Resume(manifest, cfg, num_processes, labels, train_samples, fsdp, train_data, FIXED_ON_RESUME)
    checks.gate(runs.RESUME, resume)
    return resume.saved_topology != resume.topology
