"""One-off device experiment (issue 30): which calls of the app's compiled step make the host wait for the GPU.

The app's train() as appprof.py runs it (the bench's `bert_full` recipe at BERT-base size, batch 256 x 128,
compiled whole with one length bucket), with `torch.cuda.set_sync_debug_mode("warn")` over optimizer steps
11-20 (after the warm-up): torch warns at every call that synchronises the host with the GPU; each distinct
call stack is printed once with how often it was seen. Also the wall time per step over those steps.
Run: python3 benchmarks/results/h200/compile_whole/syncs.py [small] [plain]
("small": a tiny model, to try it on a CPU; "plain": no sync debug mode, only the timing)
"""

import collections
import sys
import time
import traceback
import warnings

import torch

from benchmarks.recipes import RECIPES
from finetune.config import load_config
from finetune.run import Hooks, train

small, plain = "small" in sys.argv[1:], "plain" in sys.argv[1:]
size = "hidden_size: 32, num_hidden_layers: 2, num_attention_heads: 2, intermediate_size: 64" if small else \
    "hidden_size: 768, num_hidden_layers: 12, num_attention_heads: 12, intermediate_size: 3072"
cfg = load_config(RECIPES["bert_full"], [
    f"model_config={{model_type: bert, {size}, max_position_embeddings: 512}}", "output_dir=/tmp/syncs",
    "overwrite_output_dir=true", "max_length=128", "pad_to_multiple_of=128", f"per_device_train_batch_size={16 if small else 256}",
    "max_steps=22", "max_eval_samples=256", "test_file=null", "torch_compile=true", "length_buckets=1", "logging_steps=10"] + [a for a in sys.argv[1:] if "=" in a])
cuda = torch.cuda.is_available()
seen = collections.Counter()
watching = [False]


def record(message, category, filename, lineno, file=None, line=None):
    if not watching[0]:
        return
    stack = "".join(traceback.format_stack(limit=14)[:-2])
    seen[f"{category.__name__}: {str(message)[:160]}\n{stack}"] += 1


class Watched(Hooks):
    def __init__(self):
        super().__init__()
        self.t, self.cpu = {}, {}

    def mark(self, name, x=None):
        if name == "step" and x in (10, 20):
            if cuda:
                torch.cuda.synchronize()
            self.t[x], self.cpu[x] = time.perf_counter(), time.process_time()
            watching[0] = x == 10
            if cuda and not plain:
                torch.cuda.set_sync_debug_mode("warn" if x == 10 else 0)


warnings.simplefilter("always")
warnings.showwarning = record
h = Watched()
train(cfg, h)
print(f"\nsteps 11-20: wall {(h.t[20] - h.t[10]) / 10 * 1e3:.1f} ms/step, this process's CPU time "
      f"{(h.cpu[20] - h.cpu[10]) / 10 * 1e3:.1f} ms/step (step 20's logging included)")
for what, n in seen.most_common(12):
    print(f"\n== seen {n} times in steps 11-20 ==\n{what}")
