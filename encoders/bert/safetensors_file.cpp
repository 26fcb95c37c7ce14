#include "encoders/bert/safetensors_file.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <cerrno>
#include <fstream>
#include <limits>
#include <set>
#include <system_error>
#include <utility>

#include "encoders/bert/json_file.hpp"
#include "pipeline/core/error.hpp"

namespace precompute {
namespace {

using Json = nlohmann::json;
using std::filesystem::path;

// Note [What a valid safetensors file is]
// The format's specification (the safetensors README) is short; we accept a file only when all
// of this holds, so that every view stays inside the mapping and two readers cannot disagree:
//  - at least 8 bytes; the header length N (u64, little-endian) is at most 100 MiB (the
//    reference implementation's bound against absurd headers) and 8 + N is within the file;
//  - the header is a JSON object in valid UTF-8 with no key twice in any object ("duplicate keys
//    are disallowed"; nlohmann::json would otherwise keep the last one silently);
//  - "__metadata__", when present, maps strings to strings;
//  - every other key is a tensor: an object with a known "dtype", a "shape" of non-negative
//    integers (empty: a scalar; a zero dimension: an empty tensor that holds no bytes) and
//    "data_offsets" [begin, end] with begin <= end <= the buffer's size, relative to the buffer's
//    start, and end - begin == numel * element size (computed without overflow). Other keys in a
//    tensor's object are ignored: they cannot change how its bytes are read;
//  - the tensors' byte ranges, in offset order, tile the buffer exactly: no overlap, no hole and
//    no trailing bytes. The specification says "the byte buffer needs to be entirely indexed, and
//    cannot contain holes", which is what keeps a file from hiding a second file (a polyglot) in
//    its unused bytes, so trailing bytes are an error too, not something to skip.
constexpr uint64_t kLengthBytes = 8;
constexpr uint64_t kMaxHeaderBytes = uint64_t{100} << 20;

struct DtypeInfo {
  SafetensorsDtype dtype;
  std::string_view name;
  size_t size;
};

// Indexed by SafetensorsDtype.
constexpr std::array<DtypeInfo, 16> kDtypes = {{
    {SafetensorsDtype::kBool, "BOOL", 1},
    {SafetensorsDtype::kU8, "U8", 1},
    {SafetensorsDtype::kI8, "I8", 1},
    {SafetensorsDtype::kU16, "U16", 2},
    {SafetensorsDtype::kI16, "I16", 2},
    {SafetensorsDtype::kU32, "U32", 4},
    {SafetensorsDtype::kI32, "I32", 4},
    {SafetensorsDtype::kU64, "U64", 8},
    {SafetensorsDtype::kI64, "I64", 8},
    {SafetensorsDtype::kF16, "F16", 2},
    {SafetensorsDtype::kBF16, "BF16", 2},
    {SafetensorsDtype::kF32, "F32", 4},
    {SafetensorsDtype::kF64, "F64", 8},
    {SafetensorsDtype::kF8E4M3, "F8_E4M3", 1},
    {SafetensorsDtype::kF8E5M2, "F8_E5M2", 1},
    {SafetensorsDtype::kF8E8M0, "F8_E8M0", 1},
}};
static_assert([] {
  for (size_t i = 0; i < kDtypes.size(); ++i) {
    if (static_cast<size_t>(kDtypes[i].dtype) != i) return false;
  }
  return true;
}());

const DtypeInfo& dtype_info(SafetensorsDtype dtype) {
  const auto index = static_cast<size_t>(dtype);
  PC_ASSERT(index < kDtypes.size(), "SafetensorsDtype ", index);
  return kDtypes[index];
}

// The dtype the format calls `name`, or nullptr.
const DtypeInfo* dtype_named(std::string_view name) {
  for (const DtypeInfo& info : kDtypes) {
    if (info.name == name) return &info;
  }
  return nullptr;
}

std::string known_dtype_names() {
  std::string names;
  for (const DtypeInfo& info : kDtypes) {
    if (!names.empty()) names += ", ";
    names += info.name;
  }
  return names;
}

uint64_t read_u64_le(const std::byte* bytes) {
  uint64_t value = 0;
  for (int i = 7; i >= 0; --i) value = (value << 8) | std::to_integer<uint64_t>(bytes[i]);
  return value;
}

// Parses the header, refusing a key that appears twice in one object (Note [What a valid
// safetensors file is]).
Json parse_header(const path& file, std::string_view text) {
  std::vector<std::set<std::string>> open_objects;  // the keys seen in each enclosing object
  const auto refuse_duplicate_keys = [&](int /*depth*/, Json::parse_event_t event, Json& parsed) {
    switch (event) {
      case Json::parse_event_t::object_start:
        open_objects.emplace_back();
        break;
      case Json::parse_event_t::object_end:
        open_objects.pop_back();
        break;
      case Json::parse_event_t::key: {
        const auto& key = parsed.get_ref<const std::string&>();
        PC_CHECK(open_objects.back().insert(key).second, ModelError, file,
                 ": the header has the key '", key, "' twice in one object");
        break;
      }
      default:
        break;
    }
    return true;
  };
  try {
    return Json::parse(text, refuse_duplicate_keys);
  } catch (const Json::parse_error& e) {
    PC_THROW(ModelError, file, ": the header is not valid JSON (", e.what(),
             "); the file is damaged or not a safetensors file");
  }
}

std::map<std::string, std::string> parse_metadata(const path& file, const Json& value) {
  PC_CHECK(value.is_object(), ModelError, file, ": __metadata__ must be an object of strings, not ",
           value.dump());
  std::map<std::string, std::string> metadata;
  for (const auto& [key, text] : value.items()) {
    PC_CHECK(text.is_string(), ModelError, file, ": __metadata__ '", key,
             "' must be a string, not ", text.dump());
    metadata.emplace(key, text.get<std::string>());
  }
  return metadata;
}

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string text = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i > 0) text += ", ";
    text += std::to_string(shape[i]);
  }
  return text + "]";
}

