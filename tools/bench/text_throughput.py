#!/usr/bin/env python3
"""Text embedding throughput of precompute against what a user would run today in Python, in one
run on one GPU, with a randomly initialised BERT-base (speed does not depend on the weights), or
with --model xlmr a randomly initialised multilingual-e5-base-sized XLM-RoBERTa.

    python3 tools/bench/text_throughput.py [--build build-gpu]              # the GPU benchmark
    .venv/bin/python tools/bench/text_throughput.py --device cpu --short 200 --long 20 \\
        --build build                                                      # smoke test on CPU
    python3 tools/bench/text_throughput.py --model xlmr --xlmr-tokenizer DIR   # multilingual
    python3 tools/bench/text_throughput.py --runs 3        # each figure the median of 3 runs

--model xlmr: XLM-RoBERTa base (12 x 768, 250,002 pieces, positions from 2) with the tokenizer
folder DIR (default bench-data/xlmr-tokenizer) that `python tools/scripts/xlmr_test_folders.py
--bench-data DIR` writes (a SentencePiece Unigram model trained on generated captions, grown to
XLM-R's vocabulary size, its tokenizer.json gzipped; made on a machine with the sentencepiece
package, then carried; a folder with tokenizer.json itself does too); captions in 11 scripts from
tools/scripts/make_multilingual_corpus.py (short: one sentence or a mix of 2-4 scripts; long:
100-250 words of mixed scripts). Every baseline reads the folder with transformers'
AutoTokenizer / AutoModel.

1. Data (fixed seed): a vocabulary of 20,000 random lowercase words of 2-9 letters plus [PAD]
   [UNK] [CLS] [SEP] [MASK]; a random BERT-base (transformers BertModel, safetensors) with its
   vocab.txt and tokenizer; 100,000 short captions of N(12, 5) words (at least 3) and 10,000
   long texts of U(100, 250) words, as JSONL manifests {"id", "text"}.
2. Baselines: sentence-transformers `encode` (fp16, batch 256, mean pooling); a tuned
   transformers loop (length-sorted, padded-token budget 65,536, bf16, SDPA, mean pooling);
   BERT-base alone at fixed shapes 1024x16 and 128x256 (bf16). On --device cpu everything runs
   in float32 with small warm-ups and shapes.
3. precompute: `<build>/tools/cli/precompute run --config CFG` on each manifest, a text-only
   config with encoder type bert; throughput by wall clock around the process (start-up
   included) and by its own timer (its summary, --summary-json); peak GPU memory from its summary
   or else sampled from nvidia-smi every 100 ms.
4. Quality: cosine of precompute's stored float16 vectors against transformers BertModel in
   float32 (TF32 off) with mean pooling, on a subsample (2,000 short, 500 long).

Prints a Markdown table and writes text_throughput.json and text_throughput.md under $OUT
(default /tmp/out). A failing step is recorded with its error and the others still run; the exit
code is 1 when any step failed, 0 otherwise (missed targets are reported, not failures).
"""

import argparse
import hashlib
import json
import os
import platform
import random
import re
import shutil
import subprocess
import sys
import threading
import time
import traceback
from pathlib import Path

import numpy as np

# The GPU machine has no network: never ask the Hugging Face Hub.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "true")

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(ROOT / "tools" / "scripts"))
import precompute_run  # noqa: E402  runs precompute and reads its summary
from precompute_run import binary_env  # noqa: E402  the GPU build's environment

SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
LETTERS = "abcdefghijklmnopqrstuvwxyz"
# Figures measured on the GPU machine by an earlier run of the same Python baselines, only
# for the report; every ratio and target here uses this run's own baselines.
ANCHORS = {"short_st": 8436, "short_loop": 8708, "long_st": 1912, "long_loop": 2812,
           "model_1024x16": 115356, "model_128x256": 9229}


def log(msg: str) -> None:
    print(f"[text_throughput {time.strftime('%H:%M:%S')}] {msg}", flush=True)


# ------------------------------------------------------------------------------------------------
# 1. Data and model
# ------------------------------------------------------------------------------------------------

def unpacked_tokenizer(folder: Path, work: Path) -> Path:
    """`folder` when it holds tokenizer.json; else, when it holds tokenizer.json.gz (as
    `xlmr_test_folders.py --bench-data` writes it), a copy under `work` with it unpacked."""
    if (folder / "tokenizer.json").exists() or not (folder / "tokenizer.json.gz").exists():
        return folder
    import gzip
    out = work / "xlmr-tokenizer"
    out.mkdir(parents=True, exist_ok=True)
    data = gzip.decompress((folder / "tokenizer.json.gz").read_bytes())
    if not (out / "tokenizer.json").exists() or (out / "tokenizer.json").read_bytes() != data:
        (out / "tokenizer.json").write_bytes(data)
    shutil.copy(folder / "tokenizer_config.json", out / "tokenizer_config.json")
    return out


