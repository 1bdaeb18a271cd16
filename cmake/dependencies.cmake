# Third-party dependencies, all from Debian packages (scripts/bootstrap.sh).
find_package(Threads REQUIRED)
find_package(spdlog CONFIG REQUIRED)   # compiled library: far cheaper to build against
find_package(fmt CONFIG REQUIRED)

# CAF has no CMake package on Debian: wrap the libraries in imported targets.
find_path(CAF_INCLUDE_DIR caf/all.hpp REQUIRED)
find_library(CAF_CORE_LIBRARY caf_core REQUIRED)
find_library(CAF_IO_LIBRARY caf_io REQUIRED)
add_library(caf::core UNKNOWN IMPORTED)
set_target_properties(caf::core PROPERTIES IMPORTED_LOCATION ${CAF_CORE_LIBRARY}
  INTERFACE_INCLUDE_DIRECTORIES ${CAF_INCLUDE_DIR} INTERFACE_LINK_LIBRARIES Threads::Threads)
add_library(caf::io UNKNOWN IMPORTED)
set_target_properties(caf::io PROPERTIES IMPORTED_LOCATION ${CAF_IO_LIBRARY}
  INTERFACE_LINK_LIBRARIES caf::core)
# Mutual TLS between cluster processes (libcaf-openssl, installed with libcaf-dev).
find_library(CAF_OPENSSL_LIBRARY caf_openssl REQUIRED)
add_library(caf::openssl UNKNOWN IMPORTED)
set_target_properties(caf::openssl PROPERTIES IMPORTED_LOCATION ${CAF_OPENSSL_LIBRARY}
  INTERFACE_LINK_LIBRARIES caf::io)
# OpenSSL itself: exaserve gen-certs writes the cluster's CA and certificates.
find_package(OpenSSL REQUIRED)

find_package(CapnProto CONFIG REQUIRED)

if(EXASERVE_TESTS)
  find_package(Catch2 REQUIRED)
  include(Catch)
endif()

# CUDA is optional: compiled and linked only when nvcc is found.
set(EXASERVE_HAVE_CUDA OFF)
if(EXASERVE_CUDA)
  if(NOT CMAKE_CUDA_COMPILER AND EXISTS /usr/local/cuda/bin/nvcc)
    set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)
  endif()
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
      # A100 (80) and H100/H200 (90) at least; nvcc 13's default is older.
      set(CMAKE_CUDA_ARCHITECTURES "80;90")
    endif()
    enable_language(CUDA)
    find_package(CUDAToolkit REQUIRED)
    set(EXASERVE_HAVE_CUDA ON)
    message(STATUS "exaserve: CUDA ${CUDAToolkit_VERSION} found; building the CUDA device")
  else()
    message(STATUS "exaserve: nvcc not found; building without the CUDA device")
  endif()
endif()
