# mtpscope's build of llama.cpp's `llama-server` (traces/server/build.py copies this file to
# <work>/wrapper/CMakeLists.txt and configures it).
#
# It compiles only what llama-cpp-python's wheel does not ship: the common library, cpp-httplib, the
# (empty) UI stub and the server. ggml, llama and mtmd are the wheel's own shared libraries, copied
# beside the binary (RUNPATH $ORIGIN): the server then runs the very machine code that mtpscope's
# recorder runs through llama-cpp-python.
#
# Inputs (-D): LLAMA_SRC (the sdist's vendor/llama.cpp), WHEEL_LIBS (the folder holding the copied
# libggml-base / libggml / libggml-cpu / libllama / libmtmd .so files), LLAMA_BUILD_COMMIT (a label).
cmake_minimum_required(VERSION 3.14)
project(mtpscope_llama_server C CXX)

if (NOT LLAMA_SRC OR NOT WHEEL_LIBS)
    message(FATAL_ERROR "LLAMA_SRC and WHEEL_LIBS must be given")
endif()

# llama.cpp's CMake files name their own root PROJECT_SOURCE_DIR (include paths, scripts).
set(PROJECT_SOURCE_DIR "${LLAMA_SRC}")
list(APPEND CMAKE_MODULE_PATH "${LLAMA_SRC}/cmake/")
set(CMAKE_RUNTIME_OUTPUT_DIRECTORY "${CMAKE_BINARY_DIR}/bin")
# the binary finds the wheel's libraries beside itself, and nothing else (no build-tree paths)
set(CMAKE_BUILD_WITH_INSTALL_RPATH ON)
set(CMAKE_INSTALL_RPATH "$ORIGIN")

set(LLAMA_VERSION_MAJOR 0)
set(LLAMA_VERSION_MINOR 5)
set(LLAMA_VERSION_PATCH 0)
set(LLAMA_VERSION_BASE "${LLAMA_VERSION_MAJOR}.${LLAMA_VERSION_MINOR}.${LLAMA_VERSION_PATCH}")
set(LLAMA_BUILD_COMMON ON)
set(LLAMA_BUILD_SERVER ON)
set(LLAMA_SUBPROCESS ON)
set(LLAMA_OPENSSL OFF)
set(LLAMA_LLGUIDANCE OFF)
set(LLAMA_BUILD_UI OFF)
set(LLAMA_USE_PREBUILT_UI OFF)
# common and the server are linked into the one binary; only the wheel's libraries are shared
set(BUILD_SHARED_LIBS OFF)

include("${LLAMA_SRC}/cmake/license.cmake")
# build-info.cpp's fields (llama.cpp's build-info.cmake would ask git, and the sdist is no checkout)
set(LLAMA_BUILD_NUMBER 0)
if (NOT LLAMA_BUILD_COMMIT)
    set(LLAMA_BUILD_COMMIT "unknown")
endif()
set(BUILD_COMPILER "${CMAKE_C_COMPILER_ID} ${CMAKE_C_COMPILER_VERSION}")
set(BUILD_TARGET "${CMAKE_SYSTEM_NAME} ${CMAKE_SYSTEM_PROCESSOR}")

# llama.cpp's warning flags are not needed to build it; keep its hook, without flags.
function(llama_add_compile_flags)
endfunction()

find_package(Threads REQUIRED)

# The wheel's libraries as imported targets with the sdist's headers.
function(mtps_imported NAME FILE INCLUDE DEPS)
    add_library(${NAME} SHARED IMPORTED GLOBAL)
    set_target_properties(${NAME} PROPERTIES
        IMPORTED_LOCATION "${WHEEL_LIBS}/${FILE}"
        INTERFACE_INCLUDE_DIRECTORIES "${INCLUDE}"
        INTERFACE_COMPILE_DEFINITIONS "LLAMA_SHARED;GGML_SHARED"
        INTERFACE_LINK_LIBRARIES "${DEPS}")
endfunction()
mtps_imported(ggml-base libggml-base.so "${LLAMA_SRC}/ggml/include" "")
mtps_imported(ggml-cpu libggml-cpu.so "${LLAMA_SRC}/ggml/include" "ggml-base")
mtps_imported(ggml libggml.so "${LLAMA_SRC}/ggml/include" "ggml-base")
mtps_imported(llama libllama.so "${LLAMA_SRC}/include" "ggml")
mtps_imported(mtmd libmtmd.so "${LLAMA_SRC}/tools/mtmd" "llama;ggml")

add_subdirectory("${LLAMA_SRC}/vendor" vendor)
add_subdirectory("${LLAMA_SRC}/common" common)
add_subdirectory("${LLAMA_SRC}/tools/ui" ui)
add_subdirectory("${LLAMA_SRC}/tools/server" server)