def make_data(work: Path, n_short: int, n_long: int, seed: int, max_length: int,
              model: str = "bert", xlmr_tokenizer: Path = None) -> dict:
    """Writes the model folder and the two manifests under `work`; reuses them when a previous
    run with the same parameters left them complete."""
    if model == "xlmr":
        xlmr_tokenizer = unpacked_tokenizer(xlmr_tokenizer, work)
    params = {"n_short": n_short, "n_long": n_long, "seed": seed, "max_length": max_length,
              "vocab_words": 20000, "version": 2}
    if model == "xlmr":
        params["model"] = model
        params["tokenizer"] = hashlib.sha256(
            (xlmr_tokenizer / "tokenizer.json").read_bytes()).hexdigest()
    # BERT's names are the ones the other benchmarks and scripts read.
    suffix = "" if model == "bert" else "-xlmr"
    model_dir = work / ("bert-random" if model == "bert" else "xlmr-random")
    stamp = work / f"data{suffix}.json"
    paths = {"model_dir": model_dir, "short": work / f"short{suffix}.jsonl",
             "long": work / f"long{suffix}.jsonl"}
    rng = random.Random(seed)
    if model == "bert":
        words = set()
        while len(words) < params["vocab_words"]:
            words.add("".join(rng.choice(LETTERS) for _ in range(rng.randint(2, 9))))
        words = sorted(words)
        short = [" ".join(rng.choices(words, k=max(3, int(rng.gauss(12, 5)))))
                 for _ in range(n_short)]
        long_ = [" ".join(rng.choices(words, k=rng.randint(100, 250))) for _ in range(n_long)]
        n_vocab = len(words) + len(SPECIALS)
    else:
        import make_multilingual_corpus
        maker = make_multilingual_corpus.Maker(seed)
        scripts = sorted(make_multilingual_corpus.WORDS)
        short = [maker.sentence(rng.choice(scripts)) if rng.random() < 0.7 else maker.mixed()
                 for _ in range(n_short)]
        long_ = []
        for _ in range(n_long):
            target, words = rng.randint(100, 250), []
            while len(words) < target:
                words += maker.sentence(rng.choice(scripts)).split()
            long_.append(" ".join(words[:target]))
        n_vocab = len(json.loads((xlmr_tokenizer / "tokenizer.json").read_text())["model"]
                      ["vocab"])
    texts = {"short": short, "long": long_}
    reuse = (stamp.exists() and json.loads(stamp.read_text()) == params
             and (model_dir / "model.safetensors").exists()
             and all(paths[k].exists() for k in ("short", "long")))
    if reuse:
        try:
            check_tokenizer(model_dir, n_vocab, short[:100] + long_[:10], model)
        except RuntimeError as e:
            log(f"regenerating the model folder: {e}")
            reuse = False
    if not reuse:
        import torch
        if stamp.exists():
            stamp.unlink()
        shutil.rmtree(model_dir, ignore_errors=True)
        model_dir.mkdir(parents=True)
        torch.manual_seed(seed)
        if model == "bert":
            from transformers import BertConfig, BertModel
            (model_dir / "vocab.txt").write_text("\n".join(SPECIALS + words) + "\n")
            cfg = BertConfig(vocab_size=len(words) + len(SPECIALS))
            BertModel(cfg).save_pretrained(model_dir, safe_serialization=True)
            make_tokenizer(model_dir / "vocab.txt", max_length).save_pretrained(model_dir)
        else:
            from transformers import XLMRobertaConfig, XLMRobertaModel
            for name in ("tokenizer.json", "tokenizer_config.json"):
                shutil.copy(xlmr_tokenizer / name, model_dir / name)
            # multilingual-e5-base's shape.
            cfg = XLMRobertaConfig(vocab_size=n_vocab, hidden_size=768, num_hidden_layers=12,
                                   num_attention_heads=12, intermediate_size=3072,
                                   max_position_embeddings=514, type_vocab_size=1,
                                   layer_norm_eps=1e-5, pad_token_id=1)
            XLMRobertaModel(cfg, add_pooling_layer=False).save_pretrained(
                model_dir, safe_serialization=True)
        check_tokenizer(model_dir, n_vocab, short[:100] + long_[:10], model)
        for name in ("short", "long"):
            with open(paths[name], "w") as f:
                for i, t in enumerate(texts[name]):
                    f.write(json.dumps({"id": f"{name}-{i:06d}", "text": t}) + "\n")
        stamp.write_text(json.dumps(params))
    return {"paths": paths, "texts": texts, "vocab_size": n_vocab, "reused": reuse}


def make_tokenizer(vocab: Path, max_length: int):
    """BertTokenizerFast over vocab.txt. transformers 5 takes the file as `vocab` and silently
    ignores `vocab_file` (which gives a tokenizer of the 5 special tokens that maps every word
    to [UNK]); transformers 4 takes `vocab_file`."""
    from transformers import BertTokenizerFast
    n = sum(1 for _ in open(vocab))
    tok = None
    try:
        tok = BertTokenizerFast(vocab=str(vocab), model_max_length=max_length)
    except TypeError:
        pass
    if tok is None or len(tok.get_vocab()) != n:
        tok = BertTokenizerFast(vocab_file=str(vocab), model_max_length=max_length)
    if len(tok.get_vocab()) != n:
        raise RuntimeError(f"BertTokenizerFast over {vocab} has {len(tok.get_vocab())} tokens, "
                           f"the file {n}")
    return tok


def check_tokenizer(model_dir: Path, n_vocab: int, sample, model: str = "bert") -> None:
    """The saved tokenizer, as every baseline loads it, knows every word of the texts (BERT's
    vocabulary is made of them; the XLM-R one is trained on the same generator's captions, which
    leaves an occasional unknown character)."""
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(str(model_dir))
    if len(tok.get_vocab()) != n_vocab:
        raise RuntimeError(f"the tokenizer saved in {model_dir} has {len(tok.get_vocab())} "
                           f"tokens, expected {n_vocab}")
    ids = [i for row in tok(sample)["input_ids"] for i in row]
    unk = sum(i == tok.unk_token_id for i in ids)
    if (model == "bert" and unk) or unk > 0.01 * len(ids):
        raise RuntimeError(f"the tokenizer saved in {model_dir} maps {unk} words of the sample "
                           "to [UNK]")


# ------------------------------------------------------------------------------------------------
# 2. Baselines
# ------------------------------------------------------------------------------------------------

def sync(device: str) -> None:
    import torch
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def reset_peak(device: str) -> None:
    import torch
    if device.startswith("cuda"):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()


def peak_mib(device: str):
    import torch
    if device.startswith("cuda"):
        return round(torch.cuda.max_memory_allocated() / 2**20)
    return None


def free_cuda(device: str) -> None:
    import gc
    import torch
    gc.collect()
    if device.startswith("cuda"):
        torch.cuda.empty_cache()


