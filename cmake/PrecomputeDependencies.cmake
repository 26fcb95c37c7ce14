# Every third-party dependency, found as an installed package; nothing is vendored.
#
# Note [Two fmt libraries]
# LibTorch's wheel ships fmt 12 headers in torch/include, Debian's spdlog is built against the
# system fmt 9. A translation unit that sees both include paths would compile spdlog's templates
# against the wrong fmt. So only encoders/ links LibTorch, and privately: its public headers are
# free of LibTorch, its .cpp files log through precompute::log_message (pipeline/core/logging.hpp)
# and never include spdlog.

find_package(PkgConfig REQUIRED)
# FFmpeg 5.1 or newer: the audio decoder uses the AVChannelLayout API, new in 5.1. The library
# versions of the 5.1 release:
set(_ffmpeg_minimum libavformat>=59.27.100 libavcodec>=59.37.100 libavutil>=57.28.100
                    libswscale>=6.7.100 libswresample>=4.7.100)
pkg_check_modules(FFMPEG IMPORTED_TARGET ${_ffmpeg_minimum})
if(NOT FFMPEG_FOUND)
  set(_found "")
  foreach(_lib libavformat libavcodec libavutil libswscale libswresample)
    execute_process(COMMAND "${PKG_CONFIG_EXECUTABLE}" --modversion ${_lib}
                    OUTPUT_VARIABLE _version OUTPUT_STRIP_TRAILING_WHITESPACE
                    RESULT_VARIABLE _rc ERROR_QUIET)
    if(_rc EQUAL 0)
      string(APPEND _found " ${_lib} ${_version}")
    else()
      string(APPEND _found " ${_lib} (none)")
    endif()
  endforeach()
  list(JOIN _ffmpeg_minimum " " _wanted)
  message(FATAL_ERROR "precompute needs FFmpeg 5.1 or newer (${_wanted}); pkg-config "
                      "found:${_found}. On Debian 12: apt-get install libavformat-dev "
                      "libavcodec-dev libavutil-dev libswscale-dev libswresample-dev; elsewhere "
                      "point PKG_CONFIG_PATH at an FFmpeg 5.1+ installation.")
endif()
pkg_check_modules(UTF8PROC REQUIRED IMPORTED_TARGET libutf8proc)

find_package(HDF5 REQUIRED COMPONENTS C)
# H5Dwrite_chunk (Note [Chunks written whole] in storage/shard_writer.cpp) came with 1.10.3.
if(HDF5_VERSION AND HDF5_VERSION VERSION_LESS 1.10.3)
  message(FATAL_ERROR "precompute needs HDF5 1.10.3 or later (found ${HDF5_VERSION}); on Debian "
                      "12: apt-get install libhdf5-dev")
endif()
find_package(TBB REQUIRED)
find_package(spdlog REQUIRED)
find_package(fmt REQUIRED)
find_package(yaml-cpp REQUIRED)
find_package(nlohmann_json 3.10 REQUIRED)
find_package(CLI11 REQUIRED)
find_package(Threads REQUIRED)

# yaml-cpp 0.7 (Debian 12) exports `yaml-cpp`, 0.8 exports `yaml-cpp::yaml-cpp`.
if(NOT TARGET yaml-cpp::yaml-cpp)
  add_library(yaml-cpp::yaml-cpp ALIAS yaml-cpp)
endif()

set(PRECOMPUTE_WITH_CUDA OFF)
# The rest is LibTorch's, which a build without it (PRECOMPUTE_WITH_TORCH=OFF) does not look for.
if(NOT PRECOMPUTE_WITH_TORCH)
  return()
endif()

# LibTorch from the project venv's `torch` wheel: ask its Python where the CMake package lives.
if(NOT PRECOMPUTE_PYTHON)
  if(EXISTS "${PROJECT_SOURCE_DIR}/.venv/bin/python")
    set(PRECOMPUTE_PYTHON "${PROJECT_SOURCE_DIR}/.venv/bin/python")
  else()
    find_program(PRECOMPUTE_PYTHON python3 REQUIRED)
  endif()
endif()
set(PRECOMPUTE_PYTHON "${PRECOMPUTE_PYTHON}" CACHE FILEPATH "Python whose torch package provides LibTorch")
execute_process(
  COMMAND "${PRECOMPUTE_PYTHON}" -c "import torch.utils; print(torch.utils.cmake_prefix_path)"
  OUTPUT_VARIABLE _torch_prefix OUTPUT_STRIP_TRAILING_WHITESPACE
  RESULT_VARIABLE _torch_rc ERROR_QUIET)
