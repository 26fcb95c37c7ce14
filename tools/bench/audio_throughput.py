"""Audio throughput: precompute against torchcodec's AudioDecoder in DataLoader workers, same
tracks, same TorchScript model, same device, same run (tools/bench/run_gpu_media_bench.sh runs
it on the GPU machine; `--quick` is a small CPU smoke run).

Workload (issue 10): whole tracks (audio.window_s 0: one window per track), decoded, downmixed to
mono and resampled to 16 kHz, embedded by a small conv encoder (TorchScript, random weights, seed
0: [N, S] waveform + lengths [N] -> [N, 256], masked mean over time), one vector per track.
Tracks: AAC in MP4 and MP3 made here with the ffmpeg CLI (`--make-media DIR`, 44.1/48 kHz stereo,
30-120 s) plus 16-bit PCM WAV written by this script with numpy into its work folder at run time
(WAV is 10x the size of the compressed files, so it is not carried). The unique tracks are listed
again and again under distinct ids up to --tracks entries.

precompute: `run` with audio only, batch_size --batch (tracks of equal length share a forward
pass, others run one pass per length: see encoders/audio_encoder.cpp). Its HDF5 shards are read
back for the parity check.

The peer (the strongest Python path on the GPU machine, which has no torchaudio): torchcodec 0.17
`AudioDecoder(path, sample_rate=16000, num_channels=1).get_all_samples()` (FFmpeg decodes and
resamples) in --workers DataLoader workers, batches of --batch tracks grouped by length as
precompute does, the same model on the same device; vectors kept in memory (it writes nothing).

With --model whisper-base (issue 35's Whisper row): a whisper-base-sized model with random
weights (seed 0); precompute runs its `python -m precompute.export whisper-encoder` package for
--device in --dtype (log-mel front end inside, 30-s windows, the encoder's output averaged over
the frames that hold audio, windows averaged per track); the peer decodes the same way and then
does in Python what a transformers user writes: 30-s windows, WhisperFeatureExtractor on the
GPU, WhisperModel's encoder in --dtype, the same averages. --clips takes the audio tracks of
video clips (bench-data/h264_720p) in place of --media.

Figures, each the median of --runs runs: tracks/s and audio hours/s over the whole process (start
to exit: imports, model load, CUDA start-up, writing) and over the run alone (precompute's own
timer; the peer's loop from the first batch requested). Parity: cosine of precompute's vector
against the peer's per track (>= --min-cosine, default 0.99).

Prints one JSON line per measurement and a markdown table; writes $OUT/audio_bench.json and
$OUT/audio_bench.md. Exit 1 when a measurement failed or parity is below the bound.
"""
import argparse
import json
import math
import os
import random
import shutil
import statistics
import subprocess
import sys
import threading
import time
import wave
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import precompute_run  # noqa: E402  runs precompute and reads its summary

SAMPLE_RATE = 16000


# ------------------------------------------------------------------------------------------------
# Media
# ------------------------------------------------------------------------------------------------

def track_plan(n: int, seed: int, lo: float, hi: float) -> list:
    """(name, kind, rate, seconds) for n unique tracks: AAC in MP4 and MP3 alternate, every
    fourth is WAV."""
    rng = random.Random(seed)
    plan = []
    for i in range(n):
        kind = "wav" if i % 4 == 3 else ("mp4" if i % 2 == 0 else "mp3")
        rate = 44100 if i % 3 else 48000
        seconds = round(rng.uniform(lo, hi)) if hi >= 10 else round(rng.uniform(lo, hi), 2)
        plan.append((f"track{i:03d}.{kind}", kind, rate, seconds))
    return plan


def synth(i: int, rate: int, seconds: float):
    """A deterministic stereo signal: two glides, an amplitude envelope and noise, int16."""
    import numpy as np
    t = np.arange(int(rate * seconds)) / rate
    rng = np.random.default_rng(i)
    f0 = 150 + 40 * i
    left = 0.3 * np.sin(2 * np.pi * (f0 + 20 * t) * t) * (0.6 + 0.4 * np.sin(0.7 * t + i))
    right = 0.25 * np.sin(2 * np.pi * (1.5 * f0) * t + 0.3) * (0.6 + 0.4 * np.cos(0.5 * t))
    noise = 0.03 * rng.standard_normal((2, t.size))
    x = np.stack([left, right]) + noise
    return (np.clip(x, -1, 1) * 32767).astype("<i2").T.copy()


