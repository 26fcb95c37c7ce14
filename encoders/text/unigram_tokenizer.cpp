#include "encoders/text/unigram_tokenizer.hpp"

#include <algorithm>
#include <limits>

#include "encoders/text/utf8_text.hpp"
#include "pipeline/core/error.hpp"

// Note [What XLMRobertaTokenizer does]
// The reference is transformers 5's XLMRobertaTokenizer loaded from a model folder, which is what
// sentence-transformers runs. It keeps only the vocabulary (pieces and scores) and the
// Precompiled normalizer's charsmap from tokenizer.json and builds the rest itself, whatever
// else the file says (a published tokenizer.json's Strip and Replace normalizers and its
// Metaspace-only pre-tokenizer are not used, and neither are its added tokens' flags: those come
// from tokenizer_config.json's added_tokens_decoder). Step by step, each checked by experiment:
//  1. Invalid UTF-8 becomes U+FFFD per maximal subpart (Python's "replace").
//  2. The special tokens (<s>, <pad>, </s>, <unk>, <mask>) are found in the raw text first,
//     leftmost-longest, case-sensitively, even inside a word; lstrip/rstrip ones take the white
//     space beside them. The text between them is tokenized on its own.
//  3. The charsmap normalises it (Note [How Precompiled normalises]).
//  4. WhitespaceSplit: cut at White_Space characters, which are dropped.
//  5. Metaspace: each word gets U+2581 in front unless it starts with one (add_prefix_space),
//     and is cut before every U+2581 in it.
//  6. Unigram per piece: the Viterbi path over characters, scores added in the order the
//     library adds them; among equal scores the first candidate stays (shorter pieces come
//     first, the unknown-character node last). A character no piece of its own length covers
//     is also an unknown node, scored min(score) - 10. Adjacent unknown characters fuse into one
//     token, whose id is the piece it happens to spell, else unk_id.
//  7. <s> + ids + </s>, the ids cut so that the total is at most max_length.

