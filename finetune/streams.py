"""A streamed run's training split (streaming=true): read, tokenized and batched as the run trains, never whole.

    accelerate launch finetune/run.py train_file=big.jsonl validation_file=dev.jsonl streaming=true max_steps=2000

`TrainStream` is the loop's training loader and its sampler at once (finetune/run.py's `setup`). What it reads is
`data.open_stream`'s: train_file (csv, tsv, json, jsonl, parquet) or the hub's train split as datasets'
`IterableDataset`, its first max_train_samples (`take`). Under DDP each process reads its own share,
`datasets.distributed.split_dataset_by_node` (every world-th sample, or whole shards where they divide among
the processes): no sample is read by two processes, none is left out.

The run is max_steps optimizer steps of exactly one global batch each. A pass over the data (a streamed run's
epoch) does not end a step: when a process's share ends, its next pass begins, so every step holds processes x
batch x accumulation real samples and its loss is that one big batch's (`steps.step_loss` over a full window;
the loop's one epoch is `STREAM_SAMPLES` long, which max_steps ends first). A process reads its share in blocks
of stream_buffer samples, each tokenized at once (the task's `tokenize`) and ordered by a seed of (seed, pass,
block, process): shuffled, and with group_by_length sorted by length into batches whose order is shuffled (the
epoch sampler's grouping, inside a block); stream_buffer=0 keeps the data's order.

A checkpoint's manifest records each process's position (`stream`): the pass, the block, datasets' own
`state_dict()` of the stream at the block's start, and the samples of the block trained on. A resume loads that
state (datasets reads on from there: a file's earlier rows are skipped as Arrow tables, not tokenized), reads the
block again, orders it by the same seed and skips what was trained: it goes on exactly where the run stopped.
"""

from __future__ import annotations

import functools
import itertools
import math
import os
import random
import re
from datetime import timedelta

import torch
from accelerate.utils import gather_object, send_to_device
from datasets import ClassLabel, DatasetDict
from datasets import Dataset as HFDataset
from datasets.distributed import split_dataset_by_node

from finetune import checks, data
from finetune.checks import columns
from finetune.checks import labels as label_rules
from finetune.checks import streams as rules
from finetune.errors import PeerFailed, UserError
from finetune.problems import Labels, problem_of
from finetune.tasks import task_of

STREAM_SAMPLES = 10**15  # the loop's one epoch of a streamed run, in samples: max_steps ends the run long before


def samples_of(cfg, train) -> int:
    """Training samples an epoch as the step plan counts them: a streamed run's one unbounded epoch."""
    return STREAM_SAMPLES if cfg.streaming else len(train)


def _stamp(path: str | None) -> tuple[int, int] | None:
    """A training file's size and modification time (ns), or None for data of the hub or a file gone."""
    try:
        stat = os.stat(path) if path else None
    except OSError:
        return None
    return (stat.st_size, stat.st_mtime_ns) if stat else None