// One header entry, checked on its own and against the buffer's size.
SafetensorsTensor parse_tensor(const path& file, const std::string& name, const Json& entry,
                               const std::byte* buffer, uint64_t buffer_bytes) {
  PC_CHECK(entry.is_object(), ModelError, file, ": tensor '", name,
           "' must be an object with dtype, shape and data_offsets, not ", entry.dump());
  for (const char* field : {"dtype", "shape", "data_offsets"}) {
    PC_CHECK(entry.contains(field), ModelError, file, ": tensor '", name, "' has no ", field);
  }
  SafetensorsTensor tensor;
  tensor.name = name;

  const Json& dtype = entry.at("dtype");
  const DtypeInfo* info =
      dtype.is_string() ? dtype_named(dtype.get_ref<const std::string&>()) : nullptr;
  PC_CHECK(info != nullptr, ModelError, file, ": tensor '", name, "' has unknown dtype ",
           dtype.dump(), " (known: ", known_dtype_names(), ")");
  tensor.dtype = info->dtype;

  const Json& shape = entry.at("shape");
  PC_CHECK(shape.is_array(), ModelError, file, ": tensor '", name,
           "': shape must be a list of integers, not ", shape.dump());
  uint64_t numel = 1;
  for (const Json& dim : shape) {
    PC_CHECK(dim.is_number_integer(), ModelError, file, ": tensor '", name,
             "': shape must be a list of integers, not ", shape.dump());
    // nlohmann::json stores every non-negative integer it parses as unsigned.
    PC_CHECK(dim.is_number_unsigned(), ModelError, file, ": tensor '", name, "': shape ",
             shape.dump(), " has a negative dimension");
    const auto size = dim.get<uint64_t>();
    PC_CHECK(size <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) &&
                 !__builtin_mul_overflow(numel, size, &numel),
             ModelError, file, ": tensor '", name, "': shape ", shape.dump(), " is too large");
    tensor.shape.push_back(static_cast<int64_t>(size));
  }
  uint64_t needed_bytes = 0;
  PC_CHECK(!__builtin_mul_overflow(numel, info->size, &needed_bytes), ModelError, file,
           ": tensor '", name, "': shape ", shape.dump(), " is too large");

  const Json& offsets = entry.at("data_offsets");
  PC_CHECK(offsets.is_array() && offsets.size() == 2 && offsets[0].is_number_unsigned() &&
               offsets[1].is_number_unsigned(),
           ModelError, file, ": tensor '", name,
           "': data_offsets must be [begin, end] with non-negative integers, not ", offsets.dump());
  const auto begin = offsets[0].get<uint64_t>();
  const auto end = offsets[1].get<uint64_t>();
  PC_CHECK(begin <= end, ModelError, file, ": tensor '", name, "': data_offsets ", offsets.dump(),
           " end before they begin");
  PC_CHECK(end <= buffer_bytes, ModelError, file, ": tensor '", name, "': data_offsets ",
           offsets.dump(), " reach past the end of the data buffer (", buffer_bytes,
           " bytes): the file is truncated or damaged");
  PC_CHECK(end - begin == needed_bytes, ModelError, file, ": tensor '", name, "': data_offsets ",
           offsets.dump(), " hold ", end - begin, " bytes but shape ", shape_text(tensor.shape),
           " of ", info->name, " needs ", needed_bytes);
  tensor.data = buffer + begin;
  tensor.bytes = needed_bytes;
  return tensor;
}

