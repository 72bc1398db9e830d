"""Several runs of finetune.run.main in ONE set of launched processes, for tests/test_fsdp.py and
tests/test_ddp_equivalence.py.

    FINETUNE_TEST_FSDP_ON_CPU=1 accelerate launch --config_file accelerate_configs/fsdp.yaml \
        --num_processes 2 tests/multi_run_worker.py PLAN.json

PLAN.json: {"record_dir": ..., "runs": [{"name": ..., "fsdp": true|false, "argv": [...]}, ...]}; a run with
"expect_error": true is one the app must refuse (a UserError, which every process meets alike): its
message is recorded as "error", and the next run goes on in the same processes.
tests/test_parallel_run.py launches it with accelerate_configs/ddp_model_parallel.yaml for one run.
Each run is the real loop (`finetune.run.train` on the command line's config, as `main(argv)` parses
it) with the launcher's environment; a run
with "fsdp": false is the same processes as plain DDP (ACCELERATE_USE_FSDP=false while it builds its
Accelerator). Why one launch for several runs: starting two processes costs ~15 s of imports on the
2-core dev machine and a tiny run ~3 s, so six launches would take minutes.

Between runs the Accelerate state is reset, as tests/conftest.py does between in-process runs, but
the process group is kept: `main()` (`runtime.end_processes`) and `Accelerator.end_training` would
destroy it, and a second `init_process_group` through torchrun's store then connects to the first
group's stale addresses (gloo "Connection refused", or a hang). So this worker calls `train()`, and
`end_training` finishes trackers only; the group is destroyed once, at the end.

What the app's loop does not return is recorded per process and run in record_dir/<name>-<rank>.json
(a `finetune.run.Hooks` whose "prepared" mark comes right after `accelerator.prepare`): the distributed type,
the process group's backend (gloo on CPUs), the wrapper (DDP and its device_ids), a layer split's stages and hand-offs, each parameter's class,
global shape and local shape, and the gradient norms that
`accelerator.clip_grad_norm_` returned (before clipping), and the run's wall time. Rank 0 prints
RUN_MARK and the run's name before each run, so that what each run printed can be told apart.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import torch
from accelerate import Accelerator
from accelerate.state import AcceleratorState, GradientState

import finetune.run as run
from finetune.cli import parse_command_line
from finetune.errors import UserError

RUN_MARK = "=== multi_run_worker: run "


class Spy(run.Hooks):
    """Records what the run's prepared objects are: the app's own hook, right after `accelerator.prepare`."""

    def __init__(self, record: dict):
        super().__init__()
        self.record = record

    def mark(self, name, value=None) -> None:
        if name != "prepared":
            return
        from torch.distributed.tensor import DTensor

        record, accelerator, model = self.record, value.accelerator, value.model
        record["distributed_type"] = accelerator.distributed_type.value
        record["process_index"] = accelerator.process_index
        record["num_processes"] = accelerator.num_processes
        dist = torch.distributed
        record["backend"] = dist.get_backend() if dist.is_available() and dist.is_initialized() else None
        record["wrapper"] = type(model).__name__
        record["device_ids"] = getattr(model, "device_ids", "n/a")  # DDP's; None for a split module
        split = getattr(accelerator.unwrap_model(model), "mp_state", None)
        if split is not None:
            record["stages"] = [{"device": str(s.device), "blocks": s.blocks} for s in split.plan.stages]
            record["_split"] = split  # read after the run: the hand-offs it made
        record["params"] = {
            name: {
                "class": type(p).__name__,
                "shape": list(p.shape),
                "local_shape": list(p.to_local().shape if isinstance(p, DTensor) else p.shape),
                "placements": [repr(x) for x in p.placements] if isinstance(p, DTensor) else None,
            }
            for name, p in accelerator.unwrap_model(model).named_parameters()  # DDP: no `module.`
        }
        clip = accelerator.clip_grad_norm_
        record["grad_norms"] = []

        def clip_grad_norm_(parameters, max_norm, norm_type=2):
            norm = clip(parameters, max_norm, norm_type)
            norm = norm.full_tensor() if isinstance(norm, DTensor) else norm
            record["grad_norms"].append(float(norm))
            return norm

        accelerator.clip_grad_norm_ = clip_grad_norm_  # this run's Accelerator only


def main() -> None:
    plan = json.loads(Path(sys.argv[1]).read_text())
    record_dir = Path(plan["record_dir"])
    Accelerator.end_training = lambda self: [t.finish() for t in self.trackers] and None
    for spec in plan["runs"]:
        os.environ["ACCELERATE_USE_FSDP"] = "true" if spec["fsdp"] else "false"
        record: dict = {}
        if os.environ.get("RANK", "0") == "0":  # where each run's printed lines begin (`run_outputs`)
            print(f"{RUN_MARK}{spec['name']}", flush=True)
        start = time.perf_counter()
        # train(), not main(): main() ends the process group at its end, and the next run would have to
        # form it again on the same port (gloo's second rendezvous hangs); a search keeps it the same way.
        try:
            command = parse_command_line(spec["argv"])
            run.train(command.cfg, hooks=Spy(record), said=command.said)  # the warnings the parse said, once
        except UserError as e:
            if not spec.get("expect_error"):
                raise
            record["error"], record["rule"] = str(e), e.rule
        record["seconds"] = time.perf_counter() - start
        if "_split" in record:
            record["handoffs"] = record.pop("_split").total_handoffs
        rank = record.get("process_index", int(os.environ.get("RANK", "0")))
        (record_dir / f"{spec['name']}-{rank}.json").write_text(json.dumps(record))
        AcceleratorState._reset_state(True)
        GradientState._reset_state()
    if torch.distributed.is_initialized():
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
