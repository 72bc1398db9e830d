"""The checkpoint format: save, find the latest complete one, load.

    <output_dir>/checkpoints/step-00000120/
        model.safetensors, optimizer.bin, scheduler.bin, random_states_<rank>.pkl   (Accelerate)
        manifest.json    step, epoch, samples consumed in the epoch, seed, world size, accumulation,
                         precision, label names, metrics, versions, the resolved config
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

import errno
import json
import math
import os
import platform
import re
import shutil
import zipfile
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open

from finetune.errors import (
    EXIT_DIVERGED,
    PeerFailed,
    TrainingStopped,
    UserError,
    first_line,
    remedy,
    write_failure,
)
from finetune import checks
from finetune.rundir import CHECKPOINTS, COMPLETE, MANIFEST, PREFIX, RunDir, as_umask_allows, step_of
from finetune.runtime import agreed

# What a resume reads from a manifest, all counts.
MANIFEST_COUNTS = ("step", "epoch", "samples_in_epoch", "world_size", "gradient_accumulation_steps",
                   "per_device_train_batch_size")  # fmt: skip
ANOTHER = "use another checkpoint (resume_from_checkpoint=latest skips damaged ones)"


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
    if not fsdp and not (path / "model.safetensors").is_file():
        raise UserError(
            f"{path} has no model.safetensors; resume only from checkpoints written by finetune.run"
        )
    rng = path / f"random_states_{accelerator.process_index}.pkl"
    if not rng.is_file() and exact:
        raise UserError(
            f"{path} has no {rng.name}: it was saved by fewer processes; resume with the same "
            "number of processes"
        )
    try:
        if rng.is_file():
            accelerate_load(rng, weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, EOFError, OSError) as e:
        raise UserError(
            f"{rng} does not load as plain data ({first_line(e)}): it is damaged or "
            "holds code; resume only from checkpoints written by finetune.run"
        ) from None
    try:
        accelerator.load_state(str(path), load_kwargs={"weights_only": True})
    except (pickle.UnpicklingError, EOFError, SafetensorError, OSError) as e:
        raise UserError(
            f"{path} does not load as plain data ({first_line(e)}): it is damaged or "
            "holds code; resume only from checkpoints written by finetune.run"
        ) from None
    except (RuntimeError, KeyError, ValueError) as e:  # shapes, parameter groups, missing keys
        if "Error(s) in loading state_dict" in str(e):
            raise UserError(
                f"{path / 'model.safetensors'} holds weights that do not fit the model this run builds "
                f"({_state_dict_mismatch(str(e))}): resume with the model and settings that saved it, or, if that "
                f"file was replaced, {ANOTHER}"
            ) from None
        raise UserError(
            f"{path} does not fit this model or optimizer: {first_line(e)}; resume with "
            "the model and settings that saved it"
        ) from None


def _state_dict_mismatch(message: str) -> str:
    """torch's (or safetensors') load_state_dict error, one clause per kind: its first key and how many."""
    said = []
    for kind in ("Missing key(s)", "Unexpected key(s)"):
        found = re.search(rf"{re.escape(kind)} in state_dict: ([^\n]*)", message)
        if found:
            keys = re.findall(r'"([^"]+)"', found.group(1))
            if keys:
                said.append(f"{kind.split()[0].lower()} {len(keys)}, e.g. {keys[0]}")
    sizes = re.findall(r"size mismatch for ([^:]+):", message)
    if sizes:
        said.append(f"{len(sizes)} of other shapes, e.g. {sizes[0]}")
    return "; ".join(said) or "other names or shapes"


def is_complete(path: Path) -> bool:
    return (path / COMPLETE).is_file() and (path / MANIFEST).is_file()


def list_checkpoints(output_dir: str | Path) -> list[Path]:
    """Complete checkpoints, oldest first."""
    root = Path(output_dir) / CHECKPOINTS
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if step_of(p) is not None and p.is_dir() and is_complete(p)]
    return sorted(found, key=step_of)


def read_manifest(path: str | Path) -> dict[str, Any]:
    file = Path(path) / MANIFEST
    try:
        manifest = json.loads(file.read_text())
    except (OSError, ValueError) as e:
        raise UserError(f"{file} is unreadable ({first_line(e)}); {ANOTHER}") from None
    if not isinstance(manifest, dict):
        raise UserError(
            f"{file} is not a manifest written by finetune.run (it holds a {type(manifest).__name__}); {ANOTHER}"
        )
    # How the state was saved (older manifests do not say): FSDP's sharded files, or whole.
    manifest.setdefault("state", "sharded" if any(Path(path).glob("pytorch_model_fsdp_*")) else "whole")
    for key in MANIFEST_COUNTS:
        if key not in manifest:
            raise UserError(f"{file} lacks '{key}': it is damaged or not written by finetune.run; {ANOTHER}")
        value = manifest[key]
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise UserError(f"{file} holds {key}={value!r}, not a count: it is damaged; {ANOTHER}")
    _labels_agree_with_the_run(Path(path), manifest.get("label_names"))
    named = re.fullmatch(rf"{PREFIX}(\d+)", Path(path).name)  # step-00000002 holds step 2's state
    if named and int(named.group(1)) != manifest["step"]:
        raise UserError(
            f"{file} says step {manifest['step']}, but its folder is {Path(path).name}: the manifest was edited or "
            f"copied from another checkpoint; {ANOTHER}"
        )
    return manifest


def _labels_agree_with_the_run(path: Path, labels: Any) -> None:
    """A checkpoint's label_names against its run's (the weights hold no names, so an edited list would
    swap every prediction's name): the run's results.json, else the names most of the run's checkpoints
    hold, when more than half of them agree."""
    run = path.parent.parent if path.parent.name == CHECKPOINTS else None
    if run is None or labels is None:
        return

    def names(file: Path) -> Any:
        try:
            return json.loads(file.read_text()).get("label_names")
        except (OSError, ValueError, AttributeError):
            return None

    results = RunDir(run).results
    authority, source = names(results), results
    if authority is None:
        others = [names(p / MANIFEST) for p in path.parent.glob(f"{PREFIX}*") if p != path]
        lists = [json.dumps(n) for n in others if n is not None]
        common = max(set(lists), key=lists.count, default=None)
        if common is None or lists.count(common) * 2 <= len(lists) + 1:  # no majority of all the run's
            return
        authority, source = json.loads(common), f"{lists.count(common)} other checkpoints of the run"
    if authority != labels:
        raise UserError(
            f"{path / MANIFEST} names the labels {labels[:5]}, but {source} names {authority[:5]}: the manifest was "
            f"edited or copied from another run; {ANOTHER}"
        )


def checkpoint_problem(path: Path) -> str | None:
    """What keeps a checkpoint from loading, naming the file, or None. Cheap: it reads the manifest, the
    safetensors header (which must cover the whole file) and the end of each torch file (a zip archive,
    whose directory is its last bytes: a cut-off or empty file has none), not the tensors."""
    if not (path / COMPLETE).is_file():
        return f"{path} has no {COMPLETE} marker: it was interrupted while saving"
    try:
        manifest = read_manifest(path)
    except UserError as e:
        return str(e).removesuffix(f"; {ANOTHER}")
    sharded = any(path.glob("pytorch_model_fsdp_*"))  # FSDP: weights and optimizer in their own format
    files = [path / "scheduler.bin"]
    if not sharded:
        weights = path / "model.safetensors"
        if not weights.is_file():
            return f"{weights} is {'a folder, not a file' if weights.exists() else 'missing'}"
        try:
            with safe_open(str(weights), framework="pt"):
                pass
        except (SafetensorError, OSError) as e:
            return f"{weights} is damaged ({first_line(e)})"
        files.append(path / "optimizer.bin")
    files += [path / f"random_states_{i}.pkl" for i in range(manifest["world_size"])]
    for file in files:
        if not file.is_file():
            return f"{file} is {'a folder, not a file' if file.exists() else 'missing'}"
        if not zipfile.is_zipfile(file):
            return f"{file} is damaged (cut off or empty: not a whole torch file)"
    return None


def resolve_checkpoint(spec: str, output_dir: str | Path, said: checks.Said | None = None) -> Path:
    """`latest` → the newest checkpoint of this run that loads, saying which newer ones it skipped;
    otherwise a checkpoint directory, which must load."""
    if spec == "latest":
        root = Path(output_dir) / CHECKPOINTS
        marked = [p for p in root.glob(f"{PREFIX}*") if step_of(p) is not None and p.is_dir() and (p / COMPLETE).is_file()]
        if not marked:
            from finetune.rundir import RunDir, set_aside_note

            held = RunDir(output_dir).holds_run()  # a run without checkpoints: leaving the resume out is refused too
            again = (f"to start again there, pass overwrite_output_dir=true instead ({output_dir} holds {held} without "
                     "a checkpoint: it is set aside, and deleted once the new run finishes)" if held else
                     "to start a new run there, leave resume_from_checkpoint out")
            raise UserError(f"resume_from_checkpoint=latest: no complete checkpoint in {root}; {again} (or give the "
                            "output_dir of the run to continue)" + set_aside_note(RunDir(output_dir)))
        named = re.compile(rf"(\.tmp-|\.old-)?{PREFIX}\d+")  # a checkpoint's, or one being saved or replaced
        renamed = sorted(p for p in root.iterdir() if p.is_dir() and (p / MANIFEST).is_file()
                         and not named.fullmatch(p.name))  # fmt: skip
        problems = [(p, f"it is not named {PREFIX}<step> (renamed?); to resume from it, give its path") for p in renamed]
        newest = max(map(step_of, marked))
        problems += [(p, f"it has no {COMPLETE} marker (a save cut short): the run saves that step again")
                     for p in sorted(root.glob(f"{PREFIX}*")) if p.is_dir() and (step_of(p) or 0) > newest
                     and not (p / COMPLETE).is_file()]  # fmt: skip
        for path in sorted(marked, key=step_of, reverse=True):
            problem = checkpoint_problem(path)
            if problem is None:
                for skipped, why in problems:
                    (said or checks.Said()).warn(f"resume_from_checkpoint=latest skipped {skipped}: {why}")
                return path
            problems.append((path, problem))
        raise UserError(
            f"resume_from_checkpoint=latest: no checkpoint in {root} loads ({'; '.join(w for _, w in problems)}); "
            "start again without resume_from_checkpoint, or repair one"
        )
    path = Path(spec)
    if path.is_file():
        raise UserError(f"resume_from_checkpoint={spec} is a file, not a checkpoint folder; give "
                        f"<run>/checkpoints/{PREFIX}<step>, or resume_from_checkpoint=latest with the run's output_dir")
    if not path.is_dir():
        hint = ""
        if spec.strip().lower() in ("latest", "last", "newest", "last-checkpoint"):
            hint = "; the newest checkpoint is resume_from_checkpoint=latest (lower case)"
        elif trainers := re.fullmatch(r"(?:.*/)?checkpoint-(\d+)/?", spec.strip()):
            hint = (f"; a run's checkpoints are <output_dir>/checkpoints/{PREFIX}<step, 8 digits> (Trainer's "
                    f"checkpoint-N): resume_from_checkpoint=<output_dir>/checkpoints/{PREFIX}{int(trainers[1]):08d}, "
                    "or latest")  # fmt: skip
        elif ours := re.fullmatch(rf"(?:.*/)?{PREFIX}(\d+)/?", spec.strip()):
            hint = (f"; a run's checkpoints are <output_dir>/checkpoints/{PREFIX}<step, 8 digits>: give the path, "
                    f"resume_from_checkpoint=<output_dir>/checkpoints/{PREFIX}{int(ours[1]):08d}, or latest")
        raise UserError(f"checkpoint not found: {spec}{hint}")
    from finetune.rundir import RunDir, kind_of

    kind = kind_of(path)
    if kind == "export":
        raise UserError(
            f"{spec} is an exported model, not a training-state checkpoint: resume from "
            "resume_from_checkpoint=latest (or <run>/checkpoints/step-N), or start a new run from its weights "
            f"with model_name_or_path={spec}"
        )
    if kind == "run":
        raise UserError(
            f"{spec} is a run directory; resume it with resume_from_checkpoint=latest output_dir={spec}, or name "
            f"one of {RunDir(path).checkpoints}/{PREFIX}N"
        )
    if path.name == CHECKPOINTS and any(p.is_dir() and (p / COMPLETE).is_file() for p in path.glob(f"{PREFIX}*")):
        raise UserError(f"{spec} is a run's checkpoints folder; name one of its {PREFIX}N folders, or resume the run "
                        f"with resume_from_checkpoint=latest output_dir={path.parent}")
    if not (path / COMPLETE).is_file():
        raise UserError(
            f"{spec} is not a complete checkpoint (no {COMPLETE} marker); "
            "it was probably interrupted while saving — use an earlier one or 'latest'"
        )
    problem = checkpoint_problem(path)
    if problem is not None:
        raise UserError(f"cannot resume from {path}: {problem}; {ANOTHER}")
    return path


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

    def __init__(self, accelerator, cfg, output_dir: Path, label_names: list[str], train_samples: int,
                 command: str | None = None, train_data: dict[str, str] | None = None,
                 said: checks.Said | None = None):  # fmt: skip
        self.accelerator, self.cfg, self.out, self.label_names = accelerator, cfg, output_dir, label_names
        self.train_samples, self.command = train_samples, command  # the run's first launch command
        self.train_data = train_data  # finetune.data.train_data_fingerprint
        self.best: dict[str, Any] = {}
        self.last: Path | None = None
        self.resumed_with: list[dict[str, Any]] = []  # the settings each resume changed (resume_changes)
        self.said = said if said is not None else checks.Said()

    def resumed_from(self, path: Path, manifest: dict[str, Any], say) -> None:
        """A resume from `path`: its best and history carried on, and the settings this resume changes said
        in one line and added to the history, which every later manifest and results.json hold."""
        self.best, self.last = dict(manifest.get("best") or {}), path
        if self.best.get("step") is not None:  # by its step in this run's folder: a copied or moved run's own
            here = self.out / CHECKPOINTS / f"{PREFIX}{self.best['step']:08d}"
            if is_complete(here):
                self.best["path"] = str(here)
            else:  # deleted by hand, or a copy made without it: the best is chosen again from here on
                self.said.warn(f"the best checkpoint so far (step {self.best['step']}, validation {self.best.get('metric')} "
                     f"{self.best.get('value')}) is not in {self.out / CHECKPOINTS}; the best is chosen again among "
                     "the checkpoints this run saves from here on")  # fmt: skip
                self.best = {}
        self.resumed_with = list(manifest.get("resumed_with") or [])
        changed = resume_changes(manifest, self.cfg)
        if changed:
            self.resumed_with.append({"step": manifest["step"], "changed": changed})
            say("resumed with changed settings: " + ", ".join(
                f"{key} {_shown(old)} -> {_shown(new)}" for key, (old, new) in changed.items()))  # fmt: skip

    def save(self, model, step: int, epoch: int, samples_in_epoch: int, metrics: dict | None = None) -> Path:
        cfg, accelerator = self.cfg, self.accelerator
        if self.last is not None and self.last.name == f"{PREFIX}{step:08d}":
            return self.last  # saved at this step already
        if not all_finite(model, accelerator):  # NaN weights never recover: keep the last good checkpoint
            raise diverged("the weights became NaN or infinite", step, self.last)
        value = (metrics or {}).get(cfg.metric_for_best_model)
        best = self.best
        if isinstance(value, (int, float)) and (
            not best or (value > best["value"] if cfg.greater_is_better else value < best["value"])
        ):
            self.best = {
                "metric": cfg.metric_for_best_model,
                "value": value,
                "step": step,
                "path": str(self.out / CHECKPOINTS / f"{PREFIX}{step:08d}"),
            }
        manifest = {
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
            "label_names": self.label_names,
            "metrics": metrics or {},
            "best": self.best,
            "resumed_with": self.resumed_with,
            "versions": package_versions(),
            "config": cfg.to_dict(),
        }
        try:
            path = save_checkpoint(accelerator, self.out, step, manifest)
        except OSError as e:
            file = f" ({e.filename})" if e.filename else ""
            if self.last and e.errno in (errno.EROFS, errno.EIO):  # this output_dir is no place to go on in
                kept = (f"the last checkpoint, {self.last}, is intact; {remedy(e.errno)}, then continue from it "
                        f"there: resume_from_checkpoint={self.last} output_dir=<the other folder>")  # fmt: skip
            elif self.last:
                kept = f"the last checkpoint, {self.last}, is intact; {remedy(e.errno)}, then continue with " \
                       "resume_from_checkpoint=latest"  # fmt: skip
            else:
                kept = f"no checkpoint was saved before; {remedy(e.errno)}, and run again"
            raise UserError(
                f"could not save the checkpoint of step {step}: {e.strerror or first_line(e)}{file}; the "
                f"partial save was removed and {kept}",
                local=True,
            ) from None
        self.last = path
        if accelerator.is_main_process:
            best_path = Path(self.best["path"]) if self.best.get("path") else None
            prune_checkpoints(self.out, cfg.save_total_limit, best_path)
        accelerator.print(f"saved checkpoint {path}")
        return path


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
# columns, max_length, the tokenizer or image processor, the held-out share, the image augmentation), the model built from a config
# (model_config), the weights that train (freezing, LoRA), the loss and labels (task, problem type,
# subword labels, label smoothing, class weights) and what "best" means. A resume keeps them all; one
# that differs is named, with the checkpoint's value.
# The topology (processes, batch, accumulation) may change only with resume_allow_topology_change.
FIXED_ON_RESUME = ("task", "problem_type", "model_config", "seed", "group_by_length", "freeze_embeddings",
                   "freeze_layers", "peft", "label_all_tokens", "max_length", "text_column", "text_pair_column",
                   "image_column", "tokens_column", "tags_column", "label_column", "label_columns",
                   "validation_split_percentage", "random_flip", "augment", "label_smoothing", "class_weights",
                   "metric_for_best_model", "greater_is_better", "tokenizer_name", "image_processor_name")  # fmt: skip
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
    if manifest is None or manifest["step"] <= total_steps:
        return
    plan = f"max_steps={cfg.max_steps}" if cfg.max_steps else f"num_train_epochs={cfg.num_train_epochs:g}"
    raise UserError(
        f"the checkpoint is at optimizer step {manifest['step']}, past the {total_steps} steps of this run ({plan}); "
        f"resume with max_steps={manifest['step']} or more (or more num_train_epochs), or evaluate the checkpoint "
        f"as it is: finetune/evaluate_checkpoint.py {path}"
    )


def apply_optimizer_settings(optimizer, cfg) -> None:
    """A restored optimizer holds the checkpoint's weight decay, betas and epsilon (torch's load_state_dict
    takes the saved param groups' values): this run's settings replace them (unchanged: the same values).
    The groups are run.make_optimizer's: [decayed weights, biases and LayerNorm (no decay)]."""
    for i, group in enumerate(optimizer.param_groups):
        group["weight_decay"] = cfg.weight_decay if i == 0 else 0.0
        group["betas"], group["eps"] = (cfg.adam_beta1, cfg.adam_beta2), cfg.adam_epsilon


def _shown(value: Any) -> str:
    if value is None:
        return "null"
    return json.dumps(value) if isinstance(value, (dict, list)) else str(value).lower() if isinstance(value, bool) else str(value)


def check_resume_compatible(
    manifest: dict[str, Any], cfg, num_processes: int, label_names: list[str], train_samples: int, fsdp: bool,
    train_data: dict[str, str] | None = None,
) -> bool:
    """A resumed run must be the run that saved the checkpoint (FIXED_ON_RESUME, the labels, the training
    data's bytes and number of samples, how the state was saved) and split the data the same way;
    returns whether the topology changed (allowed only with resume_allow_topology_change)."""
    # The manifest's own top-level task and seed (written since the first version) over its config copy.
    saved_config = {**(manifest.get("config") or {}), **{k: manifest[k] for k in ("task", "seed") if k in manifest}}
    for key in FIXED_ON_RESUME:
        saved, now = saved_config.get(key), getattr(cfg, key)
        if key not in saved_config:  # a manifest of an older version: the setting's default then
            continue
        if key == "problem_type" and saved is None:
            saved = "single_label_classification"
        if key in ("tokenizer_name", "image_processor_name") and saved and now and Path(saved).is_dir() \
                and Path(now).is_dir() and Path(saved).resolve() == Path(now).resolve():
            continue  # one folder, by another path (relative, absolute)
        if saved != now and isinstance(saved, dict) and isinstance(now, dict):  # model_config, peft: the sub-key
            sub = next(k for k in sorted({*saved, *now}, key=str) if saved.get(k) != now.get(k))
            key, saved, now = f"{key}.{sub}", saved.get(sub), now.get(sub)
        if saved != now:
            raise UserError(
                f"the checkpoint was trained with {key}={_shown(saved)}, this run has {key}={_shown(now)}; resume with "
                f"{key}={_shown(saved)}, or start a new run without resume_from_checkpoint"
            )
    if manifest.get("label_names") != label_names:
        raise UserError(
            f"the checkpoint was trained on the labels {manifest.get('label_names')}, this run's data has "
            f"{label_names}; resume it with its own data, or set label_names to match"
        )
    saved_data = manifest.get("train_data")
    if isinstance(saved_data, dict) and train_data and set(saved_data) == set(train_data) and saved_data != train_data:
        where = cfg.train_file if "train_file" in train_data else f"the image files under {cfg.data_dir}"
        raise UserError(
            f"the training data changed since the checkpoint was saved ({where} differs from the bytes it "
            "trained on); resume with the data it was trained on, or start a new run without resume_from_checkpoint"
        )
    if manifest.get("train_samples") not in (None, train_samples):
        was = (manifest.get("config") or {}).get("validation_file")
        why = ("another max_train_samples, or other training data" if was == cfg.validation_file else
               f"the run had validation_file={was or 'null'}, this run has {cfg.validation_file or 'null'}: a run without "
               "one holds out a share of the training data")
        raise UserError(
            f"the checkpoint's run trained on {manifest['train_samples']} samples an epoch, this run has {train_samples} "
            f"({why}); resume with the run's own data and settings"
        )
    sharded = manifest.get("state") == "sharded"
    if sharded != fsdp:
        how = f"sharded by FSDP over {manifest['world_size']} processes" if sharded else "whole (one process or DDP)"
        config = "the FSDP accelerate config (accelerate_configs/fsdp.yaml)" if sharded else "a non-FSDP accelerate config"
        raise UserError(
            f"the checkpoint holds its state {how}; this run {'uses FSDP' if fsdp else 'does not use FSDP'}: resume it "
            f"with {config} and {manifest['world_size']} process(es), or start a new run"
        )
    saved = (
        manifest["world_size"],
        manifest["gradient_accumulation_steps"],
        manifest["per_device_train_batch_size"],
    )
    now = (num_processes, cfg.gradient_accumulation_steps, cfg.per_device_train_batch_size)
    if saved != now and (not cfg.resume_allow_topology_change or sharded):
        allow = "" if sharded else (
            ", or pass resume_allow_topology_change=true to continue without repeating consumed samples"
        )
        raise UserError(
            f"the checkpoint was saved with processes x batch x accumulation = {saved[0]} x {saved[2]} x "
            f"{saved[1]}, this run has {now[0]} x {now[2]} x {now[1]}; resume with the same settings{allow}"
        )
    return saved != now