class TrainStream:
    """This process's batches of a streamed training split, and the sampler interface the loop asks
    (`reset`, `weights`, `num_samples`); its position is what a checkpoint records (`state`, `restore`)."""

    def __init__(self, cfg, accelerator, preprocessor, names: Labels):
        self.args, self.task, self.problem = cfg.data_args, task_of(cfg.task), problem_of(cfg.problem_type)
        self.preprocessor, self.names, self.given = preprocessor, names, Labels.given(cfg) or None
        self.rank, self.world, self.device = accelerator.process_index, accelerator.num_processes, accelerator.device
        self.batch, self.seed, self.group = cfg.per_device_train_batch_size, cfg.seed, cfg.group_by_length
        self.steps, self.accumulation = cfg.max_steps, cfg.gradient_accumulation_steps
        self.shuffle = cfg.stream_buffer > 0
        self.block_size = math.ceil(max(cfg.stream_buffer, 1) / self.batch) * self.batch  # whole batches
        self.collate = self.task.collator(preprocessor, cfg.pad_to_multiple_of)
        self.num_samples = STREAM_SAMPLES
        self.said = checks.Said(quiet=True)  # the first rows' checks said it once already
        self.start = {"pass": 0, "block": 0, "raw": None, "skip": 0}  # where the next __iter__ begins
        self.at = dict(self.start)  # where this process's stream stands: after the last sample handed out
        self.features, self._left = None, 0
        self.source = self.args.train_file or self.args.dataset_name  # what a late row's line names
        self.by_row = True  # each process reads every world-th row (else whole shards: rows counted in its share)
        self.timeout, self.gloo = cfg.ddp_timeout, None  # the gloo group a late refusal is agreed over
        self.stamp = _stamp(self.args.train_file)  # the file as the stream began: each pass's start is held to it

    # --- the sampler's interface (finetune/steps.py EpochSampler) -------------------------------------------
    def reset(self, epoch: int, start: int = 0) -> None:
        """The loop's epoch, `start` samples (of all processes) in: the batches left of the run's one epoch. Where
        the data stands is this process's own position (`restore`), not a count of samples."""
        self._left = max(0, self.num_samples - start) // (self.world * self.batch) if epoch == 0 else 0

    def weights(self, sample_weights):
        return None  # one each: a text sample counts once in its step's loss

    def __len__(self) -> int:
        return math.ceil(self.num_samples / (self.world * self.batch))

    def __iter__(self):
        samples = self._samples(dict(self.start))
        for _ in range(self._left):
            batch, failed = None, None
            try:
                batch = list(itertools.islice(samples, self.batch))
            except Exception as e:  # a late row refused (or our bug): every process must hear of it
                failed = e
            self._agree(failed)
            yield send_to_device(self.collate(batch), self.device)

    def _agree(self, failed: Exception | None) -> None:
        """Every process learns, before its next step, whether one failed reading its batch: that one raises its
        error and says it (whatever its rank), the others end quietly (`PeerFailed`), instead of dying in the
        step's all-reduce with a traceback. One all-reduce (MIN) of a CPU integer over a gloo group of the
        stream's own a micro-batch, as `signals.StopOnSignal` does a step; without a process group, the error."""
        if self.world == 1 or not torch.distributed.is_initialized():
            if failed is not None:
                raise failed
            return
        if self.gloo is None:  # every process makes it at its first batch, in the same order
            self.gloo = torch.distributed.new_group(backend="gloo", timeout=timedelta(seconds=self.timeout))
        first = torch.tensor([self.rank if failed is not None else self.world])
        torch.distributed.all_reduce(first, op=torch.distributed.ReduceOp.MIN, group=self.gloo)
        if int(first) == self.world:
            return
        if failed is not None and int(first) == self.rank:
            failed.local = True  # type: ignore[attr-defined]  # this process says it, whatever its rank
            raise failed
        raise PeerFailed(f"process {int(first)} failed")

    def describe(self) -> str:
        """The start summary's words for the training split."""
        names = "given" if self.given else f"read from its first {data.FIRST_PASS:,} rows, as the baseline is"
        per_step = self.world * self.batch * self.accumulation
        return (f"a stream of {self.steps * per_step:,} samples ({self.steps} steps x {per_step}; a pass over the "
                f"data is an epoch, and a step goes on into the next pass; label names {names})")

    # --- the position a checkpoint records --------------------------------------------------------------------
    def state(self) -> list[dict]:
        """Every process's position (a collective: every process calls it), for the manifest."""
        return gather_object([self.at])

    def restore(self, states: list[dict] | None) -> None:
        """A resume: this process goes on from its position in the checkpoint's manifest."""
        assert states is not None and len(states) == self.world, "a streamed checkpoint of this topology"
        self.start = dict(states[self.rank])
        self.at = dict(self.start)

    # --- reading ------------------------------------------------------------------------------------------------
    def _open(self, state: dict | None):
        checks.gate(rules.CHANGED, self.args.train_file, self.stamp, _stamp(self.args.train_file))
        raw = data.open_stream(self.args)
        self.by_row = self.world == 1 or raw.n_shards % self.world != 0  # split_dataset_by_node's choice
        if self.world > 1:
            raw = split_dataset_by_node(raw, rank=self.rank, world_size=self.world)
        if state is not None:
            raw.load_state_dict(state)
        self.features = self.features or raw.features
        return raw

    def _samples(self, at: dict):
        """This process's samples from `at`, forever: its share of each pass, block by block."""
        while True:
            raw, read, fresh = self._open(at["raw"]), 0, at["raw"] is None and at["block"] == 0
            rows_of, first = iter(raw), at["block"] * self.block_size  # the blocks before this one are whole
            while True:
                state = at["raw"] if read == 0 else raw.state_dict()  # datasets' position at the block's start
                with data.reading_the_stream(self.args):
                    rows = list(itertools.islice(rows_of, self.block_size))
                if not rows:
                    break
                ordered = self._ordered(self._prepare(rows, first + read), at["pass"], at["block"])
                read += len(rows)
                for i in range(at["skip"], len(ordered)):
                    self.at = {"pass": at["pass"], "block": at["block"], "raw": state, "skip": i + 1}
                    yield ordered[i]
                at = {"pass": at["pass"], "block": at["block"] + 1, "raw": None, "skip": 0}
            if fresh:  # a pass read from its start: it must hold something
                checks.gate(rules.EMPTY, read, self.rank, self.world)
            at = {"pass": at["pass"] + 1, "block": 0, "raw": None, "skip": 0}

    def _prepare(self, rows: list[dict], first: int) -> list[dict]:
        """A block's rows as the model reads them: each row checked as a loaded file's are (`_check`), labels
        encoded by the run's names, tokenized. `first`: the block's first row in this process's share of the pass."""
        ds = HFDataset.from_list(rows, features=self.features)
        self._check(ds, first)
        try:
            ds = self.problem.read_ids_as_names(DatasetDict({"train": ds}), self.args, self.said)["train"]
            batch = self.problem.encode(ds, self.args, self.names, "train", self.said)[:]
        except UserError as e:  # the problem's label rules count the block's rows: the line names them in the file
            e.args = (re.sub(r"\bat row (\d+)", lambda m: f"at {self._row(first, int(m[1]) - 1)}", str(e)),)
            raise
        prepared = {**self.task.tokenize(batch, self.preprocessor, self.args), "labels": batch["labels"]}
        return [dict(zip(prepared, values, strict=True)) for values in zip(*prepared.values(), strict=True)]

    def _check(self, ds: HFDataset, first: int) -> None:
        """A block's rows by the rules a loaded file's rows meet (`rules.ROWS`: an empty text, a null or missing
        label; then a new label's, `rules.NEW_LABELS`, and one the first rows did not hold), each naming the row
        in the stream (`_row`): the first rows were checked whole, and no row is read twice to check it."""
        where = functools.partial(self._row, first)
        checks.gate(rules.ROWS, columns.Columns(ds, "train", self.args, row_name=where))
        column = self.args.label_column
        if self.problem.classes and not self.problem.lists and not isinstance(ds.features[column], ClassLabel):
            unseen = sorted({str(v) for v in ds[column]} - set(self.names))
            if unseen:
                classes = label_rules.Classes(ds, column, {*unseen, *self.names}, self.given,
                                             self.names, where)  # the known names too: a twin of one
                checks.gate(rules.NEW_LABELS, classes)
                row = next(i for i, v in enumerate(ds[column]) if str(v) in unseen)
                checks.gate(rules.LABELS, unseen, self.names, data.FIRST_PASS, where(row), bool(self.given))
        elif self.problem.lists and not self.args.label_columns and column in ds.column_names:  # lists of names
            lists = [{str(v) for v in row if v is not None} if isinstance(row, list) else set() for row in ds[column]]
            unseen = sorted(set().union(*lists) - set(self.names))
            if unseen:
                row = next(i for i, names in enumerate(lists) if names & set(unseen))
                checks.gate(rules.LABELS, unseen, self.names, data.FIRST_PASS, where(row), bool(self.given))

    def _row(self, first: int, i: int) -> str:
        """Row `i` of a block whose first is row `first` of this process's share of the pass, as a line names it:
        its row in the file (data rows from 1, the header not counted), or, where the processes read whole
        shards, its row in this process's share."""
        at = first + i
        if self.by_row:
            return f"row {at * self.world + self.rank + 1:,} of {self.source}"
        return f"row {at + 1:,} of process {self.rank}'s share of {self.source}"

    def _ordered(self, samples: list[dict], pass_: int, block: int) -> list[dict]:
        """A block in its training order, drawn from (seed, pass, block, process): shuffled; with group_by_length
        sorted by length into batches, whose order is shuffled, a short last batch kept last."""
        if not self.shuffle:
            return samples
        rng, order = random.Random(f"{self.seed}/{pass_}/{block}/{self.rank}"), list(range(len(samples)))
        rng.shuffle(order)
        if self.group:
            order.sort(key=lambda i: -samples[i]["length"])  # stable: equal lengths keep the shuffled order
            batches = [order[i : i + self.batch] for i in range(0, len(order), self.batch)]
            tail = [batches.pop()] if batches and len(batches[-1]) < self.batch else []
            rng.shuffle(batches)
            order = [i for b in batches + tail for i in b]
        return [samples[i] for i in order]
