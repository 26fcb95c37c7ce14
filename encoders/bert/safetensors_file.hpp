#pragma once
// Hugging Face safetensors files, read through a read-only memory map, and the weights of a model
// folder spread over one or several of them. A file is 8 bytes of little-endian header length N,
// N bytes of UTF-8 JSON {name: {"dtype", "shape", "data_offsets": [begin, end]}, optional
// "__metadata__": {string: string}}, then the byte buffer the offsets point into. Every file is
// checked in full when it is opened (Note [What a valid safetensors file is] in the .cpp), so a
// tensor view never points outside the file.
//
// Thread-safety: SafetensorsFile and SafetensorsWeights are immutable after construction; their
// const members may be called from many threads at once. A SafetensorsTensor points into the
// mapping of the file it came from and stays valid while that file (or the SafetensorsWeights
// holding it) lives, moves included: moving an owner does not move the mapping.

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <string>
#include <string_view>
#include <vector>

namespace precompute {

// The element types of the format. The F8 types are known, so that files holding them open and
// errors can name them, but precompute does not compute in them: rejecting them is up to the code
// that reads the weights.
enum class SafetensorsDtype {
  kBool,
  kU8,
  kI8,
  kU16,
  kI16,
  kU32,
  kI32,
  kU64,
  kI64,
  kF16,
  kBF16,
  kF32,
  kF64,
  kF8E4M3,
  kF8E5M2,
  kF8E8M0,
};

// The name the format uses, such as "F32" or "F8_E4M3".
std::string_view safetensors_dtype_name(SafetensorsDtype dtype);
// Bytes per element.
size_t safetensors_dtype_size(SafetensorsDtype dtype);

// One tensor of a file: row-major, little-endian, packed.
struct SafetensorsTensor {
  std::string name;
  SafetensorsDtype dtype = SafetensorsDtype::kF32;
  std::vector<int64_t> shape;  // empty: a scalar (one element)
  // Into the file's mapping. Not necessarily aligned to the element size (the format does not
  // require it), so read elements with std::memcpy. Empty tensors have a valid but unreadable
  // pointer.
  const void* data = nullptr;
  size_t bytes = 0;  // numel() * safetensors_dtype_size(dtype)

  int64_t numel() const;
};

class SafetensorsFile {
 public:
  // Maps `path` read-only and checks its header and layout. Throws ModelError naming the file and
  // what is wrong with it. The file must not be truncated while it is mapped.
  explicit SafetensorsFile(const std::filesystem::path& path);
  SafetensorsFile(SafetensorsFile&&) = default;
  SafetensorsFile& operator=(SafetensorsFile&&) = default;

  const std::filesystem::path& path() const { return path_; }
  // Every tensor, sorted by name.
  const std::vector<SafetensorsTensor>& tensors() const { return tensors_; }
  // The tensor called `name`, or nullptr.
  const SafetensorsTensor* find(std::string_view name) const;
  std::vector<std::string> names() const;  // sorted
  // The header's "__metadata__" (for example {"format": "pt"}); empty when it has none.
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

 private:
  // Owns one read-only mmap of a whole file; munmap on destruction. Movable, not copyable.
  class Mapping {
   public:
    explicit Mapping(const std::filesystem::path& path);
    ~Mapping();
    Mapping(Mapping&& other) noexcept;
    Mapping& operator=(Mapping&& other) noexcept;
    Mapping(const Mapping&) = delete;
    Mapping& operator=(const Mapping&) = delete;

    const std::byte* data() const { return static_cast<const std::byte*>(address_); }
    size_t size() const { return size_; }

   private:
    void* address_ = nullptr;  // null for an empty file, which cannot be mapped
    size_t size_ = 0;
  };

  std::filesystem::path path_;
  Mapping mapping_;
  std::vector<SafetensorsTensor> tensors_;
  std::map<std::string, std::string> metadata_;
};

// The weights of a model folder as save_pretrained writes them: DIR/model.safetensors, or else
// the shards that DIR/model.safetensors.index.json lists in its "weight_map" (tensor name ->
// file). Pickled weights (pytorch_model.bin) are refused: they can run code when loaded.
class SafetensorsWeights {
 public:
  // Opens and checks every file. Throws ModelError naming the folder or file and the fix: no
  // weights, pickled weights only, a damaged index, a missing shard, a tensor that the index
  // lists but its shard lacks.
  explicit SafetensorsWeights(const std::filesystem::path& dir);

  const std::filesystem::path& dir() const { return dir_; }
  // The tensor called `name`, or nullptr.
  const SafetensorsTensor* find(std::string_view name) const;
  // The tensor called `name`; throws ModelError naming the folder when there is none.
  const SafetensorsTensor& at(std::string_view name) const;
  // Every tensor name, sorted. With an index, exactly the names it lists.
  std::vector<std::string> names() const;

 private:
  std::filesystem::path dir_;
  std::vector<SafetensorsFile> files_;
  std::map<std::string, size_t, std::less<>> file_of_;  // tensor name -> index into files_
};

}  // namespace precompute
