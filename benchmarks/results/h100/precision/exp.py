"""One-off device experiment (issue 30, GPU part): would bf16 weights lift the compiled step's MFU?

BERT-base size (12 x 768, the bench's `bert_full` choices: embeddings and the two lowest layers frozen,
dropout off), batch 256 x 128 tokens, no padding, SDPA, fused AdamW, one fixed batch (no data loading);
each variant compiled with `torch.compile(model)` and timed over 30 steps after 8 warm-up steps:
  amp      fp32 weights under bf16 autocast (what the app does)
  bf16     bf16 weights, no autocast, AdamW on the bf16 weights (no master copy: an upper bound)
  master   bf16 weights, AdamW on fp32 master copies (grads copied up, weights copied down each step)
MFU as benchmarks/flops.py counts it, against the bf16 GEMM peak of benchmarks/peak.py in the same run.
Run: python3 benchmarks/results/h100/precision/exp.py  (prints a table and a CUDA-time profile of each)
"""

import sys
import time

import torch
from torch.profiler import ProfilerActivity, profile
from transformers import AutoModelForSequenceClassification, BertConfig

from benchmarks.flops import flop_model, token_flops
from benchmarks.peak import gemm_peak

dev = torch.device("cuda")
B, S = 256, 128
variants = sys.argv[1:] or ["amp", "bf16", "master"]
peak = gemm_peak(torch.bfloat16, 8192, 10, dev)["flops_per_s"]
name = torch.cuda.get_device_name()
print(f"{name}  torch {torch.__version__}  bf16 GEMM peak {peak / 1e12:.1f} TFLOP/s", flush=True)
g = torch.Generator().manual_seed(0)
ids = torch.randint(1000, 20000, (B, S), generator=g).to(dev)
labels = torch.randint(0, 2, (B,), generator=g).to(dev)
mask = torch.ones_like(ids)


def build(kind):
    torch.manual_seed(0)
    cfg = BertConfig(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072,
                     hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, num_labels=2, attn_implementation="sdpa")
    m = AutoModelForSequenceClassification.from_config(cfg)
    for p in m.bert.embeddings.parameters():
        p.requires_grad_(False)
    for layer in m.bert.encoder.layer[:2]:
        for p in layer.parameters():
            p.requires_grad_(False)
    f = flop_model(m)
    m = m.to(dev).train()
    trained = [p for p in m.parameters() if p.requires_grad]
    if kind == "amp":
        opt = torch.optim.AdamW(trained, lr=1e-5, fused=True)
        masters = None
    else:
        m = m.to(torch.bfloat16)
        trained = [p for p in m.parameters() if p.requires_grad]
        masters = None if kind == "bf16" else [p.detach().float().clone().requires_grad_(True) for p in trained]
        opt = torch.optim.AdamW(masters or trained, lr=1e-5, fused=True)
    return m, f, trained, masters, opt


def run(kind):
    m, f, trained, masters, opt = build(kind)
    cm = torch.compile(m)

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=kind == "amp"):
            loss = cm(input_ids=ids, attention_mask=mask, labels=labels).loss
        loss.backward()
        if masters is not None:
            for q, p in zip(masters, trained, strict=True):
                q.grad = p.grad.float()
            opt.step()
            with torch.no_grad():
                torch._foreach_copy_(trained, masters)
            for p in trained:
                p.grad = None
            for q in masters:
                q.grad = None
        else:
            opt.step()
            opt.zero_grad(set_to_none=True)
        return loss

    t0 = time.perf_counter()
    step()
    torch.cuda.synchronize()
    compile_s = time.perf_counter() - t0
    for _ in range(8):
        step()
    torch.cuda.synchronize()
    t = time.perf_counter()
    n = 30
    for _ in range(n):
        loss = step()
    torch.cuda.synchronize()
    dt = (time.perf_counter() - t) / n
    flops = B * S * token_flops(f, S)
    row = f"| {kind} | {dt * 1e3:.1f} | {flops / dt / peak:.3f} | {compile_s:.0f} | {loss.item():.4f} |"
    with profile(activities=[ProfilerActivity.CUDA]) as p:
        for _ in range(3):
            step()
        torch.cuda.synchronize()
    print(f"\n== {kind}: CUDA time of 3 steps\n" + p.key_averages().table(sort_by="cuda_time_total", row_limit=14, max_name_column_width=70), flush=True)
    print(row, flush=True)
    return row


rows = [run(k) for k in variants]
print("\n| variant | step ms | MFU | first step s (compile) | loss |\n|---|---|---|---|---|")
print("\n".join(rows))