def bench_sentence_transformers(model_dir: Path, texts: dict, sub: dict, args) -> dict:
    """sentence-transformers encode, fp16 (float32 on CPU), batch 256, mean pooling."""
    import torch
    from sentence_transformers import SentenceTransformer
    try:
        from sentence_transformers.sentence_transformer import modules as models
    except ImportError:
        from sentence_transformers import models
    gpu = args.device.startswith("cuda")
    st = SentenceTransformer(modules=[models.Transformer(str(model_dir),
                                                        max_seq_length=args.max_length),
                                      models.Pooling(768, "mean")], device=args.device)
    res_model = type(st[0].auto_model).__name__
    if gpu:
        st.half()
    res = {"dtype": "float16" if gpu else "float32", "batch_size": args.st_batch,
           "model_class": res_model}
    for name, data in texts.items():
        st.encode(data[:args.warmup], batch_size=args.st_batch, show_progress_bar=False,
                  convert_to_tensor=True)
        reset_peak(args.device)
        times = []
        for _ in range(args.runs):
            t = time.perf_counter()
            emb = st.encode(data, batch_size=args.st_batch, show_progress_bar=False,
                            convert_to_tensor=True)
            sync(args.device)
            times.append(time.perf_counter() - t)
        res[name] = median_rate(len(data), times)
        res[name].update({"peak_mib": peak_mib(args.device),
                          "sub": torch.as_tensor(emb).float().cpu()[torch.from_numpy(sub[name])]})
        log(f"sentence-transformers {name}: {res[name]['per_s']:,.0f}/s "
            f"({', '.join(f'{len(data) / dt:,.0f}' for dt in times)}), "
            f"peak {res[name]['peak_mib']} MiB")
    del st
    free_cuda(args.device)
    return res


def median_rate(n: int, times) -> dict:
    """The median of the timed runs over `n` texts, with every run's rate."""
    rates = sorted(n / dt for dt in times)
    return {"per_s": float(np.median(rates)), "seconds": float(np.median(times)),
            "runs_per_s": [n / dt for dt in times]}


def embed_loop(model, tok, data, device: str, budget: int, max_length: int):
    """The tuned loop: tokenize, sort by length, batches of at most `budget` padded tokens,
    masked mean pooling in float32. Returns [len(data), hidden] float32 on `device`."""
    import torch
    ids = tok(data, truncation=True, max_length=max_length, return_attention_mask=False,
              return_token_type_ids=False)["input_ids"]
    lengths = np.fromiter((len(x) for x in ids), dtype=np.int64, count=len(ids))
    order = np.argsort(lengths, kind="stable")
    out = torch.empty(len(ids), model.config.hidden_size, dtype=torch.float32, device=device)
    pin = device.startswith("cuda")
    i, n = 0, len(ids)
    with torch.inference_mode():
        while i < n:
            j = i + 1
            while j < n and (j - i + 1) * lengths[order[j]] <= budget:
                j += 1
            rows = order[i:j]
            width = int(lengths[rows[-1]])
            x = np.zeros((len(rows), width), dtype=np.int64)
            for r, k in enumerate(rows):
                x[r, :lengths[k]] = ids[k]
            mask = (np.arange(width)[None, :] < lengths[rows][:, None]).astype(np.int64)
            xt, mt = torch.from_numpy(x), torch.from_numpy(mask)
            if pin:
                xt, mt = xt.pin_memory(), mt.pin_memory()
            xt = xt.to(device, non_blocking=True)
            mt = mt.to(device, non_blocking=True)
            h = model(input_ids=xt, attention_mask=mt).last_hidden_state
            m = mt.unsqueeze(-1).to(torch.float32)
            out[torch.from_numpy(rows).to(device)] = (h.float() * m).sum(1) / m.sum(1)
            i = j
    return out


def load_bert(model_dir: Path, device: str, dtype):
    """BertModel or XLMRobertaModel, as the folder's config.json says."""
    from transformers import AutoModel
    return AutoModel.from_pretrained(str(model_dir), dtype=dtype,
                                     attn_implementation="sdpa").to(device).eval()


def bench_loop(model_dir: Path, texts: dict, sub: dict, args) -> dict:
    import torch
    from transformers import AutoTokenizer
    gpu = args.device.startswith("cuda")
    dtype = torch.bfloat16 if gpu else torch.float32
    tok = AutoTokenizer.from_pretrained(str(model_dir))
    model = load_bert(model_dir, args.device, dtype)
    res = {"dtype": str(dtype).replace("torch.", ""), "token_budget": args.loop_budget}
    for name, data in texts.items():
        embed_loop(model, tok, data[:args.warmup], args.device, args.loop_budget, args.max_length)
        reset_peak(args.device)
        times = []
        for _ in range(args.runs):
            t = time.perf_counter()
            emb = embed_loop(model, tok, data, args.device, args.loop_budget, args.max_length)
            sync(args.device)
            times.append(time.perf_counter() - t)
        res[name] = median_rate(len(data), times)
        res[name].update({"peak_mib": peak_mib(args.device),
                          "sub": emb.cpu()[torch.from_numpy(sub[name])]})
        log(f"tuned loop {name}: {res[name]['per_s']:,.0f}/s "
            f"({', '.join(f'{len(data) / dt:,.0f}' for dt in times)}), "
            f"peak {res[name]['peak_mib']} MiB")
    # The model alone at fixed shapes: no tokenization, no transfers, no mask.
    res["model_only"] = {}
    with torch.inference_mode():
        for b, length in args.shapes:
            x = torch.randint(len(SPECIALS), model.config.vocab_size, (b, length),
                              device=args.device)
            for _ in range(3):
                model(input_ids=x)
            sync(args.device)
            t = time.perf_counter()
            for _ in range(args.model_iters):
                model(input_ids=x)
            sync(args.device)
            dt = (time.perf_counter() - t) / args.model_iters
            flops = 2 * 85e6 * b * length + 12 * 4 * b * length * length * 768
            res["model_only"][f"{b}x{length}"] = {"seq_per_s": b / dt,
                                                  "tflops": flops / dt / 1e12}
            log(f"model alone {b}x{length}: {b / dt:,.0f} seq/s, {flops / dt / 1e12:.1f} TFLOP/s")
    del model
    free_cuda(args.device)
    return res


