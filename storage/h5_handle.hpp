#pragma once
// The storage layer's way of calling the HDF5 C API (after HighFive, over the plain C API): every
// identifier is owned by an H5Handle that closes it with the matching H5*close, and every call's
// result goes through h5_check(), which turns a failure into a StorageError carrying the
// operation, the file and the text of HDF5's error stack. HDF5's own printing of errors to
// stderr is switched off, so a failure is reported once, by the exception.
//
// Private to storage/ (it exposes hdf5.h). Not thread-safe, like HDF5 itself in the serial build:
// use from one thread at a time (ShardWriter's writer thread, or read_shard's caller).

#include <hdf5.h>

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>

namespace precompute {

// Switches HDF5's automatic error printing off for the calling thread. Call before the first
// HDF5 call of an operation; after the first time on a thread it costs a thread_local check.
void disable_hdf5_error_printing();

// Throws StorageError "<operation> failed for <file>: <HDF5 error stack>" and clears the stack.
[[noreturn]] void throw_hdf5_error(std::string_view operation, const std::filesystem::path& file);

// Returns `result` (an hid_t, herr_t, htri_t or size), or throws as above when it is negative,
// which is how every HDF5 C function reports failure.
template <class Result>
Result h5_check(Result result, std::string_view operation, const std::filesystem::path& file) {
  if (result < 0) throw_hdf5_error(operation, file);
  return result;
}

// Owns one HDF5 identifier (file, group, dataset, attribute, dataspace, datatype or property
// list) and closes it with the matching close function. Movable, not copyable. The destructor
// never throws: a failed close is logged (it only happens after an earlier, reported error).
class H5Handle {
 public:
  H5Handle() = default;
  explicit H5Handle(hid_t id) noexcept : id_(id) {}
  ~H5Handle() { close_quietly(); }

  H5Handle(H5Handle&& other) noexcept : id_(other.id_) { other.id_ = H5I_INVALID_HID; }
  H5Handle& operator=(H5Handle&& other) noexcept;
  H5Handle(const H5Handle&) = delete;
  H5Handle& operator=(const H5Handle&) = delete;

  hid_t get() const noexcept { return id_; }

 private:
  void close_quietly() noexcept;

  hid_t id_ = H5I_INVALID_HID;
};

// Takes ownership of the result of an H5*create / H5*open / H5*copy call after h5_check().
inline H5Handle h5_own(hid_t id, std::string_view operation, const std::filesystem::path& file) {
  return H5Handle(h5_check(id, operation, file));
}

// How a C++ element type is stored in a file (fixed little-endian, so that a file reads the same
// on every machine) and described in memory.
template <class T>
struct H5Type;
template <>
struct H5Type<uint8_t> {
  static hid_t file() { return H5T_STD_U8LE; }
  static hid_t memory() { return H5T_NATIVE_UINT8; }
};
template <>
struct H5Type<int32_t> {
  static hid_t file() { return H5T_STD_I32LE; }
  static hid_t memory() { return H5T_NATIVE_INT32; }
};
template <>
struct H5Type<int64_t> {
  static hid_t file() { return H5T_STD_I64LE; }
  static hid_t memory() { return H5T_NATIVE_INT64; }
};
template <>
struct H5Type<double> {
  static hid_t file() { return H5T_IEEE_F64LE; }
  static hid_t memory() { return H5T_NATIVE_DOUBLE; }
};

// The two datatypes the shard format adds to HDF5's predefined ones, shared by writer and reader.
// Variable-length UTF-8 strings (h5py reads them as str via .asstr(), and string attributes as
// str directly).
H5Handle make_utf8_string_type(const std::filesystem::path& file);
// IEEE binary16, little-endian: h5py and numpy read it as float16.
H5Handle make_float16_type(const std::filesystem::path& file);

}  // namespace precompute