def write_wav(path: Path, i: int, rate: int, seconds: float) -> None:
    data = synth(i, rate, seconds)
    with wave.open(str(path), "wb") as w:
        w.setnchannels(2)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(data.tobytes())


def make_media(folder: Path, n: int, seed: int, lo: float, hi: float) -> None:
    """The compressed tracks with the ffmpeg CLI (from the same synthetic signal, through a WAV
    in a temporary file) and plan.json; WAV entries are written at run time (media_list)."""
    folder.mkdir(parents=True, exist_ok=True)
    plan = track_plan(n, seed, lo, hi)
    tmp = folder / ".tmp.wav"
    for i, (name, kind, rate, seconds) in enumerate(plan):
        if kind == "wav" or (folder / name).exists():
            continue
        write_wav(tmp, i, rate, seconds)
        codec = ["-c:a", "aac", "-b:a", "48k", "-movflags", "+faststart"] if kind == "mp4" \
            else ["-c:a", "libmp3lame", "-b:a", "48k"]
        subprocess.run(["ffmpeg", "-v", "error", "-y", "-i", str(tmp), *codec,
                        str(folder / name)], check=True)
    tmp.unlink(missing_ok=True)
    (folder / "plan.json").write_text(json.dumps({"seed": seed, "tracks": plan}))
    size = sum(p.stat().st_size for p in folder.iterdir())
    print(f"audio media: {len(plan)} tracks planned in {folder}, {size / 2**20:.1f} MiB")


def media_list(folder: Path, work: Path, count: int) -> tuple:
    """(files, seconds): --tracks entries cycling over the unique tracks of plan.json; the WAV
    ones written into work/wav when missing."""
    plan = json.loads((folder / "plan.json").read_text())["tracks"]
    wav_dir = work / "wav"
    wav_dir.mkdir(parents=True, exist_ok=True)
    unique = []
    for i, (name, kind, rate, seconds) in enumerate(plan):
        if kind == "wav":
            path = wav_dir / name
            if not path.exists():
                write_wav(path, i, rate, seconds)
        else:
            path = folder / name
            assert path.exists(), f"{path} is missing (run --make-media {folder})"
        unique.append((path.resolve(), float(seconds)))
    picks = [unique[k % len(unique)] for k in range(count)]
    return [p for p, _ in picks], [s for _, s in picks]


# ------------------------------------------------------------------------------------------------
# Model
# ------------------------------------------------------------------------------------------------