def reference(model_dir: Path, sub_texts: dict, args) -> dict:
    """transformers BertModel (XLMRobertaModel) in float32 (no TF32), mean pooling: the quality
    reference."""
    import torch
    from transformers import AutoTokenizer
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    tok = AutoTokenizer.from_pretrained(str(model_dir))
    model = load_bert(model_dir, args.device, torch.float32)
    out = {name: embed_loop(model, tok, data, args.device, 16384, args.max_length).cpu()
           for name, data in sub_texts.items()}
    del model
    free_cuda(args.device)
    return out


# ------------------------------------------------------------------------------------------------
# 3. precompute
# ------------------------------------------------------------------------------------------------

class GpuMemorySampler:
    """nvidia-smi every 100 ms: the peak memory of one process id, and the peak of the whole GPU
    (for containers whose nvidia-smi shows other process ids, or none); with `utilisation`, also
    each GPU's utilization.gpu samples (text_scale.py)."""

    def __init__(self, utilisation: bool = False) -> None:
        self.pid = None
        self.by_pid = {}
        self.total_peak = None
        self.total_before = None
        self.utilisation = {} if utilisation else None  # GPU index -> samples (%)
        self.procs = []
        self.threads = []

    @staticmethod
    def available() -> bool:
        return shutil.which("nvidia-smi") is not None

    @staticmethod
    def gpu_used_mib():
        r = subprocess.run(["nvidia-smi", "--query-gpu=memory.used",
                            "--format=csv,noheader,nounits"], capture_output=True, text=True,
                           timeout=30)
        vals = [float(v) for v in r.stdout.split() if re.fullmatch(r"[\d.]+", v)]
        return max(vals) if vals else None

    def start(self) -> None:
        self.total_before = self.gpu_used_mib()
        queries = {
            "apps": ["--query-compute-apps=pid,used_memory"],
            "total": ["--query-gpu=memory.used"],
        }
        if self.utilisation is not None:
            queries["util"] = ["--query-gpu=index,utilization.gpu"]
        for kind, q in queries.items():
            p = subprocess.Popen(["nvidia-smi", *q, "--format=csv,noheader,nounits", "-lms", "100"],
                                 stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
            th = threading.Thread(target=self._read, args=(kind, p), daemon=True)
            th.start()
            self.procs.append(p)
            self.threads.append(th)

    def _read(self, kind: str, p) -> None:
        for line in p.stdout:
            parts = [x.strip() for x in line.split(",")]
            try:
                if kind == "apps" and len(parts) == 2:
                    pid, mib = int(parts[0]), float(parts[1])
                    self.by_pid[pid] = max(self.by_pid.get(pid, 0.0), mib)
                elif kind == "total" and len(parts) == 1:
                    v = float(parts[0])
                    self.total_peak = v if self.total_peak is None else max(self.total_peak, v)
                elif kind == "util" and len(parts) == 2:
                    self.utilisation.setdefault(int(parts[0]), []).append(float(parts[1]))
            except ValueError:
                continue

    def stop(self) -> None:
        for p in self.procs:
            p.terminate()
        for p in self.procs:
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                p.kill()
        for th in self.threads:
            th.join(timeout=5)

    def utilisation_means(self) -> dict:
        """Mean utilization.gpu per GPU over the sampling, e.g. {"gpu0": 58.7}."""
        return {f"gpu{k}": round(sum(v) / len(v), 1)
                for k, v in sorted((self.utilisation or {}).items()) if v}

    def peak_for(self, pid: int):
        if pid in self.by_pid:
            return self.by_pid[pid], "nvidia-smi, process"
        if self.total_peak is not None and self.total_before is not None:
            return self.total_peak - self.total_before, "nvidia-smi, whole GPU minus before"
        return None, "unavailable"


def bench_precompute(binary: Path, model_dir: Path, manifest: Path, work: Path, name: str,
                     args) -> dict:
    out = work / f"precompute-out-{name}"
    shutil.rmtree(out, ignore_errors=True)
    encoder_path = model_dir
    if args.encoder_type == "torchscript":
        encoder_path = export_torchscript(model_dir, work)
    text = {"encoder": {"type": args.encoder_type, "path": str(encoder_path)},
            "device": args.device, "dtype": args.dtype, "batch_size": args.batch_size,
            "max_batch_tokens": args.max_batch_tokens, "pooling": "mean"}
    # The vocabulary is named although a bert folder has its own, so that the config is also
    # valid for encoder type torchscript (and for builds that need it named); an XLM-R folder's
    # tokenizer is its tokenizer.json, and naming a vocab.txt for it is refused.
    text["tokenizer"] = ({"vocab": str(model_dir / "vocab.txt")} if args.model == "bert"
                         else {})
    if args.max_length:
        text["tokenizer"]["max_length"] = args.max_length
    for kv in args.text_option:
        key, value = kv.split("=", 1)
        text[key] = json.loads(value)
    cfg = {"text": text, "input": {"manifest": str(manifest)},
           "output": {"path": str(out), "dtype": "float16", "shard_size": 8192},
           "run": {"progress_interval_s": 0}}
    cfg_path = work / f"precompute-{name}.yaml"
    cfg_path.write_text(json.dumps(cfg, indent=1))   # JSON is YAML
    prefix = Path(args.out) / f"precompute-{name}"   # its .log and .summary.json
    res = {"config": cfg, "log": str(prefix) + ".log", "out": str(out)}
    sampler = GpuMemorySampler() if (args.device.startswith("cuda")
                                     and GpuMemorySampler.available()) else None
    if sampler:
        sampler.start()
        time.sleep(0.3)
    failed = None
    try:
        run = precompute_run.run_precompute(binary, cfg_path, prefix, env=binary_env(binary),
                                            timeout=args.precompute_timeout)
    except precompute_run.PrecomputeFailed as e:
        run, failed = e.run, e
    if sampler:
        time.sleep(0.2)
        sampler.stop()
        res["peak_gpu_mib_sampled"], res["peak_gpu_source"] = sampler.peak_for(run.pid)
        res["gpu_seen_pids"] = sorted(sampler.by_pid)
    if run.timed_out:
        res["timed_out"] = True
    wall = run.wall_s
    res.update({"cmd": " ".join(run.cmd), "returncode": run.returncode, "wall_s": wall,
                "summary": run.figures() if failed is None else {}})
    if failed is not None:
        res["error_tail"] = run.error_tail()
        raise PrecomputeFailed(res)
    n = res["summary"].get("samples", 0)
    res["per_s_wall"] = n / wall if wall > 0 else None
    peak = res["summary"].get("peak_gpu_mib")
    if peak is not None:
        res["peak_gpu_mib"], res["peak_gpu_source"] = peak, "precompute summary"
    else:
        res["peak_gpu_mib"] = res.get("peak_gpu_mib_sampled")
    log(f"precompute {name}: {n:,} samples, wall {wall:.2f} s ({res['per_s_wall']:,.0f}/s), "
        f"own timer {res['summary'].get('seconds')} s ({res['summary'].get('per_s')}/s), "
        f"peak GPU {res.get('peak_gpu_mib')} MiB ({res.get('peak_gpu_source', '-')})")
    return res


def bench_precompute_runs(binary: Path, model_dir: Path, manifest: Path, work: Path, name: str,
                          args) -> dict:
    """bench_precompute --runs times; the last run's result (its output is the one the quality
    step reads) with the medians of the whole-process and the own-timer rates."""
    runs = [bench_precompute(binary, model_dir, manifest, work, name, args)
            for _ in range(args.runs)]
    res = runs[-1]
    walls = [x["per_s_wall"] for x in runs]
    owns = [x["summary"].get("per_s") for x in runs]
    res["runs_per_s_wall"], res["runs_per_s_own"] = walls, owns
    res["per_s_wall"] = float(np.median(walls))
    if all(v is not None for v in owns):
        res["summary"]["per_s"] = float(np.median(owns))
    if len(runs) > 1:
        log(f"precompute {name}, median of {len(runs)}: whole process {res['per_s_wall']:,.0f}/s "
            f"({', '.join(f'{v:,.0f}' for v in walls)}), run {res['summary'].get('per_s')}/s "
            f"({', '.join(str(v) for v in owns)})")
    return res


def export_torchscript(model_dir: Path, work: Path) -> Path:
    """For --encoder-type torchscript: the same weights as a TorchScript module returning the
    last hidden states (tools/scripts/export_encoders.py), exported once per model."""
    out = work / "bert-random.pt"
    if not out.exists() or out.stat().st_mtime < (model_dir / "model.safetensors").stat().st_mtime:
        sys.path.insert(0, str(ROOT / "tools" / "scripts"))
        import export_encoders
        export_encoders.export_bert(model_dir, out)
    return out


class PrecomputeFailed(RuntimeError):
    def __init__(self, res: dict):
        tail = res.get("error_tail", "").splitlines()
        errors = [ln for ln in tail if "[error]" in ln or "[critical]" in ln] or tail[-1:]
        super().__init__(f"precompute exited {res.get('returncode')}"
                         f"{' (timed out)' if res.get('timed_out') else ''}: "
                         f"{errors[-1].strip() if errors else '(no output)'} (log {res['log']})")
        self.res = res


# ------------------------------------------------------------------------------------------------
# 4. Reading precompute's output (h5py, or HDF5's C library through ctypes when h5py is absent)
# ------------------------------------------------------------------------------------------------

class Hdf5C:
    """The few HDF5 C calls needed to read numeric datasets whole, for machines without h5py.
    Reads each dataset with its own file type (no conversion) into a numpy buffer."""

    def __init__(self) -> None:
        import ctypes
        import ctypes.util
        self.c = ctypes
        names = [ctypes.util.find_library(n) for n in ("hdf5_serial", "hdf5")]
        names += ["libhdf5_serial.so.103", "libhdf5.so.103", "libhdf5_serial.so", "libhdf5.so"]
        lib = None
        for n in names:
            if not n:
                continue
            try:
                lib = ctypes.CDLL(n)
                break
            except OSError:
                continue
        if lib is None:
            raise RuntimeError("neither h5py nor HDF5's C library (libhdf5_serial) is available")
        hid, herr = ctypes.c_int64, ctypes.c_int
        lib.H5open.restype = herr
        lib.H5Fopen.restype, lib.H5Fopen.argtypes = hid, [ctypes.c_char_p, ctypes.c_uint, hid]
        lib.H5Dopen2.restype, lib.H5Dopen2.argtypes = hid, [hid, ctypes.c_char_p, hid]
        lib.H5Dget_space.restype, lib.H5Dget_space.argtypes = hid, [hid]
        lib.H5Dget_type.restype, lib.H5Dget_type.argtypes = hid, [hid]
        lib.H5Sget_simple_extent_ndims.restype = ctypes.c_int
        lib.H5Sget_simple_extent_ndims.argtypes = [hid]
        lib.H5Sget_simple_extent_dims.restype = ctypes.c_int
        lib.H5Sget_simple_extent_dims.argtypes = [hid, ctypes.POINTER(ctypes.c_uint64),
                                                  ctypes.c_void_p]
        lib.H5Tget_size.restype, lib.H5Tget_size.argtypes = ctypes.c_size_t, [hid]
        lib.H5Dread.restype = herr
        lib.H5Dread.argtypes = [hid, hid, hid, hid, hid, ctypes.c_void_p]
        for f in ("H5Dclose", "H5Sclose", "H5Tclose", "H5Fclose"):
            getattr(lib, f).restype, getattr(lib, f).argtypes = herr, [hid]
        lib.H5open()
        self.lib = lib

    def read(self, path: Path, dataset: str, dtype) -> np.ndarray:
        lib, c = self.lib, self.c
        f = lib.H5Fopen(str(path).encode(), 0, 0)            # H5F_ACC_RDONLY, H5P_DEFAULT
        if f < 0:
            raise RuntimeError(f"H5Fopen failed on {path}")
        try:
            d = lib.H5Dopen2(f, dataset.encode(), 0)
            if d < 0:
                raise RuntimeError(f"{path}: no dataset {dataset}")
            try:
                s, t = lib.H5Dget_space(d), lib.H5Dget_type(d)
                ndims = lib.H5Sget_simple_extent_ndims(s)
                dims = (c.c_uint64 * max(ndims, 1))()
                lib.H5Sget_simple_extent_dims(s, dims, None)
                shape = tuple(int(dims[i]) for i in range(ndims))
                if lib.H5Tget_size(t) != np.dtype(dtype).itemsize:
                    raise RuntimeError(f"{path}:{dataset}: element size {lib.H5Tget_size(t)}, "
                                       f"expected {np.dtype(dtype).itemsize}")
                buf = np.empty(shape, dtype=dtype)
                if buf.size and lib.H5Dread(d, t, 0, 0, 0, buf.ctypes.data) < 0:
                    raise RuntimeError(f"H5Dread failed on {path}:{dataset}")
                lib.H5Tclose(t)
                lib.H5Sclose(s)
                return buf
            finally:
                lib.H5Dclose(d)
        finally:
            lib.H5Fclose(f)


def read_text_output(out: Path, force_ctypes: bool = False) -> dict:
    """seq -> row of the stored text embeddings, over every shard of index.json."""
    index = json.loads((out / "index.json").read_text())
    seqs, embs, present, truncated = [], [], [], []
    h5 = None
    if not force_ctypes:
        try:
            import h5py
            h5 = h5py
        except ImportError:
            pass
    reader = None if h5 else Hdf5C()
    for shard in index["shards"]:
        path = out / shard["file"]
        if h5:
            with h5.File(path, "r") as f:
                seqs.append(f["seq"][:])
                embs.append(f["text/embeddings"][:])
                present.append(f["text/present"][:])
                truncated.append(f["text/truncated"][:])
        else:
            seqs.append(reader.read(path, "seq", np.int64))
            emb16 = reader.read(path, "text/embeddings", np.float16)
            embs.append(emb16.reshape(len(seqs[-1]), -1) if emb16.size else
                        emb16.reshape(len(seqs[-1]), 0))
            present.append(reader.read(path, "text/present", np.uint8))
            truncated.append(reader.read(path, "text/truncated", np.uint8))
    return {"seq": np.concatenate(seqs), "emb": np.concatenate(embs),
            "present": np.concatenate(present), "truncated": np.concatenate(truncated),
            "reader": "h5py" if h5 else "ctypes libhdf5"}


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a = a.astype(np.float64)
    b = b.astype(np.float64)
    return (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1) + 1e-30)