// The tensors' byte ranges must tile the buffer exactly (Note [What a valid safetensors file
// is]).
void check_buffer_is_tiled(const path& file, const std::vector<SafetensorsTensor>& tensors,
                           const std::byte* buffer, uint64_t buffer_bytes) {
  std::vector<const SafetensorsTensor*> by_offset;
  by_offset.reserve(tensors.size());
  for (const SafetensorsTensor& tensor : tensors) by_offset.push_back(&tensor);
  const auto offset = [&](const SafetensorsTensor* t) {
    return static_cast<uint64_t>(static_cast<const std::byte*>(t->data) - buffer);
  };
  std::sort(by_offset.begin(), by_offset.end(), [&](const auto* a, const auto* b) {
    return std::pair(offset(a), a->bytes) < std::pair(offset(b), b->bytes);
  });
  uint64_t covered = 0;  // bytes [0, covered) belong to the tensors seen so far
  const SafetensorsTensor* previous = nullptr;
  for (const SafetensorsTensor* tensor : by_offset) {
    const uint64_t begin = offset(tensor);
    PC_CHECK(begin >= covered, ModelError, file, ": tensors '", previous->name, "' and '",
             tensor->name, "' overlap in the data buffer; the file is damaged");
    PC_CHECK(begin == covered, ModelError, file, ": bytes [", covered, ", ", begin,
             ") of the data buffer belong to no tensor; the format allows no holes");
    covered = begin + tensor->bytes;
    previous = tensor;
  }
  PC_CHECK(covered == buffer_bytes, ModelError, file, ": ", buffer_bytes - covered,
           " trailing bytes after the last tensor belong to no tensor; the format requires the "
           "data buffer to hold exactly the tensors");
}

}  // namespace

std::string_view safetensors_dtype_name(SafetensorsDtype dtype) { return dtype_info(dtype).name; }

size_t safetensors_dtype_size(SafetensorsDtype dtype) { return dtype_info(dtype).size; }

int64_t SafetensorsTensor::numel() const {
  int64_t count = 1;
  for (int64_t dim : shape) count *= dim;  // cannot overflow: checked when the file was opened
  return count;
}

SafetensorsFile::Mapping::Mapping(const std::filesystem::path& file) {
  const int fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int error = errno;
    PC_THROW(ModelError, "cannot open ", file, ": ", std::generic_category().message(error));
  }
  // The mapping keeps the file open by itself, so the descriptor is closed on every path.
  struct CloseOnExit {
    int fd;
    ~CloseOnExit() { ::close(fd); }
  } close_on_exit{fd};

  struct stat info {};
  if (::fstat(fd, &info) != 0) {
    const int error = errno;
    PC_THROW(ModelError, "cannot stat ", file, ": ", std::generic_category().message(error));
  }
  PC_CHECK(S_ISREG(info.st_mode), ModelError, file, " is not a regular file");
  size_ = static_cast<size_t>(info.st_size);
  if (size_ == 0) return;  // mmap refuses empty ranges; the caller reports the empty file
  void* address = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
  if (address == MAP_FAILED) {
    const int error = errno;
    PC_THROW(ModelError, "cannot map ", file,
             " into memory: ", std::generic_category().message(error));
  }
  address_ = address;
}

SafetensorsFile::Mapping::~Mapping() {
  if (address_ != nullptr) ::munmap(address_, size_);
}

SafetensorsFile::Mapping::Mapping(Mapping&& other) noexcept
    : address_(std::exchange(other.address_, nullptr)), size_(std::exchange(other.size_, 0)) {}

SafetensorsFile::Mapping& SafetensorsFile::Mapping::operator=(Mapping&& other) noexcept {
  // `other` unmaps what this held when it is destroyed.
  std::swap(address_, other.address_);
  std::swap(size_, other.size_);
  return *this;
}

