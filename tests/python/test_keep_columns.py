"""output.keep_columns: manifest columns stored per sample as strings next to the vectors
(/columns/<name> of every shard, row-aligned with /ids), so that a trainer needs no second join.
End to end through the CLI: JSONL and CSV manifests, values that are not strings, lines without
the column, failed samples, the one-file view, verify, the Python reader and collate, names and
values that are refused before any work, and resumes (another list, an edited value,
--retry-failed, --overwrite)."""

import json
import shutil
from pathlib import Path

import h5py
import pytest

from conftest import run_precompute, sine_file, write_manifest

KEEP = ["label", "split", "50% off"]


def config_for(manifest: Path, out: Path, probes: Path, minilm: Path, keep=None) -> dict:
    config = {
        "input": {"manifest": str(manifest)},
        "output": {"path": str(out), "shard_size": 2},
        "run": {"decode_threads": 2},
        "audio": {"encoder": {"path": str(probes / "audio_probe.pt")}, "sample_rate": 16000},
        "text": {"encoder": {"path": str(probes / "text_pooled_probe.pt")}, "pooling": "model",
                 "tokenizer": {"vocab": str(minilm / "vocab.txt")}},
    }
    if keep is not None:
        config["output"]["keep_columns"] = keep
    return config


def make_samples(root: Path):
    """Seven samples over four shards: values of every JSON kind, a line without the columns,
    a sample whose every modality fails (only in /failures), and one whose audio is missing."""
    sine_file(root / "a.wav", 300, 0.5)
    audio = str(root / "a.wav")
    return [
        {"id": "s0", "audio": audio, "text": "zero", "label": "cat", "split": "train",
         "50% off": "yes"},
        {"id": "s1", "text": "one", "label": 3, "split": None, "50% off": True},
        {"id": "s2", "audio": str(root / "missing.wav"), "label": "gone"},  # every modality fails
        {"id": "s3", "text": "three"},  # no kept column at all: ""
        {"id": "s4", "text": "four", "label": ["a", 2], "split": {"k": 1.5}, "50% off": "caf\u00e9 \u2615"},
        {"id": "s5", "audio": str(root / "late.wav"), "text": "five", "label": "dog",
         "split": "val"},  # its audio is missing until the --retry-failed test adds it
        {"id": "s6", "text": "six", "label": "", "split": "test", "50% off": "x"},
    ]


EXPECTED = {  # what each embedded sample stores, in KEEP's order
    "s0": ["cat", "train", "yes"],
    "s1": ["3", "", "true"],
    "s3": ["", "", ""],
    "s4": ['["a", 2]', '{"k": 1.5}', "caf\u00e9 \u2615"],  # as json.dumps wrote them
    "s5": ["dog", "val", ""],
    "s6": ["", "test", "x"],
}


@pytest.fixture(scope="module")
def made(binary, probes, minilm_folder, tmp_path_factory):
    root = tmp_path_factory.mktemp("keep")
    manifest = write_manifest(root / "manifest.jsonl", make_samples(root))
    out = root / "out"
    config = config_for(manifest, out, probes, minilm_folder, KEEP)
    run_precompute(binary, root, config)
    return root, manifest, out, config


def shard_columns(out: Path):
    """(ids, {name: values}) of every shard in index order, read with plain h5py."""
    index = json.loads((out / "index.json").read_text())
    ids, columns = [], {name: [] for name in KEEP}
    for shard in index["shards"]:
        with h5py.File(out / shard["file"], "r") as f:
            shard_ids = list(f["ids"].asstr()[:])
            ids += shard_ids
            assert sorted(f["columns"].keys()) == sorted(KEEP)
            for name in KEEP:
                d = f["columns"][name]
                assert d.shape == (len(shard_ids),)
                assert h5py.check_string_dtype(d.dtype).encoding == "utf-8"
                columns[name] += list(d.asstr()[:])
    return ids, columns


