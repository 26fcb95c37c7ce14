// manifest_bench: how fast a JSONL manifest is read and checked alone (read_manifest, the oneTBB
// pipeline of Note [Parsing a manifest on every core] in pipeline/input/manifest.cpp), without
// the graph: every run pays it before any work starts.
//
//   manifest_bench [--lines N] [--keep NAME,...] [--threads T] [--rounds R] [--out FILE]
//
// Writes a manifest of N caption lines (default 1,000,000) to FILE, each with extra columns of
// every JSON kind (a string, an integer, a float, an array), then reads it R times, keeping the
// columns --keep names (none by default; e.g. --keep label,score,tags,split). One JSON line per
// round reports the wall and CPU seconds and lines/s, and the median round comes last. --threads
// caps oneTBB's threads (default: every core); on a shared machine the CPU seconds of one thread
// are the steadier measure.

#include <sys/resource.h>
#include <tbb/global_control.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "pipeline/core/seconds_since.hpp"
#include "pipeline/input/manifest.hpp"
#include "tools/bench/bench_args.hpp"

namespace {

using precompute::seconds_since;

struct Args {
  int64_t lines = 1000000;
  std::vector<std::string> keep;
  int threads = 0;  // 0: oneTBB's default
  int rounds = 5;
  std::filesystem::path out = "/tmp/manifest-bench.jsonl";
};

[[noreturn]] void usage(const std::string& why) {
  std::fprintf(stderr,
               "manifest_bench: %s\nusage: manifest_bench [--lines N] [--keep NAME,...] "
               "[--threads T] [--rounds R] [--out FILE]\n",
               why.c_str());
  std::exit(2);
}

std::vector<std::string> split_names(const std::string& list) {
  std::vector<std::string> names;
  size_t from = 0;
  while (from <= list.size()) {
    const size_t comma = std::min(list.find(',', from), list.size());
    names.push_back(list.substr(from, comma - from));
    from = comma + 1;
  }
  return names;
}

Args parse(int argc, char** argv) {
  Args a;
  for (precompute::BenchArgs args(argc, argv, usage); args.next();) {
    if (args.is("--lines")) {
      a.lines = args.number<int64_t>();
    } else if (args.is("--keep")) {
      a.keep = split_names(args.text());
    } else if (args.is("--threads")) {
      a.threads = args.number<int>();
    } else if (args.is("--rounds")) {
      a.rounds = args.number<int>();
    } else if (args.is("--out")) {
      a.out = args.text();
    } else {
      usage("unknown argument " + args.arg());
    }
  }
  if (a.lines < 1 || a.lines > 100000000 || a.threads < 0 || a.threads > 1024 || a.rounds < 1 ||
      a.rounds > 100) {
    usage("--lines is 1 to 100,000,000, --threads 0 (every core) to 1024, --rounds 1 to 100");
  }
  return a;
}

// Lines shaped like a caption manifest with a trainer's columns: about 160 bytes each.
void write_manifest(const Args& a) {
  static const char* const kSplits[] = {"train", "val", "test"};
  std::ofstream out(a.out, std::ios::binary | std::ios::trunc);
  char line[512];
  for (int64_t i = 0; i < a.lines; ++i) {
    const int n = std::snprintf(
        line, sizeof line,
        "{\"id\": \"t%07lld\", \"text\": \"A dog number %lld catches a red frisbee in the park "
        "at dusk.\", \"label\": %lld, \"score\": %.4f, \"split\": \"%s\", \"tags\": [\"dog\", "
        "%lld]}\n",
        static_cast<long long>(i), static_cast<long long>(i), static_cast<long long>(i % 1000),
        static_cast<double>(i % 977) / 977.0, kSplits[i % 3], static_cast<long long>(i % 7));
    out.write(line, n);
  }
  if (!out.good()) usage("cannot write " + a.out.string());
}

double cpu_seconds() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  const auto seconds = [](const timeval& t) { return t.tv_sec + t.tv_usec / 1e6; };
  return seconds(usage.ru_utime) + seconds(usage.ru_stime);
}

}  // namespace

int main(int argc, char** argv) {
  const Args a = parse(argc, argv);
  std::unique_ptr<tbb::global_control> threads;
  if (a.threads > 0) {
    threads = std::make_unique<tbb::global_control>(tbb::global_control::max_allowed_parallelism,
                                                    static_cast<size_t>(a.threads));
  }
  try {
    write_manifest(a);
    std::vector<double> walls, cpus;
    for (int r = 0; r < a.rounds; ++r) {
      const double cpu_before = cpu_seconds();
      const auto t = std::chrono::steady_clock::now();
      const auto samples = precompute::read_manifest(a.out, a.keep);
      const double wall = seconds_since(t);
      const double cpu = cpu_seconds() - cpu_before;
      walls.push_back(wall);
      cpus.push_back(cpu);
      std::printf(
          "{\"round\": %d, \"lines\": %zu, \"kept\": %zu, \"wall_s\": %.3f, "
          "\"cpu_s\": %.3f, \"lines_per_s\": %.0f}\n",
          r, samples.size(), a.keep.size(), wall, cpu, samples.size() / wall);
      std::fflush(stdout);
    }
    const auto median = [](std::vector<double> v) {
      std::sort(v.begin(), v.end());
      return v[v.size() / 2];
    };
    std::printf(
        "{\"median\": true, \"lines\": %lld, \"kept\": %zu, \"threads\": %d, "
        "\"wall_s\": %.3f, \"cpu_s\": %.3f, \"lines_per_s\": %.0f}\n",
        static_cast<long long>(a.lines), a.keep.size(), a.threads, median(walls), median(cpus),
        a.lines / median(walls));
    std::filesystem::remove(a.out);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "manifest_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