def quality(out_dir: Path, sub_idx, ref, force_ctypes: bool) -> dict:
    o = read_text_output(out_dir, force_ctypes)
    row_of = {int(s): r for r, s in enumerate(o["seq"])}
    rows = [row_of.get(int(i)) for i in sub_idx]
    ok = [k for k, r in enumerate(rows) if r is not None and o["present"][r] == 1]
    res = {"subsample": len(sub_idx), "compared": len(ok), "reader": o["reader"],
           "stored_rows": int(len(o["seq"])), "truncated": int(o["truncated"].sum()),
           "stored_dtype": str(o["emb"].dtype)}
    if ok:
        got = o["emb"][[rows[k] for k in ok]]
        c = cosines(got, ref.numpy()[ok])
        res.update({"cos_min": float(c.min()), "cos_mean": float(c.mean()),
                    "finite": bool(np.isfinite(got).all())})
    return res


# ------------------------------------------------------------------------------------------------
# 5. Report
# ------------------------------------------------------------------------------------------------

def fmt_rate(v) -> str:
    return "-" if v is None else f"{v:,.0f}"


def fmt_ratio(a, b) -> str:
    if a is None or not b:
        return "-"
    return f"{a / b:.2f}x"


def get(d: dict, *keys):
    for k in keys:
        if not isinstance(d, dict) or k not in d:
            return None
        d = d[k]
    return d


