// tokenizer_dump: runs a tokenizer over JSON lines, for the parity tests
// (tests/python/test_tokenizer_parity.py, test_unigram_parity.py) and for ad-hoc timing.
//
//   tokenizer_dump --vocab vocab.txt [--lower-case 0|1] [--strip-accents 0|1|unset]
//                  [--chinese 0|1] [--max-length N] [--max-chars-per-word N]
//                  [--threads N] [--repeat N] INPUT.jsonl > OUTPUT.jsonl
//   tokenizer_dump --unigram-folder DIR [--max-length N] [--threads N] [--repeat N] INPUT.jsonl
//
// --vocab runs BERT's WordPiece tokenizer; --unigram-folder the XLM-RoBERTa tokenizer of a model
// folder (tokenizer.json with a Unigram model).
//
// Each input line is a JSON object holding the text in one of two keys:
//   {"text": "..."}  a JSON string (its UTF-8), for texts that are valid Unicode;
//   {"b64": "..."}   standard base64 (RFC 4648, with padding) of the raw bytes, for anything,
//                    invalid UTF-8 included.
// Each output line, in input order: {"ids": [...], "truncated": bool, "invalid_utf8_bytes": n}.
// --threads encodes with that many threads at once (the tokenizer is shared, as in the
// pipeline); --repeat encodes the whole input that many times. Both print the time taken and
// texts per second to stderr.

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "encoders/bert/unigram_folder.hpp"
#include "encoders/text/precompiled_charsmap.hpp"
#include "encoders/text/wordpiece_tokenizer.hpp"

namespace {

[[noreturn]] void usage(const std::string& problem) {
  std::cerr << "tokenizer_dump: " << problem << "\n"
            << "usage: tokenizer_dump --vocab FILE | --unigram-folder DIR [--lower-case 0|1] [--strip-accents 0|1|unset]"
               " [--chinese 0|1] [--max-length N] [--max-chars-per-word N] [--threads N]"
               " [--repeat N] INPUT.jsonl\n";
  std::exit(2);
}

bool parse_bool(const std::string& flag, const std::string& value) {
  if (value == "0") return false;
  if (value == "1") return true;
  usage(flag + " takes 0 or 1, not '" + value + "'");
}

int parse_int(const std::string& flag, const std::string& value) {
  try {
    size_t used = 0;
    const int n = std::stoi(value, &used);
    if (used == value.size()) return n;
  } catch (const std::exception&) {
  }
  usage(flag + " takes an integer, not '" + value + "'");
}

}  // namespace

int main(int argc, char** argv) {
  std::string vocab, unigram_folder, input;
  precompute::TokenizerOptions options;
  int threads = 1;
  int repeat = 1;
  bool timed = false;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg.starts_with("--")) {
      if (i + 1 >= argc) usage(arg + " needs a value");
      const std::string value = argv[++i];
      if (arg == "--vocab") {
        vocab = value;
      } else if (arg == "--unigram-folder") {
        unigram_folder = value;
      } else if (arg == "--lower-case") {
        options.lower_case = parse_bool(arg, value);
      } else if (arg == "--strip-accents") {
        if (value == "unset") {
          options.strip_accents.reset();
        } else {
          options.strip_accents = parse_bool(arg, value);
        }
      } else if (arg == "--chinese") {
        options.tokenize_chinese_chars = parse_bool(arg, value);
      } else if (arg == "--max-length") {
        options.max_length = parse_int(arg, value);
      } else if (arg == "--max-chars-per-word") {
        options.max_chars_per_word = parse_int(arg, value);
      } else if (arg == "--threads") {
        threads = std::max(1, parse_int(arg, value));
        timed = true;
      } else if (arg == "--repeat") {
        repeat = std::max(1, parse_int(arg, value));
        timed = true;
      } else {
        usage("unknown option " + arg);
      }
    } else if (input.empty()) {
      input = arg;
    } else {
      usage("more than one input file");
    }
  }
  if (vocab.empty() == unigram_folder.empty() || input.empty()) {
    usage("one of --vocab and --unigram-folder, and an input file, are required");
  }

  std::vector<std::string> texts;
  {
    std::ifstream in(input, std::ios::binary);
    if (!in) usage("cannot read " + input);
    std::string line;
    size_t line_number = 0;
    while (std::getline(in, line)) {
      ++line_number;
      if (line.empty()) continue;
      try {
        const auto object = nlohmann::json::parse(line);
        if (object.contains("b64")) {
          const auto raw = precompute::decode_base64(object.at("b64").get<std::string>());
          if (!raw) throw std::runtime_error("\"b64\" is not base64");
          texts.push_back(*raw);
        } else {
          texts.push_back(object.at("text").get<std::string>());
        }
      } catch (const std::exception& e) {
        std::cerr << "tokenizer_dump: " << input << ":" << line_number << ": " << e.what() << "\n";
        return 2;
      }
    }
  }

  try {
    std::unique_ptr<precompute::TextTokenizer> chosen;
    if (!vocab.empty()) {
      chosen = std::make_unique<precompute::WordPieceTokenizer>(
          precompute::WordPieceTokenizer::from_vocab_file(vocab, options));
    } else {
      chosen = std::make_unique<precompute::UnigramTokenizer>(
          precompute::read_unigram_tokenizer(unigram_folder, options.max_length));
    }
    const precompute::TextTokenizer& tokenizer = *chosen;
    std::vector<precompute::TokenizedText> results(texts.size());
    std::vector<int64_t> invalid(texts.size(), 0);
    const auto start = std::chrono::steady_clock::now();
    for (int r = 0; r < repeat; ++r) {
      std::atomic<size_t> next{0};
      auto work = [&] {
        constexpr size_t kChunk = 256;
        for (size_t begin = next.fetch_add(kChunk); begin < texts.size();
             begin = next.fetch_add(kChunk)) {
          for (size_t i = begin; i < std::min(texts.size(), begin + kChunk); ++i) {
            results[i] = tokenizer.encode(texts[i], &invalid[i]);
          }
        }
      };
      std::vector<std::thread> pool;
      for (int t = 1; t < threads; ++t) pool.emplace_back(work);
      work();
      for (auto& thread : pool) thread.join();
    }
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (timed) {
      const double n = static_cast<double>(texts.size()) * repeat;
      std::fprintf(stderr, "tokenizer_dump: %.0f texts in %.3f s with %d thread(s): %.0f texts/s\n",
                   n, seconds, threads, n / seconds);
    }

    std::string out;
    for (size_t i = 0; i < texts.size(); ++i) {
      out = "{\"ids\": [";
      for (size_t j = 0; j < results[i].ids.size(); ++j) {
        if (j) out += ", ";
        out += std::to_string(results[i].ids[j]);
      }
      out += "], \"truncated\": ";
      out += results[i].truncated ? "true" : "false";
      out += ", \"invalid_utf8_bytes\": " + std::to_string(invalid[i]) + "}\n";
      std::fwrite(out.data(), 1, out.size(), stdout);
    }
  } catch (const std::exception& e) {
    std::cerr << "tokenizer_dump: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
