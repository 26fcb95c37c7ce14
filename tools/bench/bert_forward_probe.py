#!/usr/bin/env python3
"""Where BERT's forward spends its GPU time on a packed batch, and what fusing would save.

Runs the same packed forward as encoders/bert/bert_model.cpp (fused QKV projection, variable-length
flash attention, LayerNorm after each residual) with torch's ops on random BERT-base weights, on
one batch shaped like text_scale.py's: 4,096 captions of 3 to 24 tokens (about 55,000 tokens), in
bfloat16. Prints the kernel time per kind of kernel (torch.profiler) and the median forward time
of each variant, each checked against the first:

  current     what bert_model.cpp runs today
  residual    each residual add done by the GEMM itself (x.addmm_(a, w.t()): cuBLAS reads the
              residual as C), the output projections' biases folded into the LayerNorm before
              them and the next projection's bias (exact algebra, done once at load)
  tanh_gelu   residual + the FFN's GELU in cuBLASLt's epilogue (tanh approximation: for
              information, it is not the erf GELU BERT's "gelu" names)
  compiled    torch.compile of current (Inductor's own fusions), for what fusion can reach

Usage: python3 tools/bench/bert_forward_probe.py [--iters 50] [--out FILE.json]
"""
import argparse
import json
import statistics

import torch
import torch.nn.functional as F

H, HEADS, INTER, LAYERS, EPS = 768, 12, 3072, 12, 1e-12


def weights(dtype, device, seed=0):
    g = torch.Generator(device="cpu").manual_seed(seed)

    def r(*shape, scale=0.02):
        return (torch.randn(*shape, generator=g) * scale).to(device, dtype)

    layers = []
    for _ in range(LAYERS):
        layers.append({
            "qkv_w": r(3 * H, H), "qkv_b": r(3 * H, scale=0.1),
            "out_w": r(H, H), "out_b": r(H, scale=0.1),
            "ln1_w": 1 + r(H, scale=0.1), "ln1_b": r(H, scale=0.1),
            "in_w": r(INTER, H), "in_b": r(INTER, scale=0.1),
            "ffo_w": r(H, INTER), "ffo_b": r(H, scale=0.1),
            "ln2_w": 1 + r(H, scale=0.1), "ln2_b": r(H, scale=0.1),
        })
    return layers


def folded(layers):
    """The output projections' biases moved into the LayerNorm before each residual and
    subtracted from the projection that reads that LayerNorm's output (computed in float32)."""
    out = [dict(l) for l in layers]
    for i, l in enumerate(out):
        f = {k: v.float() for k, v in l.items()}
        # x' = LN_prev(..) + out_b: the QKV projection reads x' and must not see out_b.
        l["qkv_b"] = (f["qkv_b"] - f["qkv_w"] @ f["out_b"]).to(l["qkv_b"].dtype)
        # the attention LayerNorm's output carries ffo_b for the FFN residual.
        l["ln1_b"] = (f["ln1_b"] + f["ffo_b"]).to(l["ln1_b"].dtype)
        l["in_b"] = (f["in_b"] - f["in_w"] @ f["ffo_b"]).to(l["in_b"].dtype)
        if i + 1 < len(out):
            l["ln2_b"] = (f["ln2_b"] + layers[i + 1]["out_b"].float()).to(l["ln2_b"].dtype)
    first_out_b = layers[0]["out_b"]
    return out, first_out_b


