# Warnings, sanitizers and ccache for every target of the project.

if(PRECOMPUTE_USE_CCACHE)
  find_program(PRECOMPUTE_CCACHE ccache)
  if(PRECOMPUTE_CCACHE)
    set(CMAKE_C_COMPILER_LAUNCHER "${PRECOMPUTE_CCACHE}")
    set(CMAKE_CXX_COMPILER_LAUNCHER "${PRECOMPUTE_CCACHE}")
  endif()
endif()

add_library(precompute_options INTERFACE)
add_library(precompute::options ALIAS precompute_options)
target_compile_options(precompute_options INTERFACE
  -Wall -Wextra -Wpedantic -Wno-unused-parameter
  $<$<BOOL:${PRECOMPUTE_WARNINGS_AS_ERRORS}>:-Werror>)
target_include_directories(precompute_options INTERFACE "${PROJECT_SOURCE_DIR}")

# Note [LibTorch exports std::filesystem]
# libtorch.so and libtorch_cpu.so of the PyPI wheel export their own copies of std::filesystem
# functions, some of them broken (std::filesystem::remove_all jumps to address 0). A program's
# symbols bind to the first library in its DT_NEEDED list that defines them, and the compiler
# driver appends libstdc++ last, so every binary names libstdc++ first.
target_link_options(precompute_options INTERFACE
  "LINKER:--push-state,--no-as-needed" "-lstdc++" "LINKER:--pop-state")

if(PRECOMPUTE_SANITIZE)
  string(REPLACE ";" "," _sanitizers "${PRECOMPUTE_SANITIZE}")
  target_compile_options(precompute_options INTERFACE
    -fsanitize=${_sanitizers} -fno-omit-frame-pointer -fno-sanitize-recover=undefined)
  target_link_options(precompute_options INTERFACE -fsanitize=${_sanitizers})
endif()
