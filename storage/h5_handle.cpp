#include "storage/h5_handle.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <array>
#include <sstream>
#include <string>

#include "pipeline/core/error.hpp"

namespace precompute {
namespace {

// The text of one HDF5 message class (major or minor error number), or "" when it has none.
std::string hdf5_message(hid_t message_id) {
  std::array<char, 256> text{};
  if (H5Eget_msg(message_id, nullptr, text.data(), text.size()) < 0) return {};
  return text.data();
}

// Appends one frame of HDF5's error stack: "H5Dcreate2(): unable to create dataset (Dataset:
// Unable to initialize object)". Frames are walked from the API call down to the cause.
herr_t append_error_frame(unsigned index, const H5E_error2_t* frame, void* out) {
  auto& text = *static_cast<std::ostringstream*>(out);
  if (index > 0) text << "; ";
  text << (frame->func_name ? frame->func_name : "?") << "(): " << (frame->desc ? frame->desc : "")
       << " (" << hdf5_message(frame->maj_num) << ": " << hdf5_message(frame->min_num) << ")";
  return 0;
}

// The current error stack as one line, then cleared so that the next failure starts afresh.
std::string take_hdf5_error_stack() {
  std::ostringstream text;
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_DOWNWARD, append_error_frame, &text);
  H5Eclear2(H5E_DEFAULT);
  std::string result = text.str();
  std::replace(result.begin(), result.end(), '\n', ' ');  // some frames span lines
  return result.empty() ? "no details on HDF5's error stack" : result;
}

}  // namespace

void disable_hdf5_error_printing() {
  // Per thread rather than per process: in a thread-safe HDF5 build the automatic printing is a
  // setting of each thread's error stack (in the serial build the first call settles it).
  thread_local bool disabled = false;
  if (disabled) return;
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  disabled = true;
}

void throw_hdf5_error(std::string_view operation, const std::filesystem::path& file) {
  PC_THROW(StorageError, operation, " failed for ", file, ": ", take_hdf5_error_stack());
}

H5Handle& H5Handle::operator=(H5Handle&& other) noexcept {
  if (this != &other) {
    close_quietly();
    id_ = other.id_;
    other.id_ = H5I_INVALID_HID;
  }
  return *this;
}

void H5Handle::close_quietly() noexcept {
  if (id_ < 0) return;
  const hid_t id = id_;
  id_ = H5I_INVALID_HID;
  herr_t status = -1;
  switch (H5Iget_type(id)) {
    case H5I_FILE:
      status = H5Fclose(id);
      break;
    case H5I_GROUP:
      status = H5Gclose(id);
      break;
    case H5I_DATASET:
      status = H5Dclose(id);
      break;
    case H5I_ATTR:
      status = H5Aclose(id);
      break;
    case H5I_DATASPACE:
      status = H5Sclose(id);
      break;
    case H5I_DATATYPE:
      status = H5Tclose(id);
      break;
    case H5I_GENPROP_LST:
      status = H5Pclose(id);
      break;
    default:
      break;  // not a kind of identifier H5Handle is given: reported below
  }
  if (status < 0) {
    try {
      spdlog::warn("HDF5: closing identifier {} failed: {}", id, take_hdf5_error_stack());
    } catch (...) {
      // Logging is best effort here; a destructor must not throw.
    }
  }
}

H5Handle make_utf8_string_type(const std::filesystem::path& file) {
  H5Handle type = h5_own(H5Tcopy(H5T_C_S1), "H5Tcopy(string)", file);
  h5_check(H5Tset_size(type.get(), H5T_VARIABLE), "H5Tset_size(string)", file);
  h5_check(H5Tset_cset(type.get(), H5T_CSET_UTF8), "H5Tset_cset(string)", file);
  return type;
}

H5Handle make_float16_type(const std::filesystem::path& file) {
  // Built from float32 as h5py does: 1 sign bit at 15, 5 exponent bits at 10 (bias 15), 10
  // mantissa bits at 0. The fields must shrink before the size does.
  H5Handle type = h5_own(H5Tcopy(H5T_IEEE_F32LE), "H5Tcopy(float16)", file);
  h5_check(H5Tset_fields(type.get(), 15, 10, 5, 0, 10), "H5Tset_fields(float16)", file);
  h5_check(H5Tset_size(type.get(), 2), "H5Tset_size(float16)", file);
  h5_check(H5Tset_ebias(type.get(), 15), "H5Tset_ebias(float16)", file);
  return type;
}

}  // namespace precompute
