// shard_bench: how fast the writer's two steps go alone, without the graph or the encoders:
// build (ShardWriter::build, the HDF5 image in memory; one thread in HDF5) and commit
// (ShardWriter::commit: write, fsync, rename, SHA-256). These two run on one thread each in a
// run, so their samples/s is the ceiling of a text job however many GPUs embed it (issue 10's
// "every GPU busy": a 1M-caption run on one H200 spent 7.5 s building shards).
//
//   shard_bench [--samples N] [--shard-size S] [--dim D] [--dtype float16|float32]
//               [--rounds R] [--out DIR]
//
// Pooled text embeddings of D values per sample, ids "t0000000"..., shards of S samples. Each
// round builds and commits every shard once; one JSON line per round reports the seconds of
// each step and its samples/s, and the median round comes last.

#include <malloc.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "pipeline/core/error.hpp"
#include "pipeline/core/seconds_since.hpp"
#include "storage/shard_writer.hpp"
#include "tools/bench/bench_args.hpp"

namespace {

using precompute::seconds_since;

struct Args {
  int64_t samples = 1000000;
  int64_t shard_size = 8192;
  int64_t dim = 768;
  precompute::StorageDtype dtype = precompute::StorageDtype::kFloat16;
  int rounds = 3;
  std::filesystem::path out = "/tmp/shard-bench";
};

[[noreturn]] void usage(const std::string& why) {
  std::fprintf(stderr,
               "shard_bench: %s\nusage: shard_bench [--samples N] [--shard-size S] [--dim D] "
               "[--dtype float16|float32] [--rounds R] [--out DIR]\n",
               why.c_str());
  std::exit(2);
}

Args parse(int argc, char** argv) {
  Args a;
  for (precompute::BenchArgs args(argc, argv, usage); args.next();) {
    if (args.is("--samples")) {
      a.samples = args.number<int64_t>();
    } else if (args.is("--shard-size")) {
      a.shard_size = args.number<int64_t>();
    } else if (args.is("--dim")) {
      a.dim = args.number<int64_t>();
    } else if (args.is("--dtype")) {
      const std::string d = args.text();
      if (d != "float16" && d != "float32") usage("--dtype is float16 or float32");
      a.dtype = d == "float16" ? precompute::StorageDtype::kFloat16
                               : precompute::StorageDtype::kFloat32;
    } else if (args.is("--rounds")) {
      a.rounds = args.number<int>();
    } else if (args.is("--out")) {
      a.out = args.text();
    } else {
      usage("unknown argument " + args.arg());
    }
  }
  // Every sample is held in memory, about dim x 4 bytes: the bounds keep that to a few GB.
  if (a.samples < 1 || a.samples > 10000000 || a.shard_size < 1 || a.shard_size > 1000000 ||
      a.dim < 1 || a.dim > 65536 || a.samples * a.dim > 500000000 || a.rounds < 1 ||
      a.rounds > 100) {
    usage("--samples is 1 to 10,000,000, --shard-size 1 to 1,000,000, --dim 1 to 65,536 (and "
          "samples x dim at most 500,000,000), --rounds 1 to 100");
  }
  return a;
}

// The shards of one round, made once: every build then reads the same memory.
std::vector<precompute::ShardContents> make_shards(const Args& a) {
  std::mt19937 random(7);
  std::normal_distribution<float> normal(0.0f, 0.05f);
  std::vector<float> pool(static_cast<size_t>(a.dim) * 64);
  for (float& v : pool) v = normal(random);
  std::vector<precompute::ShardContents> shards;
  for (int64_t first = 0; first < a.samples; first += a.shard_size) {
    precompute::ShardContents c;
    c.shard_index = static_cast<int64_t>(shards.size());
    c.first_seq = first;
    c.seq_count = std::min(a.shard_size, a.samples - first);
    c.input_sha256 = std::string(64, 'a');
    c.samples.resize(static_cast<size_t>(c.seq_count));
    for (int64_t i = 0; i < c.seq_count; ++i) {
      precompute::ShardSample& s = c.samples[static_cast<size_t>(i)];
      s.seq = first + i;
      char id[32];
      std::snprintf(id, sizeof id, "t%07lld", static_cast<long long>(s.seq));
      s.id = id;
      precompute::SampleEmbedding e;
      e.seq = s.seq;
      e.rows = 1;
      e.dim = a.dim;
      e.steps = 14;
      const float* from = pool.data() + (s.seq % 64) * a.dim;
      e.values.assign(from, from + a.dim);
      s.embeddings[precompute::modality_index(precompute::Modality::kText)] = std::move(e);
    }
    shards.push_back(std::move(c));
  }
  return shards;
}

}  // namespace

int main(int argc, char** argv) {
  // As precompute's main() does (Note [Host memory and glibc malloc] in tools/cli/main.cpp):
  // every buffer above 256 KiB in a mapping of its own, so the shard-sized buffers the build
  // allocates cost here what they cost in a run.
  mallopt(M_MMAP_THRESHOLD, 256 * 1024);
  const Args a = parse(argc, argv);
  try {
    std::filesystem::create_directories(a.out);
    precompute::ShardMeta meta;
    meta.tool_version = "shard_bench";
    meta.config_fingerprint = std::string(64, 'f');
    meta.config_json = "{}";
    meta.dtype = a.dtype;
    precompute::ModalitySchema text;
    text.modality = precompute::Modality::kText;
    text.dim = a.dim;
    text.encoder = "bench";
    text.encoder_sha256 = std::string(64, 'e');
    text.pooling = "mean";
    text.preprocessing_json = "{}";
    meta.modalities[precompute::modality_index(precompute::Modality::kText)] = text;
    const precompute::ShardWriter writer(a.out, meta);
    const auto shards = make_shards(a);

    std::vector<double> builds, commits;  // seconds per round
    uint64_t bytes = 0;
    std::string image;  // reused, as the committer reuses its images
    for (int r = 0; r < a.rounds; ++r) {
      double build_s = 0.0, commit_s = 0.0;
      bytes = 0;
      for (const auto& shard : shards) {
        auto t = std::chrono::steady_clock::now();
        writer.build(shard, image);
        build_s += seconds_since(t);
        t = std::chrono::steady_clock::now();
        bytes += writer.commit(shard.shard_index, image).bytes;
        commit_s += seconds_since(t);
      }
      builds.push_back(build_s);
      commits.push_back(commit_s);
      std::printf(
          "{\"round\": %d, \"samples\": %lld, \"shards\": %zu, \"mb\": %.1f, \"build_s\": %.3f, "
          "\"build_per_s\": %.0f, \"commit_s\": %.3f, \"commit_per_s\": %.0f}\n",
          r, static_cast<long long>(a.samples), shards.size(), bytes / 1e6, build_s,
          a.samples / build_s, commit_s, a.samples / commit_s);
      std::fflush(stdout);
    }
    const auto median = [](std::vector<double> v) {
      std::sort(v.begin(), v.end());
      return v[v.size() / 2];
    };
    const double build_s = median(builds), commit_s = median(commits);
    std::printf("{\"median\": true, \"samples\": %lld, \"dim\": %lld, \"build_s\": %.3f, "
                "\"build_per_s\": %.0f, \"commit_s\": %.3f, \"commit_per_s\": %.0f}\n",
                static_cast<long long>(a.samples), static_cast<long long>(a.dim), build_s,
                a.samples / build_s, commit_s, a.samples / commit_s);
    std::filesystem::remove_all(a.out);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "shard_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