if(_torch_rc EQUAL 0)
  list(APPEND CMAKE_PREFIX_PATH "${_torch_prefix}")
endif()

if(NOT PRECOMPUTE_CUDA STREQUAL "OFF")
  find_program(PRECOMPUTE_NVCC nvcc HINTS /usr/local/cuda/bin ENV CUDA_HOME PATH_SUFFIXES bin)
  if(PRECOMPUTE_NVCC)
    get_filename_component(_cuda_bin "${PRECOMPUTE_NVCC}" DIRECTORY)
    get_filename_component(CUDAToolkit_ROOT "${_cuda_bin}" DIRECTORY)
  elseif(PRECOMPUTE_CUDA STREQUAL "ON")
    message(FATAL_ERROR "PRECOMPUTE_CUDA=ON but no nvcc was found: install the CUDA toolkit or "
                        "configure with -DPRECOMPUTE_CUDA=OFF")
  endif()
endif()

if(PRECOMPUTE_NVCC AND NOT PRECOMPUTE_CUDA STREQUAL "OFF")
  # precompute compiles no kernels with LibTorch's flags; a fixed architecture list keeps
  # LibTorch's package from probing for a GPU at configure time (a build machine may have none).
  if(NOT TORCH_CUDA_ARCH_LIST)
    set(TORCH_CUDA_ARCH_LIST "9.0")
  endif()
  # LibTorch's CMake package prints warnings about optional pieces (kineto) it does not need.
  find_package(Torch REQUIRED)
  if(CAFFE2_USE_CUDA)
    set(PRECOMPUTE_WITH_CUDA ON)
    # precompute's own kernels (pipeline/media, encoders/bert), in the top directory's scope so
    # that both folders can compile CUDA.
    if(NOT CMAKE_CUDA_COMPILER)
      set(CMAKE_CUDA_COMPILER "${PRECOMPUTE_NVCC}")
    endif()
    if(NOT CMAKE_CUDA_ARCHITECTURES)
      # H100/H200 natively, and PTX that newer GPUs compile at load time.
      set(CMAKE_CUDA_ARCHITECTURES 90-real 90-virtual)
    endif()
    enable_language(CUDA)
    find_package(CUDAToolkit REQUIRED)
  endif()
else()
  # CPU-only build. LibTorch's CMake package refuses to load without a CUDA toolkit when the
  # library was built with CUDA (as the PyPI wheel is), although its C++ API needs none of it to
  # compile and link: describe the library ourselves.
  execute_process(
    COMMAND "${PRECOMPUTE_PYTHON}" -c
            "import os, torch; print(os.path.dirname(torch.__file__)); print(int(torch._C._GLIBCXX_USE_CXX11_ABI))"
    OUTPUT_VARIABLE _torch_info OUTPUT_STRIP_TRAILING_WHITESPACE RESULT_VARIABLE _torch_rc)
  if(NOT _torch_rc EQUAL 0)
    message(FATAL_ERROR "cannot import torch with ${PRECOMPUTE_PYTHON}; run tools/setup.sh")
  endif()
  string(REPLACE "\n" ";" _torch_info "${_torch_info}")
  list(GET _torch_info 0 _torch_root)
  list(GET _torch_info 1 _torch_abi)
  add_library(torch INTERFACE IMPORTED)
  target_include_directories(torch SYSTEM INTERFACE
    "${_torch_root}/include" "${_torch_root}/include/torch/csrc/api/include")
  target_link_libraries(torch INTERFACE
    "${_torch_root}/lib/libtorch.so" "${_torch_root}/lib/libtorch_cpu.so"
    "${_torch_root}/lib/libc10.so")
  target_compile_definitions(torch INTERFACE _GLIBCXX_USE_CXX11_ABI=${_torch_abi})
  execute_process(COMMAND "${PRECOMPUTE_PYTHON}" -c "import torch; print(torch.__version__)"
                  OUTPUT_VARIABLE Torch_VERSION OUTPUT_STRIP_TRAILING_WHITESPACE)
endif()
# Where the installed binary finds LibTorch (tools/cli's install rules): CMake leaves link
# folders inside the source tree, such as the project venv, out of the install RPATH.
if(TORCH_INSTALL_PREFIX)
  set(PRECOMPUTE_TORCH_LIBDIR "${TORCH_INSTALL_PREFIX}/lib")
else()
  set(PRECOMPUTE_TORCH_LIBDIR "${_torch_root}/lib")
endif()
message(STATUS "precompute: LibTorch ${Torch_VERSION} from ${_torch_prefix}, CUDA: ${PRECOMPUTE_WITH_CUDA}")
