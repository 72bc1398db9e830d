"""One-off device experiment (issue 30): where the app's compiled step loses to a bare compiled step.

The app's train() on the bench's `bert_full` recipe at BERT-base size, batch 256 x 128 tokens, compiled with
one length bucket (as call2's bench), profiled with torch.profiler over steps 20-24 (after warm-up):
wall time per step against the GPU's busy time per step, then the ops by CUDA time and by CPU time.
Run: python3 benchmarks/results/h100/precision/appprof.py [small]   ("small": a tiny model, to try it on a CPU)
"""

import sys
import time

import torch
from torch.profiler import ProfilerActivity, profile

from benchmarks.recipes import RECIPES
from finetune.config import load_config
from finetune.run import Hooks, train

small = sys.argv[1:] == ["small"]
size = "hidden_size: 32, num_hidden_layers: 2, num_attention_heads: 2, intermediate_size: 64" if small else \
    "hidden_size: 768, num_hidden_layers: 12, num_attention_heads: 12, intermediate_size: 3072"
cfg = load_config(RECIPES["bert_full"], [
    f"model_config={{model_type: bert, {size}, max_position_embeddings: 512}}", "output_dir=/tmp/appprof",
    "overwrite_output_dir=true", "max_length=128", "pad_to_multiple_of=128", f"per_device_train_batch_size={16 if small else 256}",
    "max_steps=26", "max_eval_samples=256", "test_file=null", "torch_compile=true", "length_buckets=1"])
cuda = torch.cuda.is_available()
acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])


class Profiled(Hooks):
    def __init__(self):
        super().__init__()
        self.prof, self.t = profile(activities=acts), {}

    def mark(self, name, x=None):
        if name == "step" and x in (20, 24):
            if cuda:
                torch.cuda.synchronize()
            self.t[x] = time.perf_counter()
            self.prof.__enter__() if x == 20 else self.prof.__exit__(None, None, None)


h = Profiled()
train(cfg, h)
wall = (h.t[24] - h.t[20]) / 4
ka = h.prof.key_averages()
busy = sum(e.self_device_time_total for e in ka) / 1e3 / 4 if cuda else 0.0
print(f"\nsteps 21-24: wall {wall * 1e3:.1f} ms/step; GPU busy (sum of kernel time) {busy:.1f} ms/step")
if cuda:
    print(ka.table(sort_by="self_cuda_time_total", row_limit=25, max_name_column_width=70))
print(ka.table(sort_by="self_cpu_time_total", row_limit=25, max_name_column_width=70))
print(ka.table(sort_by="cpu_time_total", row_limit=30, max_name_column_width=70))