def datasets_of(shard: Path) -> dict:
    """Every dataset of a shard, as bytes."""
    out = {}
    with h5py.File(shard, "r") as f:
        f.visititems(lambda name, obj: out.__setitem__(name, obj[()].tobytes() if obj.dtype.kind
                                                        != "O" else list(obj.asstr()[()]))
                     if isinstance(obj, h5py.Dataset) else None)
    return out


def test_kept_columns_are_strings_aligned_with_ids(made):
    _, _, out, _ = made
    ids, columns = shard_columns(out)
    assert ids == list(EXPECTED)  # s2 failed everywhere: only in /failures
    for i, sample_id in enumerate(ids):
        assert [columns[name][i] for name in KEEP] == EXPECTED[sample_id], sample_id
    index = json.loads((out / "index.json").read_text())
    assert index["config"]["output"]["keep_columns"] == KEEP
    with h5py.File(out / index["shards"][1]["file"], "r") as f:  # s2 and s3
        assert "columns" not in f["failures"]


# Values that are not JSON strings, as a manifest writes them: each must be stored as these bytes,
# not as a parser's number or tree written out again (-0, 1E5 and [1, 2] came back as 0, 100000.0
# and [1,2]). The last is a JSON string: stored decoded.
AS_WRITTEN = ["1e+20", "100.0", "1.1", "-0", "1E5", "1e-400", "123456789012345678901234567890",
              "[1, 2]", '{"a": 1.0}', "true", "false", "{ }", '[ [ [] ] ,\t{"k": 1, "k": 2} ]',
              '"caf\\u00e9 \\ud83d\\ude00"']


def test_kept_values_are_the_bytes_the_line_writes(binary, probes, minilm_folder, tmp_path):
    lines = [f'{{"id": "v{i}", "text": "t", "num" :  {value}  , "after": 1}}'
             for i, value in enumerate(AS_WRITTEN)]
    manifest = tmp_path / "m.jsonl"
    manifest.write_bytes("\n".join(lines).encode() + b"\n")
    out = tmp_path / "out"
    config = config_for(manifest, out, probes, minilm_folder, ["num"])
    del config["audio"]
    run_precompute(binary, tmp_path, config)
    stored = {}
    index = json.loads((out / "index.json").read_text())
    for shard in index["shards"]:
        with h5py.File(out / shard["file"], "r") as f:
            stored.update(zip(f["ids"].asstr()[:], f["columns/num"][:]))  # raw bytes
    assert len(stored) == len(AS_WRITTEN)
    for i, value in enumerate(AS_WRITTEN):
        # The line's own bytes between '"num" :  ' and '  , "after"'.
        line = lines[i].encode()
        start = line.index(b'"num" :  ') + len(b'"num" :  ')
        written = line[start:line.index(b'  , "after"')]
        expected = json.loads(written).encode() if written.startswith(b'"') else written
        assert stored[f"v{i}"] == expected, value


@pytest.mark.parametrize("keep", [["label"], None])
def test_a_repeated_key_exits_65_naming_the_manifest_line_and_key(binary, probes, minilm_folder,
                                                                  tmp_path, keep):
    # Kept or not, a key written twice has no one value: readers keep the first, or the last.
    manifest = tmp_path / "m.jsonl"
    manifest.write_text('{"id": "a", "text": "x", "label": 1}\n'
                        '{"id": "b", "text": "y", "label": 1, "\\u006cabel": 2}\n')
    out = tmp_path / "out"
    config = config_for(manifest, out, probes, minilm_folder, keep)
    result = run_precompute(binary, tmp_path, config, expect=65)
    assert str(manifest) in result.stderr, result.stderr
    assert "line 2: the key 'label' appears twice" in result.stderr, result.stderr
    assert not out.exists() or not any(out.iterdir())


def test_the_one_file_view_maps_the_columns(made):
    _, _, out, _ = made
    ids, columns = shard_columns(out)
    with h5py.File(out / "dataset.h5", "r") as f:
        assert list(f["ids"].asstr()[:]) == ids
        for name in KEEP:
            assert list(f["columns"][name].asstr()[:]) == columns[name], name