SafetensorsFile::SafetensorsFile(const std::filesystem::path& file) : path_(file), mapping_(file) {
  const uint64_t file_bytes = mapping_.size();
  PC_CHECK(file_bytes >= kLengthBytes, ModelError, path_, ": not a safetensors file: it has ",
           file_bytes, " bytes, fewer than the 8 that give the header length");
  const uint64_t header_bytes = read_u64_le(mapping_.data());
  PC_CHECK(header_bytes <= kMaxHeaderBytes, ModelError, path_, ": header length ", header_bytes,
           " is absurd (more than 100 MiB); the file is damaged or not a safetensors file");
  PC_CHECK(header_bytes <= file_bytes - kLengthBytes, ModelError, path_, ": header length ",
           header_bytes, " reaches past the end of the file (", file_bytes,
           " bytes); the file is truncated or not a safetensors file");

  const std::byte* header_start = mapping_.data() + kLengthBytes;
  const Json header = parse_header(
      path_, std::string_view(reinterpret_cast<const char*>(header_start), header_bytes));
  PC_CHECK(header.is_object(), ModelError, path_, ": the header is not a JSON object but ",
           header.type_name());

  const std::byte* buffer = header_start + header_bytes;
  const uint64_t buffer_bytes = file_bytes - kLengthBytes - header_bytes;
  for (const auto& [key, value] : header.items()) {
    if (key == "__metadata__") {
      metadata_ = parse_metadata(path_, value);
    } else {
      tensors_.push_back(parse_tensor(path_, key, value, buffer, buffer_bytes));
    }
  }
  std::sort(tensors_.begin(), tensors_.end(),
            [](const auto& a, const auto& b) { return a.name < b.name; });
  check_buffer_is_tiled(path_, tensors_, buffer, buffer_bytes);
}

const SafetensorsTensor* SafetensorsFile::find(std::string_view name) const {
  const auto it =
      std::lower_bound(tensors_.begin(), tensors_.end(), name,
                       [](const auto& tensor, std::string_view n) { return tensor.name < n; });
  return it != tensors_.end() && it->name == name ? &*it : nullptr;
}

std::vector<std::string> SafetensorsFile::names() const {
  std::vector<std::string> names;
  names.reserve(tensors_.size());
  for (const SafetensorsTensor& tensor : tensors_) names.push_back(tensor.name);
  return names;
}

SafetensorsWeights::SafetensorsWeights(const path& dir) : dir_(dir) {
  const path single = dir / "model.safetensors";
  const path index_file = dir / "model.safetensors.index.json";
  // The order transformers' from_pretrained looks for them in.
  if (is_regular_file_quietly(single)) {
    files_.emplace_back(single);
    for (const SafetensorsTensor& tensor : files_.front().tensors())
      file_of_.emplace(tensor.name, 0);
    return;
  }
  if (!is_regular_file_quietly(index_file)) {
    const bool pickled = is_regular_file_quietly(dir / "pytorch_model.bin") ||
                         is_regular_file_quietly(dir / "pytorch_model.bin.index.json");
    PC_CHECK(!pickled, ModelError, dir,
             " holds its weights only as pytorch_model.bin (a Python pickle, which can run code "
             "when loaded); precompute reads safetensors only. Convert the folder once with "
             "Python: transformers.AutoModel.from_pretrained(DIR).save_pretrained(DIR, "
             "safe_serialization=True)");
    PC_THROW(ModelError, dir,
             " has no model.safetensors (nor model.safetensors.index.json with its shards): "
             "give the folder save_pretrained wrote, with its weights");
  }

  const Json index = read_json_file(index_file);
  PC_CHECK(index.is_object() && index.contains("weight_map") && index["weight_map"].is_object(),
           ModelError, index_file, " has no \"weight_map\" object (tensor name -> shard file)");
  std::map<std::string, size_t> opened;  // shard file name -> index into files_
  for (const auto& [name, shard] : index["weight_map"].items()) {
    PC_CHECK(shard.is_string(), ModelError, index_file, ": the shard of tensor '", name,
             "' must be a file name, not ", shard.dump());
    const auto& shard_name = shard.get_ref<const std::string&>();
    const auto [it, first_use] = opened.try_emplace(shard_name, files_.size());
    if (first_use) {
      PC_CHECK(is_regular_file_quietly(dir / shard_name), ModelError, index_file, " puts tensor '",
               name, "' in ", shard_name, ", which is not in ", dir,
               ": the download is incomplete");
      files_.emplace_back(dir / shard_name);
    }
    PC_CHECK(files_[it->second].find(name) != nullptr, ModelError, files_[it->second].path(),
             " has no tensor '", name, "', which ", index_file, " puts there");
    file_of_.emplace(name, it->second);
  }
  PC_CHECK(!file_of_.empty(), ModelError, index_file, " lists no tensors");
}

const SafetensorsTensor* SafetensorsWeights::find(std::string_view name) const {
  const auto it = file_of_.find(name);
  return it == file_of_.end() ? nullptr : files_[it->second].find(name);
}

const SafetensorsTensor& SafetensorsWeights::at(std::string_view name) const {
  const SafetensorsTensor* tensor = find(name);
  PC_CHECK(tensor != nullptr, ModelError, "the weights in ", dir_, " have no tensor '", name,
           "': the checkpoint does not match the model its config.json describes");
  return *tensor;
}

std::vector<std::string> SafetensorsWeights::names() const {
  std::vector<std::string> names;
  names.reserve(file_of_.size());
  for (const auto& entry : file_of_) names.push_back(entry.first);
  return names;
}

}  // namespace precompute