def export_audio_model(path: Path) -> Path:
    """A small conv encoder, scripted (variable length): a learned 25 ms / 10 ms filterbank and
    two strided convs, masked mean over the valid frames, a linear projection to 256."""
    if path.exists():
        return path
    import torch
    from torch import nn

    class ConvAudio(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = nn.Sequential(
                nn.Conv1d(1, 64, 400, stride=160), nn.ReLU(),
                nn.Conv1d(64, 128, 5, stride=2, padding=2), nn.ReLU(),
                nn.Conv1d(128, 256, 5, stride=2, padding=2), nn.ReLU())
            self.proj = nn.Linear(256, 256)

        def forward(self, wave: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
            x = self.conv(wave.unsqueeze(1))
            frames = x.shape[2]
            valid = torch.clamp((lengths * frames + wave.shape[1] - 1) // wave.shape[1], min=1)
            mask = torch.arange(frames, device=x.device)[None, :] < valid[:, None]
            pooled = (x * mask[:, None, :].to(x.dtype)).sum(2) / valid[:, None].to(x.dtype)
            return self.proj(pooled)

    torch.manual_seed(0)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.jit.script(ConvAudio().eval()).save(str(path))
    return path


# Whisper-base's encoder sizes (openai/whisper-base: 80 mel bins, 6 layers of 512).
WHISPER_BASE = dict(d_model=512, encoder_layers=6, encoder_attention_heads=8,
                    encoder_ffn_dim=2048, decoder_layers=1, decoder_attention_heads=8,
                    decoder_ffn_dim=2048, num_mel_bins=80, max_source_positions=1500)


def whisper_package(work: Path, device: str, dtype: str) -> tuple:
    """(a whisper-base-sized folder with random weights (seed 0) and its feature extractor's
    config, its `python -m precompute.export whisper-encoder` package for `device` and `dtype`,
    seconds the export took (0 when made before))."""
    folder = work / "whisper-base"
    if not (folder / "config.json").exists():
        import torch
        from transformers import WhisperConfig, WhisperFeatureExtractor, WhisperModel
        torch.manual_seed(0)
        WhisperModel(WhisperConfig(**WHISPER_BASE)).eval().save_pretrained(folder)
        WhisperFeatureExtractor(feature_size=80).save_pretrained(folder)
    kind = device.split(":")[0]
    package = work / f"whisper-base.{kind}.{dtype}.pt2"
    if package.exists():
        return folder, package, 0.0
    t = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "precompute.export", "whisper-encoder",
                        str(folder), str(package), "--device", kind, "--dtype", dtype],
                       env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2]
                                                        / "python")},
                       capture_output=True, text=True, timeout=1200)
    if r.returncode != 0:
        raise RuntimeError(f"whisper export: exit {r.returncode}: {r.stderr[-2000:]}")
    return folder, package, time.perf_counter() - t


def clip_media(clips: Path, count: int, seconds: float) -> tuple:
    """(files, seconds): --tracks entries cycling over the video clips of a folder (their audio
    tracks), each `seconds` long."""
    unique = sorted(p.resolve() for p in clips.iterdir()
                    if p.suffix in (".mp4", ".mkv", ".webm", ".mov"))
    assert unique, f"no clips in {clips}"
    picks = [unique[k % len(unique)] for k in range(count)]
    return picks, [seconds] * count


# ------------------------------------------------------------------------------------------------
# Measuring
# ------------------------------------------------------------------------------------------------

class TreeRss:
    """Peak of the summed RSS of a process and its descendants, polled from /proc."""

    def __init__(self, pid: int, interval: float = 0.1) -> None:
        self.pid, self.interval, self.peak = pid, interval, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()

    def _tree(self) -> list:
        children = {}
        for d in os.listdir("/proc"):
            if not d.isdigit():
                continue
            try:
                stat = Path(f"/proc/{d}/stat").read_text()
                ppid = int(stat.rsplit(")", 1)[1].split()[1])
                children.setdefault(ppid, []).append(int(d))
            except (OSError, ValueError, IndexError):
                pass
        out, todo = [], [self.pid]
        while todo:
            p = todo.pop()
            out.append(p)
            todo.extend(children.get(p, []))
        return out

    def _poll(self) -> None:
        page = os.sysconf("SC_PAGE_SIZE")
        while not self._stop.is_set():
            total = 0
            for p in self._tree():
                try:
                    total += int(Path(f"/proc/{p}/statm").read_text().split()[1]) * page
                except (OSError, ValueError, IndexError):
                    pass
            self.peak = max(self.peak, total)
            self._stop.wait(self.interval)

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        return self.peak


def run_process(cmd: list, env: dict, log: Path, timeout: float) -> tuple:
    """(wall seconds, stdout, peak tree RSS bytes); raises with the log's tail on failure."""
    t = time.perf_counter()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    rss = TreeRss(p.pid)
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        out, err = p.communicate()
    wall = time.perf_counter() - t
    peak = rss.stop()
    log.write_text(err)
    if p.returncode != 0:
        raise RuntimeError(f"{cmd[0]}: exit {p.returncode}: {err[-2000:]}")
    return wall, out, err, peak