def test_verify_reads_the_columns_and_accepts_the_output(binary, made):
    import subprocess
    _, manifest, out, _ = made
    for extra in ([], ["--input", str(manifest)]):
        result = subprocess.run([str(binary), "verify", str(out), "--json", *extra],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert result.returncode == 0, result.stdout + result.stderr


def test_verify_finds_a_column_with_the_wrong_row_count(binary, made, tmp_path):
    import subprocess
    _, _, out, _ = made
    copy = tmp_path / "out"
    shutil.copytree(out, copy)
    index = json.loads((copy / "index.json").read_text())
    shard = copy / index["shards"][0]["file"]
    with h5py.File(shard, "a") as f:
        del f["columns/split"]
        f["columns"].create_dataset("split", data=["only one"], dtype=h5py.string_dtype(),
                                    maxshape=(None,))
    # Keep size and sha256 consistent, so that the scan, not the hash, has to find it.
    import hashlib
    data = shard.read_bytes()
    entry = index["shards"][0]
    entry["bytes"], entry["sha256"] = len(data), hashlib.sha256(data).hexdigest()
    from conftest import index_checksum
    index["checksum"] = index_checksum(index)
    (copy / "index.json").write_text(json.dumps(index))
    result = subprocess.run([str(binary), "verify", str(copy)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    assert result.returncode == 74, result.stdout + result.stderr
    assert "/columns/split has 1 rows for 2 ids" in result.stdout + result.stderr


def test_reader_items_and_collate_carry_the_columns(made):
    from precompute import ShardDataset, ShardIterableDataset, collate
    _, _, out, _ = made
    data = ShardDataset(out)
    items = [data[i] for i in range(len(data))]
    assert [it["id"] for it in items] == list(EXPECTED)
    for it in items:
        assert it["columns"] == dict(zip(KEEP, EXPECTED[it["id"]]))
    batch = collate(items[1:4])
    assert batch["columns"] == {name: [EXPECTED[i][k] for i in batch["id"]]
                                for k, name in enumerate(KEEP)}
    assert batch["text"]["embedding"].shape[0] == 3
    streamed = list(ShardIterableDataset(out, shuffle=False))
    assert [it["columns"] for it in streamed] == [it["columns"] for it in items]


def test_csv_and_tsv_keep_columns_matched_as_their_headers_are(binary, probes, minilm_folder,
                                                               tmp_path):
    for delimiter, suffix in ((",", "csv"), ("\t", "tsv")):
        manifest = tmp_path / f"m.{suffix}"
        rows = [["id", "text", "Label", "split"], ["a", "alpha", "cat", "train"],
                ["b", "beta", '"dog, big"' if delimiter == "," else "dog, big", ""]]
        manifest.write_text("\n".join(delimiter.join(r) for r in rows) + "\n")
        out = tmp_path / f"out-{suffix}"
        config = config_for(manifest, out, probes, minilm_folder, ["label", "split"])
        del config["audio"]
        run_precompute(binary, tmp_path, config)
        with h5py.File(out / "dataset.h5", "r") as f:
            assert list(f["columns/label"].asstr()[:]) == ["cat", "dog, big"]
            assert list(f["columns/split"].asstr()[:]) == ["train", ""]


def test_without_keep_columns_nothing_changes(binary, probes, minilm_folder, tmp_path):
    manifest = write_manifest(tmp_path / "m.jsonl", [{"id": "a", "text": "x", "label": "cat"}])
    config = config_for(manifest, tmp_path / "out", probes, minilm_folder)
    del config["audio"]
    run_precompute(binary, tmp_path, config)
    index = json.loads((tmp_path / "out" / "index.json").read_text())
    assert "keep_columns" not in index["config"]["output"]
    with h5py.File(tmp_path / "out" / index["shards"][0]["file"], "r") as f:
        assert "columns" not in f
    from precompute import ShardDataset
    assert "columns" not in ShardDataset(tmp_path / "out")[0]


@pytest.mark.parametrize("keep,flags,code,message", [
    (["label", "lable"], [], 65, "no line has the key 'lable'"),
    (["id"], [], 2, "the manifest's own columns"),
    (["label", "label"], [], 2, "names 'label' twice"),
    (["label", ""], [], 2, "is an empty name"),
    (["a/b"], [], 2, "cannot hold '/'"),
    (["a\u0000b"], [], 2, "NUL"),
    (None, ["--keep-columns", "label,TEXT"], 2, "the manifest's own columns"),
    (None, ["--keep-columns", "label,,split"], 2, "--keep-columns"),
])
def test_bad_names_are_refused_before_any_work(binary, probes, minilm_folder, tmp_path, keep,
                                               flags, code, message):
    manifest = write_manifest(tmp_path / "m.jsonl", [{"id": "a", "text": "x", "label": "cat"}])
    out = tmp_path / "out"
    config = config_for(manifest, out, probes, minilm_folder, keep)
    result = run_precompute(binary, tmp_path, config, *flags, expect=code)
    assert message in result.stderr, result.stderr
    if code == 65:
        assert str(manifest) in result.stderr
    assert not out.exists() or not any(out.iterdir())


def test_csv_without_the_column_and_bad_values_exit_65_naming_line_and_column(
        binary, probes, minilm_folder, tmp_path):
    manifest = tmp_path / "m.csv"
    manifest.write_text("id,text,label\na,x,cat\n")
    config = config_for(manifest, tmp_path / "out", probes, minilm_folder, ["label", "split"])
    result = run_precompute(binary, tmp_path, config, expect=65)
    assert "line 1: no column 'split'" in result.stderr and str(manifest) in result.stderr
    manifest.write_bytes(b"id,text,label\na,x,cat\nb,y,caf\xe9\n")
    config["output"]["keep_columns"] = ["label"]
    result = run_precompute(binary, tmp_path, config, expect=65)
    assert "line 3: the value of kept column 'label'" in result.stderr
    assert "not valid UTF-8" in result.stderr
    jsonl = write_manifest(tmp_path / "m.jsonl", [{"id": "a", "text": "x", "label": "c\u0000t"}])
    config["input"]["manifest"] = str(jsonl)
    result = run_precompute(binary, tmp_path, config, expect=65)
    assert "line 1: the value of kept column 'label'" in result.stderr
    assert "NUL" in result.stderr


def test_a_folder_input_has_no_columns_to_keep(binary, probes, minilm_folder, tmp_path):
    folder = tmp_path / "media"
    folder.mkdir()
    sine_file(folder / "a.wav", 300, 0.5)
    config = config_for(folder, tmp_path / "out", probes, minilm_folder, ["label"])
    config["input"] = {"folder": str(folder)}
    result = run_precompute(binary, tmp_path, config, expect=2)
    assert "needs a manifest" in result.stderr


def test_resume_refuses_another_list_and_an_edited_value(binary, made, tmp_path):
    root, manifest, out, config = made
    copy = tmp_path / "out"
    shutil.copytree(out, copy)
    changed = json.loads(json.dumps(config))
    changed["output"]["path"] = str(copy)
    for keep in (["label"], KEEP[::-1], []):
        changed["output"]["keep_columns"] = keep
        result = run_precompute(binary, tmp_path, changed, expect=2)
        assert "output.keep_columns: " in result.stderr, result.stderr
        assert "--overwrite" in result.stderr
    edited = [json.loads(line) for line in manifest.read_text().splitlines()]
    edited[0]["label"] = "kitten"
    changed["input"]["manifest"] = str(write_manifest(tmp_path / "edited.jsonl", edited))
    changed["output"]["keep_columns"] = KEEP
    result = run_precompute(binary, tmp_path, changed, expect=2)
    assert "kept columns' values" in result.stderr, result.stderr
    # --overwrite starts over with the new values.
    run_precompute(binary, tmp_path, changed, "--overwrite")
    with h5py.File(copy / "dataset.h5", "r") as f:
        assert f["columns/label"].asstr()[0] == "kitten"


def test_a_redone_shard_is_byte_identical_and_retry_failed_keeps_the_columns(binary, made,
                                                                              tmp_path):
    root, manifest, out, config = made
    copy = tmp_path / "out"
    shutil.copytree(out, copy)
    resumed = json.loads(json.dumps(config))
    resumed["output"]["path"] = str(copy)
    index = json.loads((copy / "index.json").read_text())
    first = index["shards"][0]
    original = datasets_of(copy / first["file"])
    (copy / first["file"]).unlink()
    run_precompute(binary, tmp_path, resumed)
    # (Not byte-identical to the original, nor of the same name: the config attribute records
    # output.path.)
    redone = json.loads((copy / "index.json").read_text())["shards"][0]["file"]
    assert redone.rsplit("-", 1)[0] == first["file"].rsplit("-", 1)[0]
    assert datasets_of(copy / redone) == original
    # s5's audio appears: --retry-failed rebuilds its shard from the kept s4 and the redone s5.
    sine_file(root / "late.wav", 400, 0.5)
    try:
        run_precompute(binary, tmp_path, resumed, "--retry-failed")
    finally:
        (root / "late.wav").unlink()
    ids, columns = shard_columns(copy)
    assert ids == list(EXPECTED)
    for i, sample_id in enumerate(ids):
        assert [columns[name][i] for name in KEEP] == EXPECTED[sample_id], sample_id
    with h5py.File(copy / "dataset.h5", "r") as f:
        assert list(f["columns/split"].asstr()[:]) == columns["split"]


def test_names_that_are_not_utf8_are_refused_from_the_file_and_the_flag(binary, probes,
                                                                        minilm_folder, tmp_path):
    import subprocess
    manifest = write_manifest(tmp_path / "m.jsonl", [{"id": "a", "text": "x", "label": "cat"}])
    config = config_for(manifest, tmp_path / "out", probes, minilm_folder, ["label"])
    del config["audio"]
    text = json.dumps(config).replace('["label"]', '["caf\\u00e9"]').encode()
    (tmp_path / "raw.yaml").write_bytes(text.replace("\\u00e9".encode(), b"\xe9"))
    for cmd in ([str(binary), "run", "--config", str(tmp_path / "raw.yaml")],
                [str(binary), "run", "--config", str(tmp_path / "raw.yaml"), "--keep-columns",
                 b"a\xffb".decode("utf-8", "surrogateescape")]):
        result = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        assert result.returncode == 2, result.stderr
        assert b"not valid UTF-8" in result.stderr and b"output.keep_columns[0]" in result.stderr
    assert not (tmp_path / "out").exists()


def test_a_damaged_index_and_another_list_keeps_the_shards_and_refuses(binary, made, tmp_path):
    """With index.json gone the index is rebuilt from the shards; a shard whose kept columns
    are not this run's is not taken for one of an edited input (and deleted): the run is
    refused naming output.keep_columns, and the shards are still there for the earlier list."""
    _, _, out, config = made
    copy = tmp_path / "out"
    shutil.copytree(out, copy)
    (copy / "index.json").unlink()
    shards = sorted(p.name for p in copy.glob("shard-*.h5"))
    changed = json.loads(json.dumps(config))
    changed["output"]["path"] = str(copy)
    changed["output"]["keep_columns"] = ["label"]
    result = run_precompute(binary, tmp_path, changed, expect=2)
    assert "output.keep_columns: " in result.stderr, result.stderr
    assert sorted(p.name for p in copy.glob("shard-*.h5")) == shards
    # The earlier list resumes it: every shard kept, nothing redone.
    result = run_precompute(binary, tmp_path, json.loads(json.dumps(config)) | {
        "output": config["output"] | {"path": str(copy)}})
    assert sorted(p.name for p in copy.glob("shard-*.h5")) == shards
    ids, columns = shard_columns(copy)
    assert ids == list(EXPECTED)