def report(r: dict, args) -> str:
    st, loop, pc, q = r.get("st", {}), r.get("loop", {}), r.get("precompute", {}), r.get("quality", {})
    rows = []

    def row(figure, value, target="", ratio="", ok=""):
        rows.append(precompute_run.table_row([figure, value, target, ratio, ok]))

    def yes(cond):
        return "-" if cond is None else ("yes" if cond else "**no**")

    # BERT's targets are issue 10's; XLM-R's is the ratio to the loop BERT-base has (3x short).
    targets = ((("short", 5.0, "st", "sentence-transformers"), ("long", 1.5, "loop", "tuned loop"))
               if args.model == "bert" else
               (("short", 3.0, "loop", "tuned loop"), ("long", 1.5, "loop", "tuned loop")))
    for name, factor, base_key, base_label in targets:
        n = args.short if name == "short" else args.long
        st_v = get(st, name, "per_s")
        loop_v = get(loop, name, "per_s")
        base = st_v if base_key == "st" else loop_v
        row(f"{name} ({n:,}): sentence-transformers {st.get('dtype', '')} bs{args.st_batch}",
            f"{fmt_rate(st_v)} /s", "", "1.00x" if st_v else "")
        row(f"{name}: tuned loop {loop.get('dtype', '')}, sorted, budget {args.loop_budget}",
            f"{fmt_rate(loop_v)} /s", "", fmt_ratio(loop_v, st_v))
        pc_wall = get(pc, name, "per_s_wall")
        target = factor * base if base else None
        row(f"{name}: precompute, wall clock (start-up included)", f"{fmt_rate(pc_wall)} /s",
            f">= {factor}x {base_label} = {fmt_rate(target)} /s",
            fmt_ratio(pc_wall, base), yes(None if pc_wall is None or target is None
                                          else pc_wall >= target))
        pc_own = get(pc, name, "summary", "per_s")
        row(f"{name}: precompute, its own timer (\"done:\" line)", f"{fmt_rate(pc_own)} /s", "",
            fmt_ratio(pc_own, base), "")
        for key, label in (("cos_min", "min"), ("cos_mean", "mean")):
            v = get(q, name, key)
            row(f"{name}: cosine {label}, precompute {args.dtype} -> float16 vs float32",
                "-" if v is None else f"{v:.6f}", ">= 0.999" if key == "cos_min" else "", "",
                yes(None if v is None else v >= 0.999) if key == "cos_min" else "")
        for key, label in (("loop_cos_min", "tuned loop"), ("st_cos_min", "sentence-transformers")):
            v = get(q, name, key)
            if v is not None:
                row(f"{name}: cosine min, {label} vs float32 (for reference)", f"{v:.6f}",
                    "", "", "")
    model_name = "XLM-R base" if args.model == "xlmr" else "BERT-base"
    for shape, res in (loop.get("model_only") or {}).items():
        row(f"{model_name} alone {shape} ({loop.get('dtype', '')})",
            f"{res['seq_per_s']:,.0f} seq/s ({res['tflops']:.0f} TFLOP/s)", "", "", "")
    for name in ("short", "long"):
        for label, d in (("sentence-transformers", st), ("tuned loop", loop)):
            v = get(d, name, "peak_mib")
            if v is not None:
                row(f"{name}: peak GPU memory, {label} (max_memory_allocated)", f"{v:,} MiB",
                    "", "", "")
        v = get(pc, name, "peak_gpu_mib")
        if v is not None:
            row(f"{name}: peak GPU memory, precompute ({get(pc, name, 'peak_gpu_source')})",
                f"{v:,.0f} MiB", "", "", "")
        v = get(pc, name, "summary", "peak_rss_mb")
        if v is not None:
            row(f"{name}: peak host RSS, precompute", f"{v:,.0f} MB", "", "", "")
    head = ["| figure | value | target | ratio vs baseline | met |",
            "|---|---:|---|---:|---|"]
    notes = [f"- {k}: {v}" for k, v in r.get("errors", {}).items()]
    text = "\n".join(head + rows)
    if notes:
        text += "\n\nFailed steps:\n" + "\n".join(notes)
    return text