def write_manifest(path: Path, rows: list) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def time_precompute(binary: Path, config: dict, work: Path, tag: str, timeout: float) -> dict:
    """One precompute run (work/TAG.yaml, .log, .summary.json): its samples, wall clock, own
    timer (from its summary) and the peak RSS of its process tree."""
    run = precompute_run.run_precompute(binary, config, work / tag, "--progress-interval", "0",
                                        timeout=timeout, watch=TreeRss)
    return {"n": run.samples, "whole_s": run.wall_s, "run_s": run.run_s,
            "peak_rss_mib": round(run.watched / 2**20), "summary": run.done_line()}


def read_shards(out: Path, modality: str) -> dict:
    import h5py
    vectors = {}
    for shard in sorted(out.glob("shard-*.h5")):
        with h5py.File(shard) as f:
            ids = f["ids"].asstr()[:]
            emb = f[f"{modality}/embeddings"][:]
            present = f[f"{modality}/present"][:] == 1
            vectors.update({i: e for i, e, ok in zip(ids, emb, present) if ok})
    return vectors


def cosines(a: dict, b: dict, centred: bool = False) -> dict:
    """Cosine per track of a's vector against b's; `centred`: each set less its own mean vector
    first (a random network's vectors are alike across tracks, which would let any output
    pass)."""
    import numpy as np
    vals = []
    shift = {}
    for name, vectors in (("a", a), ("b", b)):
        shift[name] = np.mean([np.asarray(v, np.float64) for v in vectors.values()], axis=0) \
            if centred and vectors else 0.0
    for k, v in a.items():
        if k in b:
            x = np.asarray(v, np.float64) - shift["a"]
            y = np.asarray(b[k], np.float64) - shift["b"]
            vals.append(float(x @ y / (np.linalg.norm(x) * np.linalg.norm(y) + 1e-30)))
    if not vals:
        return {"compared": 0, "min": None, "median": None}
    return {"compared": len(vals), "min": round(min(vals), 6),
            "median": round(statistics.median(vals), 6)}


# Both peers' decoding: each track whole, 16 kHz mono, by torchcodec in a DataLoader worker of
# one thread (`files` is the peer's list of tracks).
TRACKS = r'''
class Tracks(Dataset):
    def __len__(self):
        return len(files)
    def __getitem__(self, i):
        s = AudioDecoder(files[i], sample_rate=16000, num_channels=1).get_all_samples()
        return i, s.data[0].contiguous()

def one_thread(_):
    torch.set_num_threads(1)
'''

PEER = r'''
import json, sys, time
T0 = time.perf_counter()
import numpy as np, torch
from torch.utils.data import DataLoader, Dataset
from torchcodec.decoders import AudioDecoder
model, listing, device, workers, batch, out = sys.argv[1:7]
workers, batch = int(workers), int(batch)
files = open(listing).read().split("\n")[:-1]
''' + TRACKS + r'''
net = torch.jit.load(model, map_location=device).eval()
with torch.inference_mode():
    net(torch.zeros(1, 16000, device=device), torch.full((1,), 16000, device=device))
if device.startswith("cuda"):
    torch.cuda.synchronize()
loader = DataLoader(Tracks(), batch_size=batch, num_workers=workers, collate_fn=list,
                    worker_init_fn=one_thread if workers else None, pin_memory=False)
vectors = [None] * len(files)
samples = 0
t = time.perf_counter()
with torch.inference_mode():
    for items in loader:
        groups = {}
        for i, w in items:  # equal lengths share a pass, as in precompute
            groups.setdefault(w.numel(), []).append((i, w))
        for n, members in groups.items():
            x = torch.stack([w for _, w in members]).to(device, non_blocking=True)
            y = net(x, torch.full((len(members),), n, dtype=torch.long, device=device))
            y = y.float().cpu()
            for k, (i, _) in enumerate(members):
                vectors[i] = y[k]
            samples += n * len(members)
run_s = time.perf_counter() - t
np.save(out, torch.stack(vectors).numpy())
try:
    from torchcodec._core import get_ffmpeg_library_versions
    ffmpeg = get_ffmpeg_library_versions().get("ffmpeg_version")
except Exception:
    ffmpeg = None
print(json.dumps({"run_s": run_s, "samples": samples, "start_s": t - T0, "ffmpeg": ffmpeg}))
'''


