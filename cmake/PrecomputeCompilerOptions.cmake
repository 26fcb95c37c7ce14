# Warnings, sanitizers, fuzzing instrumentation and ccache for every target of the project.

# ccache is the user's choice (-DPRECOMPUTE_USE_CCACHE=ON), never switched on behind their back.
if(PRECOMPUTE_USE_CCACHE)
  find_program(PRECOMPUTE_CCACHE ccache)
  if(NOT PRECOMPUTE_CCACHE)
    message(FATAL_ERROR "PRECOMPUTE_USE_CCACHE=ON but ccache is not installed "
                        "(apt-get install ccache), or configure without it")
  endif()
  set(CMAKE_C_COMPILER_LAUNCHER "${PRECOMPUTE_CCACHE}")
  set(CMAKE_CXX_COMPILER_LAUNCHER "${PRECOMPUTE_CCACHE}")
endif()

add_library(precompute_options INTERFACE)
add_library(precompute::options ALIAS precompute_options)
# C and C++ only: nvcc's generated host code (gpu_rgb_kernel.cu) trips -Wpedantic on its own
# line directives.
target_compile_options(precompute_options INTERFACE
  $<$<COMPILE_LANGUAGE:C,CXX>:-Wall -Wextra -Wpedantic -Wno-unused-parameter>
  $<$<AND:$<COMPILE_LANGUAGE:C,CXX>,$<BOOL:${PRECOMPUTE_WARNINGS_AS_ERRORS}>>:-Werror>)
# PC_ASSERT's `, ##__VA_ARGS__` is a GNU extension that gcc accepts silently under -Wpedantic;
# clang (the sanitizer build) would warn at every use.
if(CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
  target_compile_options(precompute_options INTERFACE -Wno-gnu-zero-variadic-macro-arguments)
endif()
target_include_directories(precompute_options INTERFACE "${PROJECT_SOURCE_DIR}")

# Note [LibTorch exports std::filesystem]
# libtorch.so and libtorch_cpu.so of the PyPI wheel export their own copies of std::filesystem
# functions, some of them broken (std::filesystem::remove_all jumps to address 0: a GPU test's
# clean-up crashed so on the GPU machine). A program's symbols bind to the first library in its
# DT_NEEDED list that defines them, and the compiler driver appends libstdc++ last, so every
# binary names libstdc++ first, by the full path of its shared library (libstdc++.so.6). On the
# GPU machine (Ubuntu 24.04, gcc 13) `-print-file-name=libstdc++.so` finds nothing, and a plain
# `-lstdc++` there gives binaries without any DT_NEEDED entry for libstdc++, their
# std::filesystem symbols bound to LibTorch; so libstdc++.so.6 is named by path, which makes it
# their first DT_NEEDED entry (tools/bench/build_on_gpu.sh prints how many bind to LibTorch: 0).
set(_libstdcxx "-lstdc++")
foreach(_name libstdc++.so.6 libstdc++.so)
  execute_process(COMMAND ${CMAKE_CXX_COMPILER} -print-file-name=${_name}
                  OUTPUT_VARIABLE _found OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
  if(IS_ABSOLUTE "${_found}" AND EXISTS "${_found}")
    set(_libstdcxx "${_found}")
    break()
  endif()
endforeach()
target_link_options(precompute_options INTERFACE
  "LINKER:--push-state,--no-as-needed" "${_libstdcxx}" "LINKER:--pop-state")

if(PRECOMPUTE_SANITIZE)
  string(REPLACE ";" "," _sanitizers "${PRECOMPUTE_SANITIZE}")
  target_compile_options(precompute_options INTERFACE
    -fsanitize=${_sanitizers} -fno-omit-frame-pointer -fno-sanitize-recover=undefined)
  # _GLIBCXX_ASSERTIONS adds the bounds checks ASan cannot make: an index past a vector's size
  # but inside its capacity reads memory ASan considers valid.
  target_compile_definitions(precompute_options INTERFACE _GLIBCXX_ASSERTIONS)
  target_link_options(precompute_options INTERFACE -fsanitize=${_sanitizers})
endif()

# libFuzzer targets (tests/fuzz) need clang. The libraries they call are compiled with libFuzzer's
# coverage instrumentation too, or the fuzzer would be blind to the branches of our own parsers.
option(PRECOMPUTE_FUZZ "Build the libFuzzer targets of tests/fuzz (clang only)" OFF)
if(PRECOMPUTE_FUZZ)
  if(NOT CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
    message(FATAL_ERROR "PRECOMPUTE_FUZZ=ON needs clang (libFuzzer), not ${CMAKE_CXX_COMPILER_ID}: "
                        "configure with -DCMAKE_CXX_COMPILER=clang++-14 -DCMAKE_C_COMPILER=clang-14")
  endif()
  target_compile_options(precompute_options INTERFACE -fsanitize=fuzzer-no-link)
endif()