# ------------------------------------------------------------------------------------------------

def parse_args():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda", help="cuda (the benchmark) or cpu (smoke test)")
    p.add_argument("--model", choices=["bert", "xlmr"], default="bert",
                   help="bert: BERT-base, English-like words; xlmr: XLM-RoBERTa base, captions "
                        "in 11 scripts (needs --xlmr-tokenizer)")
    p.add_argument("--xlmr-tokenizer", type=Path, default=ROOT / "bench-data" / "xlmr-tokenizer",
                   help="--model xlmr: the folder tools/scripts/xlmr_test_folders.py "
                        "--bench-data wrote (tokenizer.json.gz or tokenizer.json, "
                        "tokenizer_config.json)")
    p.add_argument("--short", type=int, default=100_000, help="short captions")
    p.add_argument("--long", type=int, default=10_000, help="long texts")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--runs", type=int, default=1,
                   help="timed runs of each peer and of precompute; the table gives medians")
    p.add_argument("--build", type=Path, default=ROOT / "build-gpu",
                   help="precompute build folder (its tools/cli/precompute runs)")
    p.add_argument("--binary", type=Path, help="the precompute binary (default: from --build)")
    p.add_argument("--work", type=Path, default=Path("/tmp/text-bench"),
                   help="data, model and outputs")
    p.add_argument("--out", default=os.environ.get("OUT", "/tmp/out"),
                   help="report folder (default: $OUT or /tmp/out)")
    p.add_argument("--encoder-type", default="bert",
                   help="precompute text.encoder.type: bert (the model folder), or torchscript "
                        "(the same weights exported with tools/scripts/export_encoders.py)")
    p.add_argument("--dtype", help="precompute text.dtype (default: bfloat16 on cuda, "
                                    "float32 on cpu)")
    p.add_argument("--batch-size", type=int, default=4096, help="precompute text.batch_size")
    p.add_argument("--max-batch-tokens", type=int, default=65536,
                   help="precompute text.max_batch_tokens")
    p.add_argument("--max-length", type=int, default=256,
                   help="tokens per text for every method (precompute: text.tokenizer."
                        "max_length; 0 leaves it out of the config)")
    p.add_argument("--text-option", action="append", default=[], metavar="KEY=JSON",
                   help="extra key of precompute's text section, e.g. output_layer=-1")
    p.add_argument("--precompute-timeout", type=float, default=180,
                   help="seconds per precompute run before it is killed")
    p.add_argument("--st-batch", type=int, default=256)
    p.add_argument("--loop-budget", type=int, default=65536, help="tuned loop: padded tokens")
    p.add_argument("--shapes", default=None,
                   help="model-alone shapes BxL,... (default 1024x16,128x256; cpu 16x16,2x256)")
    p.add_argument("--model-iters", type=int, default=None)
    p.add_argument("--ref-short", type=int, default=2000, help="quality subsample, short")
    p.add_argument("--ref-long", type=int, default=500, help="quality subsample, long")
    p.add_argument("--skip-baselines", action="store_true")
    p.add_argument("--skip-precompute", action="store_true")
    p.add_argument("--hdf5-ctypes", action="store_true",
                   help="read the output with libhdf5 through ctypes even when h5py exists")
    args = p.parse_args()
    gpu = args.device.startswith("cuda")
    args.dtype = args.dtype or ("bfloat16" if gpu else "float32")
    args.shapes = [tuple(int(v) for v in s.split("x"))
                   for s in (args.shapes or ("1024x16,128x256" if gpu else "16x16,2x256"))
                   .split(",")]
    args.model_iters = args.model_iters or (10 if gpu else 2)
    args.warmup = 4096 if gpu else 32
    if args.runs < 1:
        p.error(f"--runs {args.runs}: give 1 or more")
    return args