# The Whisper peer: the same decoding in DataLoader workers, then per batch what a user of
# transformers writes: each track cut into 30-s windows, WhisperFeatureExtractor on the GPU
# (its PyTorch STFT, `device=`), WhisperModel's encoder in the dtype asked, its output averaged
# over the frames that hold audio (ceil(samples / 320)), the windows of a track averaged.
PEER_WHISPER = r'''
import json, math, sys, time
T0 = time.perf_counter()
import numpy as np, torch
from torch.utils.data import DataLoader, Dataset
from torchcodec.decoders import AudioDecoder
from transformers import WhisperFeatureExtractor, WhisperModel
folder, listing, device, workers, batch, out, dtype = sys.argv[1:8]
workers, batch, dtype = int(workers), int(batch), getattr(torch, dtype)
files = open(listing).read().split("\n")[:-1]
WINDOW = 30 * 16000
''' + TRACKS + r'''
extractor = WhisperFeatureExtractor.from_pretrained(folder)
encoder = WhisperModel.from_pretrained(folder, torch_dtype=dtype).get_encoder().to(device).eval()

def embed(windows):
    feats = extractor([w.numpy() for w in windows], sampling_rate=16000, return_tensors="pt",
                      device=device).input_features.to(device, dtype)
    hidden = encoder(feats).last_hidden_state.float()
    frames = torch.tensor([max(1, math.ceil(w.numel() / 320)) for w in windows], device=device)
    mask = torch.arange(hidden.shape[1], device=device)[None, :] < frames[:, None]
    return (hidden * mask[..., None]).sum(1) / frames[:, None]

with torch.inference_mode():
    embed([torch.zeros(16000)])
if device.startswith("cuda"):
    torch.cuda.synchronize()
loader = DataLoader(Tracks(), batch_size=batch, num_workers=workers, collate_fn=list,
                    worker_init_fn=one_thread if workers else None)
vectors = [None] * len(files)
samples = 0
t = time.perf_counter()
with torch.inference_mode():
    for items in loader:
        owners, windows = [], []
        for i, w in items:
            for s in range(0, max(1, w.numel()), WINDOW):
                owners.append(i)
                windows.append(w[s:s + WINDOW])
            samples += w.numel()
        for s in range(0, len(windows), batch):
            y = embed(windows[s:s + batch]).cpu()
            for k, i in enumerate(owners[s:s + batch]):
                vectors[i] = y[k:k + 1] if vectors[i] is None else torch.cat([vectors[i], y[k:k + 1]])
run_s = time.perf_counter() - t
np.save(out, torch.stack([v.mean(0) for v in vectors]).numpy())
print(json.dumps({"run_s": run_s, "samples": samples, "start_s": t - T0, "ffmpeg": None}))
'''


def peer_env(extra_path: str) -> dict:
    """The peer's environment: torchcodec's folder first on PYTHONPATH, and the FFmpeg it loads
    (one with libavfilter and libavdevice, unlike precompute's GPU build) first on
    LD_LIBRARY_PATH (PEER_LD_LIBRARY_PATH)."""
    env = dict(os.environ)
    for var, extra in (("PYTHONPATH", extra_path),
                       ("LD_LIBRARY_PATH", os.environ.get("PEER_LD_LIBRARY_PATH", ""))):
        if extra:
            env[var] = extra + (":" + env[var] if env.get(var) else "")
    return env


def run_peer(args, model: Path, files: list, tag: str) -> tuple:
    """The torchcodec peer with the conv model (`model` its TorchScript file) or, with --model
    whisper-base, with the transformers model (`model` its folder)."""
    listing = args.work / "peer-files.txt"
    listing.write_text("".join(f"{f}\n" for f in files))
    whisper = args.model == "whisper-base"
    script = args.work / ("peer_whisper.py" if whisper else "peer_audio.py")
    script.write_text(PEER_WHISPER if whisper else PEER)
    out = args.work / f"{tag}.npy"
    wall, stdout, _, peak = run_process(
        [sys.executable, str(script), str(model), str(listing), args.device, str(args.workers),
         str(args.batch), str(out)] + ([args.dtype] if whisper else []),
        peer_env(args.peer_path), args.work / f"{tag}.log", args.timeout)
    got = json.loads(stdout.strip().splitlines()[-1])
    import numpy as np
    vec = np.load(out)
    return ({"n": len(files), "whole_s": wall, "run_s": got["run_s"],
             "peak_rss_mib": round(peak / 2**20), "samples_16k": got["samples"],
             "ffmpeg": got.get("ffmpeg")},
            {f"a{i:06d}": vec[i] for i in range(len(files))})


