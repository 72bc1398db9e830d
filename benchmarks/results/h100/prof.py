import sys
import time

import torch
from torch.profiler import ProfilerActivity, profile
from transformers import AutoModelForSequenceClassification, BertConfig

dev = "cuda" if torch.cuda.is_available() else "cpu"
big = dev == "cuda"
cfg = BertConfig(hidden_size=768 if big else 64, num_hidden_layers=12 if big else 2, num_attention_heads=12 if big else 2,
                 intermediate_size=3072 if big else 128, num_labels=2, attn_implementation=sys.argv[1] if len(sys.argv) > 1 else "sdpa")
m = AutoModelForSequenceClassification.from_config(cfg).to(dev)
opt = torch.optim.AdamW(m.parameters(), lr=1e-5, fused=True)
B, T = (128, 128) if big else (4, 16)
ids = torch.randint(1000, 20000, (B, T), device=dev)
lab = torch.randint(0, 2, (B,), device=dev)
mask = torch.ones_like(ids)
def step():
    with torch.autocast(dev, dtype=torch.bfloat16):
        loss = m(input_ids=ids, attention_mask=mask, labels=lab).loss
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
for _ in range(5):
    step()
if big:
    torch.cuda.synchronize()
t = time.perf_counter()
for _ in range(20):
    step()
if big:
    torch.cuda.synchronize()
print(f"step {1000*(time.perf_counter()-t)/20:.1f} ms ({cfg._attn_implementation})")
acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if big else [])
with profile(activities=acts) as p:
    for _ in range(5):
        step()
    if big:
        torch.cuda.synchronize()
key = "cuda_time_total" if big else "cpu_time_total"
print(p.key_averages().table(sort_by=key, row_limit=22, max_name_column_width=60))
