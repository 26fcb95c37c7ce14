#pragma once
// The command line of the C++ bench tools (decode_bench, shard_bench, manifest_bench): each
// argument in turn, options that take the next argument as their value, and a value that is not
// a number ending the tool through its usage(why) (exit 2).
//
//   for (BenchArgs args(argc, argv, usage); args.next();) {
//     if (args.is("--threads")) a.threads = args.number<int>();
//     else if (args.is("--no-seek")) a.seek = false;
//     else a.files.emplace_back(args.arg());
//   }

#include <limits>
#include <stdexcept>
#include <string>

namespace precompute {

class BenchArgs {
 public:
  using Usage = void (*)(const std::string& why);  // must not return

  BenchArgs(int argc, char** argv, Usage usage) : argc_(argc), argv_(argv), usage_(usage) {}

  // Moves to the next argument; false after the last.
  bool next() {
    if (++at_ >= argc_) return false;
    arg_ = argv_[at_];
    return true;
  }
  const std::string& arg() const { return arg_; }
  bool is(const char* name) const { return arg_ == name; }
  bool is_option() const { return arg_.rfind("--", 0) == 0; }

  // The current option's value: the next argument, taken.
  std::string text() {
    if (at_ + 1 >= argc_) fail(arg_ + " needs a value");
    return argv_[++at_];
  }
  // The value as a number of type T (whole numbers for integer types, inf and NaN refused by
  // the callers' ranges); anything else, or one out of T's range, ends the tool.
  template <class T>
  T number() {
    const std::string option = arg_;
    const std::string value = text();
    try {
      size_t used = 0;
      if constexpr (std::numeric_limits<T>::is_integer) {
        const long long n = std::stoll(value, &used);
        if (used == value.size() && n >= std::numeric_limits<T>::min() &&
            n <= std::numeric_limits<T>::max()) {
          return static_cast<T>(n);
        }
      } else {
        const double x = std::stod(value, &used);
        if (used == value.size()) return static_cast<T>(x);
      }
    } catch (const std::logic_error&) {  // not a number, or out of range
    }
    fail("bad value for " + option + ": '" + value + "'");
  }

 private:
  [[noreturn]] void fail(const std::string& why) {
    usage_(why);
    throw std::logic_error(why);  // usage() exits; this only tells the compiler so
  }

  int argc_;
  char** argv_;
  Usage usage_;
  int at_ = 0;
  std::string arg_;
};

}  // namespace precompute