def summarise(who: str, runs: list, hours: float) -> dict:
    med = lambda key: statistics.median(r["n"] / r[key] for r in runs)  # noqa: E731
    n = runs[0]["n"]
    return {"who": who, "tracks": n, "audio_hours": round(hours, 3), "runs": len(runs),
            "whole_tracks_per_s": round(med("whole_s"), 2),
            "run_tracks_per_s": round(med("run_s"), 2),
            "whole_audio_h_per_s": round(med("whole_s") * hours / n, 4),
            "run_audio_h_per_s": round(med("run_s") * hours / n, 4),
            "peak_rss_mib": max(r["peak_rss_mib"] for r in runs), "each": runs}


def table(rows: list, unit: str) -> str:
    lines = [f"| who | runs | whole {unit}/s | run {unit}/s | whole audio h/s | run audio h/s "
             "| peak RSS MiB |", "|---|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(precompute_run.table_row(
            [r["who"], r["runs"], r["whole_tracks_per_s"], r["run_tracks_per_s"],
             r["whole_audio_h_per_s"], r["run_audio_h_per_s"], r["peak_rss_mib"]]))
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--make-media", type=Path, metavar="DIR",
                    help="write the compressed tracks and plan.json into DIR (ffmpeg CLI), exit")
    ap.add_argument("--unique", type=int, default=24, help="unique tracks (--make-media)")
    ap.add_argument("--min-s", type=float, default=30)
    ap.add_argument("--max-s", type=float, default=120)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--binary", type=Path, default=Path("build/tools/cli/precompute"))
    ap.add_argument("--media", type=Path, default=Path("bench-data/audio"))
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "/tmp/out")))
    ap.add_argument("--work", type=Path, default=Path("/tmp/audio-bench"))
    ap.add_argument("--tracks", type=int, default=200)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--workers", type=int, default=max(1, (os.cpu_count() or 2) - 1))
    ap.add_argument("--dtype", default="float32", help="precompute's audio.dtype (peer: float32)")
    ap.add_argument("--peer-path", default=os.environ.get("PEER_PYTHONPATH", ""),
                    help="PYTHONPATH entry holding torchcodec (for the peer only)")
    ap.add_argument("--no-peer", action="store_true")
    ap.add_argument("--min-cosine", type=float, default=0.99)
    ap.add_argument("--timeout", type=float, default=900)
    ap.add_argument("--model", choices=("conv", "whisper-base"), default="conv",
                    help="whisper-base: a whisper-base-sized encoder with random weights, "
                         "precompute running its `precompute.export whisper-encoder` package "
                         "in --dtype, the peer transformers' feature extractor and encoder")
    ap.add_argument("--clips", type=Path,
                    help="the audio tracks of these video clips instead of --media (cycled "
                         "up to --tracks entries)")
    ap.add_argument("--clip-seconds", type=float, default=10,
                    help="each clip's length, for the audio hours (bench-data/h264_720p: 10)")
    ap.add_argument("--quick", action="store_true",
                    help="CPU smoke run: 8 unique 3-8 s tracks made here, 16 entries, 1 run")
    args = ap.parse_args(argv)

    if args.make_media:
        make_media(args.make_media, args.unique, args.seed, args.min_s, args.max_s)
        return 0
    if args.quick:
        args.device, args.tracks, args.runs, args.workers = "cpu", 16, 1, 2
        args.batch = 4
        args.media = args.work / "media-quick"
        make_media(args.media, 8, args.seed, 3, 8)
    args.work.mkdir(parents=True, exist_ok=True)
    args.out.mkdir(parents=True, exist_ok=True)
    export_s = None
    if args.model == "whisper-base":
        peer_model, model, export_s = whisper_package(args.work, args.device, args.dtype)
    else:
        model = peer_model = export_audio_model(args.work / "audio_conv.pt")
    if args.clips:
        files, seconds = clip_media(args.clips, args.tracks, args.clip_seconds)
    else:
        files, seconds = media_list(args.media, args.work, args.tracks)
    hours = sum(seconds) / 3600
    ids = [f"a{i:06d}" for i in range(len(files))]
    manifest = args.work / "manifest.jsonl"
    write_manifest(manifest, [{"id": i, "audio": str(f)} for i, f in zip(ids, files)])
    print(json.dumps({"tracks": len(files), "unique": len(set(files)),
                      "audio_hours": round(hours, 3), "device": args.device,
                      "model": args.model, "export_s": export_s}), flush=True)

    results, failed, vectors = [], 0, {}
    out = args.work / "out-precompute"
    config = {
        "input": {"manifest": str(manifest)},
        "output": {"path": str(out), "overwrite": True, "dtype": "float32"},
        "run": {"device": [args.device]},
        "audio": {"encoder": {"path": str(model)}, "dtype": args.dtype,
                  "batch_size": args.batch, "sample_rate": SAMPLE_RATE, "window_s": 0,
                  "pooling": "mean"},
    }
    if args.model == "whisper-base":  # the package says its sample rate and 30-s window
        for key in ("sample_rate", "window_s"):
            del config["audio"][key]
    try:
        runs = [time_precompute(args.binary, config, args.work, f"precompute-{k}", args.timeout)
                for k in range(args.runs)]
        results.append(summarise(f"precompute {args.model} ({args.device}, batch {args.batch})",
                                 runs, hours))
        vectors["precompute"] = read_shards(out, "audio")
    except Exception as e:  # the table says what failed; the peer still runs
        failed += 1
        print(json.dumps({"who": "precompute", "error": str(e)[-1500:]}), flush=True)
    if not args.no_peer:
        try:
            runs, vec = [], None
            for k in range(args.runs):
                r, vec = run_peer(args, peer_model, files, f"peer-{k}")
                runs.append(r)
            results.append(summarise(f"torchcodec AudioDecoder, {args.workers} DataLoader "
                                     f"workers, {args.model} ({args.device}, batch {args.batch})",
                                     runs, hours))
            vectors["peer"] = vec
        except Exception as e:
            failed += 1
            print(json.dumps({"who": "torchcodec", "error": str(e)[-1500:]}), flush=True)
    for r in results:
        print(json.dumps({k: v for k, v in r.items() if k != "each"}), flush=True)
    parity = None
    if "precompute" in vectors and "peer" in vectors:
        parity = cosines(vectors["precompute"], vectors["peer"])
        parity["centred"] = cosines(vectors["precompute"], vectors["peer"], centred=True)
        parity["bound"] = args.min_cosine
        parity["ok"] = parity["compared"] == len(files) and parity["min"] >= args.min_cosine
        print(json.dumps({"parity": parity}), flush=True)
        if not parity["ok"]:
            failed += 1
    report = {"workload": {"tracks": len(files), "unique": len(set(files)),
                           "audio_hours": round(hours, 4), "device": args.device,
                           "batch": args.batch, "workers": args.workers, "dtype": args.dtype,
                           "window_s": 30 if args.model == "whisper-base" else 0,
                           "sample_rate": SAMPLE_RATE, "runs": args.runs,
                           "model": args.model, "export_s": export_s,
                           "quick": args.quick},
              "results": results, "parity": parity, "failed": failed}
    (args.out / "audio_bench.json").write_text(json.dumps(report, indent=1))
    md = table(results, "tracks")
    if parity:
        md += (f"\n\nParity (cosine per track, precompute vs peer): min {parity['min']}, "
               f"median {parity['median']} over {parity['compared']} tracks "
               f"({'ok' if parity['ok'] else 'BELOW'} {args.min_cosine}).")
    (args.out / "audio_bench.md").write_text(md + "\n")
    print("\n" + md)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