def main() -> int:
    args = parse_args()
    started = time.perf_counter()
    Path(args.out).mkdir(parents=True, exist_ok=True)
    args.work.mkdir(parents=True, exist_ok=True)
    binary = args.binary or args.build / "tools" / "cli" / "precompute"
    r = {"args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
         "errors": {}, "anchors_earlier_run": ANCHORS}

    def step(name, fn):
        t = time.perf_counter()
        try:
            v = fn()
            log(f"step {name}: {time.perf_counter() - t:.1f} s")
            return v
        except PrecomputeFailed as e:
            r["errors"][name] = str(e)
            r.setdefault("precompute_failures", {})[name] = e.res
            log(f"step {name} FAILED: {e}\n---- precompute's last lines ----\n"
                f"{e.res.get('error_tail', '')}\n----")
        except Exception as e:    # a failed step is reported; the others still run
            r["errors"][name] = f"{type(e).__name__}: {e}"
            log(f"step {name} FAILED: {type(e).__name__}: {e}\n{traceback.format_exc()}")
        return None

    import torch
    import transformers
    transformers.utils.logging.disable_progress_bar()
    env = {"python": sys.version.split()[0], "torch": torch.__version__,
           "transformers": transformers.__version__, "host": platform.node(),
           "cpus": os.cpu_count()}
    try:
        import sentence_transformers
        env["sentence_transformers"] = sentence_transformers.__version__
    except ImportError:
        pass
    if args.device.startswith("cuda"):
        if not torch.cuda.is_available():
            log("--device cuda but torch sees no GPU")
            return 1
        env["gpu"] = torch.cuda.get_device_name()
        torch.backends.cuda.matmul.allow_tf32 = True
    r["env"] = env
    log(f"env: {env}")

    data = step("data", lambda: make_data(args.work, args.short, args.long, args.seed,
                                          args.max_length, args.model, args.xlmr_tokenizer))
    if data is None:
        print(report(r, args))
        return 1
    texts, paths = data["texts"], data["paths"]
    r["data"] = {"short": texts["short"], "long": texts["long"]}   # dropped before saving
    r["data_info"] = {"model_dir": str(paths["model_dir"]), "reused": data["reused"],
                      "short_manifest": str(paths["short"]), "long_manifest": str(paths["long"]),
                      "vocab_size": data["vocab_size"],
                      "short_words_mean": float(np.mean([t.count(" ") + 1
                                                         for t in texts["short"]])),
                      "long_words_mean": float(np.mean([t.count(" ") + 1
                                                        for t in texts["long"]]))}
    rng = np.random.default_rng(args.seed + 1)
    sub = {name: np.sort(rng.choice(len(texts[name]), min(k, len(texts[name])), replace=False))
           for name, k in (("short", args.ref_short), ("long", args.ref_long))}
    sub_texts = {name: [texts[name][i] for i in sub[name]] for name in sub}

    if not args.skip_baselines:
        r["st"] = step("sentence_transformers",
                       lambda: bench_sentence_transformers(paths["model_dir"], texts, sub, args))
        r["loop"] = step("tuned_loop", lambda: bench_loop(paths["model_dir"], texts, sub, args))
    ref = step("reference_fp32", lambda: reference(paths["model_dir"], sub_texts, args))

    r["precompute"], r["quality"] = {}, {}
    if not args.skip_precompute:
        if not binary.exists():
            r["errors"]["precompute"] = f"{binary} does not exist (build it, or pass --build)"
            log(r["errors"]["precompute"])
        else:
            for name in ("short", "long"):
                res = step(f"precompute_{name}",
                           lambda n=name: bench_precompute_runs(binary, paths["model_dir"],
                                                                paths[n], args.work, n, args))
                if res is None:
                    continue
                r["precompute"][name] = res
                if ref is not None:
                    qres = step(f"quality_{name}",
                                lambda n=name, o=res["out"]: quality(Path(o), sub[n], ref[n],
                                                                     args.hdf5_ctypes))
                    if qres is not None:
                        r["quality"][name] = qres
                        log(f"quality {name}: {qres}")
    # The baselines against the same reference, for what bf16/fp16 costs in cosine.
    if ref is not None:
        for key, d in (("st", r.get("st")), ("loop", r.get("loop"))):
            for name in ("short", "long"):
                if get(d, name, "sub") is not None:
                    c = cosines(d[name]["sub"].numpy(), ref[name].numpy())
                    r["quality"].setdefault(name, {})[f"{key}_cos_min"] = float(c.min())
                    r["quality"][name][f"{key}_cos_mean"] = float(c.mean())

    table = report(r, args)
    r["seconds_total"] = time.perf_counter() - started
    header = (f"Text throughput, {env.get('gpu', args.device)}, torch {env['torch']}, "
              f"transformers {env['transformers']}, sentence-transformers "
              f"{env.get('sentence_transformers', '-')}; {args.short:,} short / {args.long:,} "
              f"long texts; medians of {args.runs} run(s); total {r['seconds_total']:.0f} s\n\n")
    print("\n" + header + table, flush=True)
    for d in (r.get("st"), r.get("loop")):
        for name in ("short", "long"):
            if get(d, name, "sub") is not None:
                del d[name]["sub"]
    del r["data"]
    out = Path(args.out)
    (out / "text_throughput.md").write_text(header + table + "\n")
    (out / "text_throughput.json").write_text(json.dumps(r, indent=1, default=str))
    log(f"wrote {out / 'text_throughput.md'} and {out / 'text_throughput.json'}")
    return 1 if r["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