namespace precompute {
namespace {

constexpr double kUnknownPenalty = 10.0;
constexpr std::string_view kWordStart = "\xE2\x96\x81";  // U+2581

// Per-thread buffers of the Viterbi pass.
struct Lattice {
  std::vector<double> score;
  std::vector<int64_t> start;  // -1: no path ends here yet
  std::vector<int32_t> id;
  std::vector<std::pair<size_t, size_t>> tokens;  // the best path, backwards
};

}  // namespace

// ---------------------------------------------------------------------------------------------
// PieceTrie

void UnigramTokenizer::PieceTrie::build(const std::vector<UnigramPiece>& pieces) {
  std::vector<std::pair<std::string_view, int32_t>> sorted;
  sorted.reserve(pieces.size());
  for (size_t i = 0; i < pieces.size(); ++i) {
    if (!pieces[i].text.empty()) sorted.emplace_back(pieces[i].text, static_cast<int32_t>(i));
  }
  // Equal pieces stay in id order, so the last of them (the id the library keeps) ends a run.
  std::sort(sorted.begin(), sorted.end());
  nodes_.assign(1, Node{});
  edge_bytes_.clear();
  edge_targets_.clear();
  struct Work {
    uint32_t node;
    size_t lo, hi, depth;
  };
  // Depth first, so that a node's range of `sorted` is read while its parent's reading left it
  // in the cache: breadth first read all 250,000 pieces of XLM-R's vocabulary once per depth.
  std::vector<Work> work{{0, 0, sorted.size(), 0}};
  const auto text_of = [&](size_t k) { return sorted[k].first; };
  while (!work.empty()) {
    const Work w = work.back();
    work.pop_back();
    const size_t first_child_work = work.size();
    size_t k = w.lo;
    while (k < w.hi && text_of(k).size() == w.depth) {
      nodes_[w.node].id = sorted[k].second;
      ++k;
    }
    nodes_[w.node].first_edge = static_cast<uint32_t>(edge_bytes_.size());
    uint16_t count = 0;
    while (k < w.hi) {
      const auto byte = static_cast<unsigned char>(text_of(k)[w.depth]);
      size_t end = k + 1;
      while (end < w.hi && static_cast<unsigned char>(text_of(end)[w.depth]) == byte) ++end;
      const auto child = static_cast<uint32_t>(nodes_.size());
      nodes_.push_back(Node{});
      edge_bytes_.push_back(byte);
      edge_targets_.push_back(child);
      ++count;
      work.push_back(Work{child, k, end, w.depth + 1});
      k = end;
    }
    // The first child on top, so that the ranges are read in order.
    std::reverse(work.begin() + static_cast<std::ptrdiff_t>(first_child_work), work.end());
    nodes_[w.node].edge_count = count;
  }
}

int32_t UnigramTokenizer::PieceTrie::child(uint32_t node, unsigned char byte) const {
  const Node& n = nodes_[node];
  const auto first = edge_bytes_.begin() + n.first_edge;
  const auto last = first + n.edge_count;
  const auto it = std::lower_bound(first, last, byte);
  if (it == last || *it != byte) return -1;
  return static_cast<int32_t>(edge_targets_[static_cast<size_t>(it - edge_bytes_.begin())]);
}

template <class Found>
void UnigramTokenizer::PieceTrie::prefixes(std::string_view text, Found&& found) const {
  uint32_t node = 0;
  for (size_t i = 0; i < text.size(); ++i) {
    const int32_t next = child(node, static_cast<unsigned char>(text[i]));
    if (next < 0) return;
    node = static_cast<uint32_t>(next);
    if (nodes_[node].id >= 0) found(i + 1, nodes_[node].id);
  }
}

int32_t UnigramTokenizer::PieceTrie::find(std::string_view key) const {
  uint32_t node = 0;
  for (const char byte : key) {
    const int32_t next = child(node, static_cast<unsigned char>(byte));
    if (next < 0) return -1;
    node = static_cast<uint32_t>(next);
  }
  return nodes_[node].id;
}

// ---------------------------------------------------------------------------------------------
// UnigramTokenizer

UnigramTokenizer::UnigramTokenizer(std::vector<UnigramPiece> pieces,
                                   std::optional<PrecompiledCharsmap> normalizer,
                                   std::vector<SpecialTextToken> specials,
                                   const UnigramOptions& options, const std::string& source)
    : options_(options) {
  auto model = std::make_shared<Model>();
  model->pieces = std::move(pieces);
  model->normalizer = std::move(normalizer);
  model->specials = std::move(specials);
  PC_CHECK(!model->pieces.empty(), ModelError, source, " has no pieces");
  PC_CHECK(model->pieces.size() <= static_cast<size_t>(std::numeric_limits<int32_t>::max()),
           ModelError, source, " has too many pieces (", model->pieces.size(), ")");
  const auto n = static_cast<int64_t>(model->pieces.size());
  for (const auto& [name, id] : {std::pair{"unk", options_.unk_id},
                                 {"bos", options_.bos_id},
                                 {"eos", options_.eos_id},
                                 {"pad", options_.pad_id}}) {
    PC_CHECK(id >= 0 && id < n, ModelError, source, ": the ", name, " token's id ", id,
             " is not one of its ", n, " pieces");
  }
  for (const SpecialTextToken& special : model->specials) {
    PC_CHECK(!special.text.empty() && special.id >= 0 && special.id < n, ModelError, source,
             ": special token '", special.text, "' (id ", special.id, ") is not one of its ", n,
             " pieces");
  }
  PC_CHECK(options_.max_length >= 2, ModelError, source,
           ": the maximum sequence length must be at least 2 (for <s> and </s>); got ",
           options_.max_length);
  double min_score = std::numeric_limits<double>::infinity();
  for (const UnigramPiece& piece : model->pieces) min_score = std::min(min_score, piece.score);
  model->unk_score = min_score - kUnknownPenalty;
  model->trie.build(model->pieces);
  model_ = std::move(model);
}

UnigramTokenizer UnigramTokenizer::with_max_length(int max_length) const {
  PC_CHECK(max_length >= 2, ModelError,
           "the maximum sequence length must be at least 2 (for <s> and </s>); got ", max_length);
  UnigramTokenizer copy = *this;
  copy.options_.max_length = max_length;
  return copy;
}

bool UnigramTokenizer::append_word(std::string_view word, std::vector<int32_t>& out,
                                   size_t limit) const {
  thread_local Lattice lattice;
  const size_t size = word.size();
  lattice.score.assign(size + 1, 0.0);
  lattice.start.assign(size + 1, -1);
  lattice.id.assign(size + 1, -1);
  size_t at = 0;
  while (at < size) {
    const double till_here = lattice.score[at];
    size_t char_bytes = 1;
    while (at + char_bytes < size && is_utf8_continuation(word[at + char_bytes])) ++char_bytes;
    bool has_single = false;
    model_->trie.prefixes(word.substr(at), [&](size_t length, int32_t id) {
      const size_t end = at + length;
      const double candidate = model_->pieces[static_cast<size_t>(id)].score + till_here;
      if (lattice.start[end] < 0 || candidate > lattice.score[end]) {
        lattice.score[end] = candidate;
        lattice.start[end] = static_cast<int64_t>(at);
        lattice.id[end] = id;
      }
      if (length == char_bytes) has_single = true;
    });
    if (!has_single) {
      const size_t end = at + char_bytes;
      const double candidate = model_->unk_score + till_here;
      if (lattice.start[end] < 0 || candidate > lattice.score[end]) {
        lattice.score[end] = candidate;
        lattice.start[end] = static_cast<int64_t>(at);
        lattice.id[end] = options_.unk_id;
      }
    }
    at += char_bytes;
  }
  // Backwards along the best path; runs of unknown characters become one token.
  lattice.tokens.clear();
  size_t end = size;
  size_t unknown_end = std::string_view::npos;
  while (end > 0) {
    const auto start = static_cast<size_t>(lattice.start[end]);
    if (lattice.id[end] == options_.unk_id) {
      if (unknown_end == std::string_view::npos) unknown_end = end;
    } else {
      if (unknown_end != std::string_view::npos) {
        lattice.tokens.emplace_back(end, unknown_end);
        unknown_end = std::string_view::npos;
      }
      lattice.tokens.emplace_back(start, end);
    }
    end = start;
  }
  if (unknown_end != std::string_view::npos) lattice.tokens.emplace_back(0, unknown_end);
  for (auto it = lattice.tokens.rbegin(); it != lattice.tokens.rend(); ++it) {
    const int32_t id = model_->trie.find(word.substr(it->first, it->second - it->first));
    out.push_back(id >= 0 ? id : options_.unk_id);
  }
  if (out.size() > limit) {
    out.resize(limit);
    return false;
  }
  return true;
}

bool UnigramTokenizer::append_segment(std::string_view text, std::vector<int32_t>& out,
                                      size_t limit) const {
  std::string normalized;
  if (model_->normalizer) {
    normalized = model_->normalizer->normalize(text);
    text = normalized;
  }
  const auto* data = reinterpret_cast<const unsigned char*>(text.data());
  const auto* end = data + text.size();
  std::string word;
  const auto end_word = [&]() {
    if (word.empty()) return true;
    if (options_.add_prefix_space && !std::string_view(word).starts_with(kWordStart)) {
      word.insert(0, kWordStart);
    }
    // Cut before every U+2581: each piece but perhaps the first starts with one.
    const std::string_view w = word;
    size_t piece_start = 0;
    while (piece_start < w.size()) {
      size_t next = w.find(kWordStart, piece_start + (w.substr(piece_start).starts_with(kWordStart)
                                                          ? kWordStart.size()
                                                          : 0));
      if (next == std::string_view::npos) next = w.size();
      if (!append_word(w.substr(piece_start, next - piece_start), out, limit)) return false;
      piece_start = next;
    }
    word.clear();
    return true;
  };
  const auto* p = data;
  while (p < end) {
    const auto* start = p;
    char32_t c;
    size_t invalid;
    p += decode_utf8(p, end, &c, &invalid);
    if (is_white_space(c)) {
      if (!end_word()) return false;
    } else {
      word.append(reinterpret_cast<const char*>(start), static_cast<size_t>(p - start));
    }
  }
  return end_word();
}

bool UnigramTokenizer::append_ids(std::string_view text, std::vector<int32_t>& out,
                                  size_t limit) const {
  const auto white_space_before = [&](size_t at, size_t floor) {
    // Steps back over white space characters; `at` is a character boundary.
    while (at > floor) {
      size_t begin = at - 1;
      while (begin > floor && is_utf8_continuation(text[begin])) --begin;
      char32_t c;
      size_t invalid;
      const auto* p = reinterpret_cast<const unsigned char*>(text.data());
      decode_utf8(p + begin, p + at, &c, &invalid);
      if (!is_white_space(c)) break;
      at = begin;
    }
    return at;
  };
  const auto white_space_after = [&](size_t at) {
    const auto* p = reinterpret_cast<const unsigned char*>(text.data());
    while (at < text.size()) {
      char32_t c;
      size_t invalid;
      const size_t n = decode_utf8(p + at, p + text.size(), &c, &invalid);
      if (!is_white_space(c)) break;
      at += n;
    }
    return at;
  };
  size_t segment_start = 0;
  size_t search_from = 0;
  while (!model_->specials.empty()) {
    size_t best_at = std::string_view::npos;
    const SpecialTextToken* best = nullptr;
    for (const SpecialTextToken& special : model_->specials) {
      const size_t at = text.find(special.text, search_from);
      if (at == std::string_view::npos) continue;
      if (at < best_at || (at == best_at && special.text.size() > best->text.size())) {
        best_at = at;
        best = &special;
      }
    }
    if (best == nullptr) break;
    size_t match_start = best_at;
    size_t match_end = best_at + best->text.size();
    if (best->lstrip) match_start = white_space_before(match_start, segment_start);
    if (best->rstrip) match_end = white_space_after(match_end);
    if (!append_segment(text.substr(segment_start, match_start - segment_start), out, limit)) {
      return false;
    }
    out.push_back(best->id);
    if (out.size() > limit) {
      out.resize(limit);
      return false;
    }
    segment_start = search_from = match_end;
  }
  return append_segment(text.substr(segment_start), out, limit);
}

TokenizedText UnigramTokenizer::encode(std::string_view text, int64_t* invalid_utf8_bytes) const {
  const std::string valid = valid_utf8(text, invalid_utf8_bytes);
  TokenizedText result;
  const auto max_length = static_cast<size_t>(options_.max_length);
  result.ids.reserve(std::min(max_length, valid.size() + 2));
  result.ids.push_back(options_.bos_id);
  result.truncated = !append_ids(valid, result.ids, max_length - 1);
  result.ids.push_back(options_.eos_id);
  return result;
}

std::vector<std::string> UnigramTokenizer::tokenize(std::string_view text) const {
  const std::string valid = valid_utf8(text, nullptr);
  std::vector<int32_t> ids;
  append_ids(valid, ids, std::numeric_limits<size_t>::max());
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (const int32_t id : ids) tokens.push_back(model_->pieces[static_cast<size_t>(id)].text);
  return tokens;
}

}  // namespace precompute
