"""How fast precompute tokenizes multilingual captions with an XLM-R (Unigram) tokenizer, against
transformers' XLMRobertaTokenizer (the Rust `tokenizers` library underneath) on the same texts
and threads, in one run; the ids are compared too.

The tokenizer folder is what `python tools/scripts/xlmr_test_folders.py --sized OUT` writes to
OUT/sized (XLM-R's 250,002 pieces); the captions are the text benchmark's short multilingual ones
(tools/bench/text_throughput.py --model xlmr). precompute is `precompute tokenize --model DIR
--file FILE --stats --threads T`: its own timer (tokenizing only) and the process's wall clock.
transformers is one batch call `tokenizer(texts, truncation=True, max_length=512)` in a fresh
process with RAYON_NUM_THREADS=T. Each figure is the median of --runs.

    .venv/bin/python tools/bench/unigram_tokenizer_rate.py --binary build/tools/cli/precompute \\
        --folder /tmp/xs/sized --texts 100000 --threads 1,2 --runs 3
"""

import argparse
import json
import os
import random
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools" / "scripts"))

PYTHON_SIDE = r"""
import json, sys, time
from transformers import AutoTokenizer
tok = AutoTokenizer.from_pretrained(sys.argv[1])
texts = open(sys.argv[2], encoding="utf-8").read().split("\n")[:-1]
tok(texts[:1000], truncation=True, max_length=512)
t = time.perf_counter()
ids = tok(texts, truncation=True, max_length=512)["input_ids"]
seconds = time.perf_counter() - t
if len(sys.argv) > 3:
    with open(sys.argv[3], "w") as f:
        for row in ids[:10000]:
            f.write(json.dumps(row) + "\n")
print(json.dumps({"seconds": seconds, "texts": len(texts)}))
"""


def captions(n: int, seed: int):
    import make_multilingual_corpus
    maker = make_multilingual_corpus.Maker(seed)
    rng = random.Random(seed)
    scripts = sorted(make_multilingual_corpus.WORDS)
    return [maker.sentence(rng.choice(scripts)) if rng.random() < 0.7 else maker.mixed()
            for _ in range(n)]


def precompute_rate(binary: Path, folder: Path, texts: Path, threads: int):
    t = time.perf_counter()
    out = subprocess.run([str(binary), "tokenize", "--model", str(folder), "--file", str(texts),
                          "--stats", "--threads", str(threads), "--max-length", "512"],
                         capture_output=True, text=True, check=True)
    wall = time.perf_counter() - t
    own = re.search(r"([\d,.]+) texts/s", out.stdout)
    return float(own.group(1).replace(",", "")), wall


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--binary", type=Path, required=True)
    ap.add_argument("--folder", type=Path, required=True)
    ap.add_argument("--texts", type=int, default=100_000)
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--work", type=Path, default=Path("/tmp/unigram-rate"))
    ap.add_argument("--python", default=sys.executable)
    args = ap.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    texts = captions(args.texts, args.seed)
    text_file = args.work / "captions.txt"
    text_file.write_text("".join(t + "\n" for t in texts), encoding="utf-8")

    # The ids, on the first 10,000 captions.
    reference = args.work / "reference.jsonl"
    subprocess.run([args.python, "-c", PYTHON_SIDE, str(args.folder), str(text_file),
                    str(reference)], check=True, capture_output=True)
    sample = args.work / "sample.txt"
    sample.write_text("".join(t + "\n" for t in texts[:10000]), encoding="utf-8")
    shown = subprocess.run([str(args.binary), "tokenize", "--model", str(args.folder), "--file",
                            str(sample), "--json", "--max-length", "512"],
                           capture_output=True, text=True, check=True).stdout.splitlines()
    expected = reference.read_text().splitlines()
    equal = sum(json.loads(a)["ids"] == json.loads(b) for a, b in zip(shown, expected))
    result = {"texts": args.texts, "ids_equal": f"{equal} of {len(expected)}", "rows": []}
    print(f"ids equal to transformers on {equal} of {len(expected)} captions", flush=True)

    for threads in [int(t) for t in args.threads.split(",")]:
        ours, wall, theirs = [], [], []
        for _ in range(args.runs):
            own, seconds = precompute_rate(args.binary, args.folder, text_file, threads)
            ours.append(own)
            wall.append(args.texts / seconds)
            env = {**os.environ, "RAYON_NUM_THREADS": str(threads),
                   "TOKENIZERS_PARALLELISM": "true"}
            out = subprocess.run([args.python, "-c", PYTHON_SIDE, str(args.folder),
                                  str(text_file)], capture_output=True, text=True, check=True,
                                 env=env)
            theirs.append(args.texts / json.loads(out.stdout.splitlines()[-1])["seconds"])
        row = {"threads": threads, "precompute_per_s": statistics.median(ours),
               "precompute_whole_process_per_s": statistics.median(wall),
               "transformers_per_s": statistics.median(theirs), "runs": args.runs,
               "all": {"precompute": ours, "whole": wall, "transformers": theirs}}
        row["ratio"] = row["precompute_per_s"] / row["transformers_per_s"]
        result["rows"].append(row)
        print(f"{threads} thread(s): precompute {row['precompute_per_s']:,.0f} texts/s "
              f"(whole process {row['precompute_whole_process_per_s']:,.0f}), transformers "
              f"{row['transformers_per_s']:,.0f} texts/s: {row['ratio']:.2f}x", flush=True)
    (args.work / "unigram_tokenizer_rate.json").write_text(json.dumps(result, indent=1))
    return 0 if equal == len(expected) else 1


if __name__ == "__main__":
    sys.exit(main())