def attend(qkv, cu, max_len, t):
    q, k, v = qkv.view(t, 3, HEADS, H // HEADS).unbind(1)
    out = torch.ops.aten._flash_attention_forward(q, k, v, cu, cu, max_len, max_len, 0.0, False,
                                                  False, scale=(H // HEADS) ** -0.5)[0]
    return out.reshape(t, H)


def forward_current(x, layers, cu, max_len):
    t = x.shape[0]
    for l in layers:
        ctx = attend(F.linear(x, l["qkv_w"], l["qkv_b"]), cu, max_len, t)
        x = F.layer_norm(x + F.linear(ctx, l["out_w"], l["out_b"]), (H,), l["ln1_w"], l["ln1_b"],
                         EPS)
        inner = F.gelu(F.linear(x, l["in_w"], l["in_b"]))
        x = F.layer_norm(x + F.linear(inner, l["ffo_w"], l["ffo_b"]), (H,), l["ln2_w"],
                         l["ln2_b"], EPS)
    return x


def forward_residual(x, layers, cu, max_len, tanh_gelu=False):
    # x arrives as the embeddings' LayerNorm output plus layer 0's out_b (folded there too).
    t = x.shape[0]
    for l in layers:
        ctx = attend(F.linear(x, l["qkv_w"], l["qkv_b"]), cu, max_len, t)
        x = F.layer_norm(x.addmm_(ctx, l["out_w"].t()), (H,), l["ln1_w"], l["ln1_b"], EPS)
        if tanh_gelu:
            inner = torch._addmm_activation(l["in_b"], x, l["in_w"].t(), use_gelu=True)
        else:
            inner = F.gelu(F.linear(x, l["in_w"], l["in_b"]))
        x = F.layer_norm(x.addmm_(inner, l["ffo_w"].t()), (H,), l["ln2_w"], l["ln2_b"], EPS)
    return x


def timed(fn, iters):
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def kernel_kind(name: str) -> str:
    n = name.lower()
    if "flash" in n or "fmha" in n:
        return "attention"
    if "gemm" in n or "cutlass" in n or "sm90" in n or "nvjet" in n or "xmma" in n:
        return "matmul"
    if "layer_norm" in n or "layernorm" in n:
        return "layer_norm"
    if "gelu" in n:
        return "gelu"
    if "add" in n:
        return "add"
    return "other"


def profile(fn):
    from torch.profiler import ProfilerActivity, profile as torch_profile
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    with torch_profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(10):
            fn()
        torch.cuda.synchronize()
    kinds = {}
    for e in prof.key_averages():
        us = getattr(e, "device_time_total", None) or getattr(e, "cuda_time_total", 0)
        if us and e.key and not e.key.startswith("aten::") and not e.key.startswith("cuda"):
            k = kernel_kind(e.key)
            kinds[k] = kinds.get(k, 0.0) + us / 10 / 1000  # ms per forward
    return dict(sorted(kinds.items(), key=lambda kv: -kv[1]))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--captions", type=int, default=4096)
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument("--out")
    args = ap.parse_args()
    dev, dtype = "cuda:0", torch.bfloat16
    torch.manual_seed(0)
    lengths = torch.randint(3, 25, (args.captions,))
    t, max_len = int(lengths.sum()), int(lengths.max())
    cu = torch.zeros(args.captions + 1, dtype=torch.int32)
    cu[1:] = torch.cumsum(lengths, 0)
    cu = cu.to(dev)
    layers = weights(dtype, dev)
    fl, first_out_b = folded(layers)
    x0 = torch.randn(t, H, device=dev).to(dtype)

    result = {"tokens": t, "captions": args.captions, "device": torch.cuda.get_device_name(0),
              "torch": torch.__version__}
    with torch.inference_mode():
        ref = forward_current(x0, layers, cu, max_len).float()
        variants = {
            "current": lambda: forward_current(x0, layers, cu, max_len),
            "residual": lambda: forward_residual(x0 + first_out_b, fl, cu, max_len),
            "tanh_gelu": lambda: forward_residual(x0 + first_out_b, fl, cu, max_len, True),
        }
        if not args.no_compile:
            compiled = torch.compile(forward_current, dynamic=False)
            variants["compiled"] = lambda: compiled(x0, layers, cu, max_len)
        result["variants"] = {}
        for name, fn in variants.items():
            out = fn().float()
            cos = F.cosine_similarity(out, ref, dim=1)
            ms = timed(fn, args.iters)
            result["variants"][name] = {
                "ms": round(ms, 3), "tokens_per_s": round(t / ms * 1000),
                "min_cosine_to_current": round(float(cos.min()), 6),
                "max_abs_diff": round(float((out - ref).abs().max()), 5)}
            print(f"{name:10s} {ms:7.3f} ms  {t / ms * 1000:12,.0f} tokens/s  "
                  f"min cos {float(cos.min()):.6f}  max |diff| {float((out - ref).abs().max()):.4f}",
                  flush=True)
        for name in ("current", "residual"):
            kinds = profile(variants[name])
            result["variants"][name]["kernel_ms"] = {k: round(v, 3) for k, v in kinds.items()}
            print(f"{name} kernels (ms a forward):",
                  ", ".join(f"{k} {v:.2f}" for k, v in kinds.items()), flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
