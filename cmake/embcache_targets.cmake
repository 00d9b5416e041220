# What every target of the project sets, in one place.

# embcache_warnings(<target>): the warnings every host translation unit of the project compiles
# with (CUDA translation units keep nvcc's defaults).
# A unity build (CMAKE_UNITY_BUILD, EMBCACHE_UNITY_BATCH) includes each source file into a
# generated one, so g++ takes a source file's anonymous-namespace types for a header's and warns
# about every class that uses one (-Wsubobject-linkage); inside one translation unit that warning
# is void, so it is off for unity targets.
function(embcache_warnings target)
  set(gnu_unity "$<AND:$<COMPILE_LANGUAGE:CXX>,$<CXX_COMPILER_ID:GNU>,$<BOOL:$<TARGET_PROPERTY:UNITY_BUILD>>>")
  target_compile_options(${target} PRIVATE
    $<$<AND:$<COMPILE_LANGUAGE:CXX>,$<CXX_COMPILER_ID:GNU,Clang>>:-Wall -Wextra>
    $<${gnu_unity}:-Wno-subobject-linkage>)
endfunction()

# embcache_pin_host_thrust(<target>): Thrust's systems pinned to TBB and the CPU in the target's
# C++ translation units, so that a host translation unit can never pick Thrust's CUDA system by
# accident. Its CUDA translation units (embcache_cuda_sources) keep Thrust's CUDA system.
function(embcache_pin_host_thrust target)
  target_compile_definitions(${target} PRIVATE
    $<$<COMPILE_LANGUAGE:CXX>:THRUST_DEVICE_SYSTEM=THRUST_DEVICE_SYSTEM_TBB>
    $<$<COMPILE_LANGUAGE:CXX>:THRUST_HOST_SYSTEM=THRUST_HOST_SYSTEM_CPP>)
endfunction()

# embcache_host_target(<target>): a target of host translation units: the warnings and Thrust
# pinned to the host (embcache_pin_host_thrust).
function(embcache_host_target target)
  embcache_warnings(${target})
  embcache_pin_host_thrust(${target})
endfunction()

# embcache_cuda_target(<target>): what every CUDA translation unit of the project compiles with:
# nvcc's --expt-relaxed-constexpr and --extended-lambda (the EMBCACHE_HD functors and device
# lambdas of the portable definitions), and whole-program compilation (no relocatable device
# code: CUDA_SEPARABLE_COMPILATION OFF).
function(embcache_cuda_target target)
  set_target_properties(${target} PROPERTIES CUDA_SEPARABLE_COMPILATION OFF)
  target_compile_options(${target} PRIVATE
    $<$<COMPILE_LANGUAGE:CUDA>:--expt-relaxed-constexpr --extended-lambda>)
endfunction()

# embcache_cuda_sources(<target> <source>...): a part's translation units of the cuda space, added
# by the part's own CMakeLists.txt to the library they belong to (embcache_cuda, or
# embcache_trainer for the trainer's device parts), which then compiles as embcache_cuda_target.
# Called only when EMBCACHE_HAVE_CUDA.
function(embcache_cuda_sources target)
  target_sources(${target} PRIVATE ${ARGN})
  embcache_cuda_target(${target})
endfunction()

# embcache_light_optimization(<target>): the target's own C++ translation units compile at -O1 in
# the optimized configurations (Release, RelWithDebInfo; a later -O wins over CMake's -O3/-O2):
# code that drives the libraries, whose own translation units keep -O3, and whose compile time
# -O1 halves (GoogleTest's typed suites, CLI11's header-only parser: 16 s a translation unit at
# -O3). Floating point is unchanged: neither level reassociates, and ISO C++ mode (-std=c++17)
# contracts no multiply-add.
function(embcache_light_optimization target)
  target_compile_options(${target} PRIVATE
    $<$<AND:$<COMPILE_LANGUAGE:CXX>,$<CXX_COMPILER_ID:GNU,Clang>,$<CONFIG:Release,RelWithDebInfo>>:-O1>)
endfunction()

# embcache_test_binary(<name> SOURCES <file>... [LIBRARIES <target>...] [LABELS <label>...]
#                      [PROCESSORS <n>] [OWN_MAIN] [NO_DISCOVERY]): a GoogleTest binary of the
# suite. It links GoogleTest's main (OWN_MAIN: a main of its own in SOURCES, e.g. one that starts
# MPI), compiles with the project's warnings, and registers its tests with ctest under LABELS when
# ctest runs (NO_DISCOVERY: the caller adds its tests itself, e.g. under mpirun); each test holds
# PROCESSORS of ctest's parallel slots (default 1: e.g. 2 for tests that start 2-rank jobs). Its
# translation units compile in unity batches of EMBCACHE_UNITY_BATCH.
function(embcache_test_binary name)
  cmake_parse_arguments(arg "OWN_MAIN;NO_DISCOVERY" "PROCESSORS" "SOURCES;LIBRARIES;LABELS" ${ARGN})
  if(NOT arg_PROCESSORS)
    set(arg_PROCESSORS 1)
  endif()
  add_executable(${name} ${arg_SOURCES})
  if(arg_OWN_MAIN)
    target_link_libraries(${name} PRIVATE ${arg_LIBRARIES} GTest::gtest)
  else()
    target_link_libraries(${name} PRIVATE ${arg_LIBRARIES} GTest::gtest_main)
  endif()
  embcache_warnings(${name})
  # GoogleTest's assertions are if/else statements: `if (c) ASSERT_...;` is how tests read. Tests
  # build configurations as aggregates of the fields they set (`c.passes = {{{"a.bin"}}}`), the
  # other fields keeping their defaults.
  set(gnu_cxx "$<AND:$<COMPILE_LANGUAGE:CXX>,$<CXX_COMPILER_ID:GNU,Clang>>")
  target_compile_options(${name} PRIVATE $<${gnu_cxx}:-Wno-dangling-else>
                                         $<${gnu_cxx}:-Wno-missing-field-initializers>)
  embcache_light_optimization(${name})
  if(EMBCACHE_UNITY_BATCH GREATER 0)
    set_target_properties(${name} PROPERTIES UNITY_BUILD ON
                                             UNITY_BUILD_BATCH_SIZE ${EMBCACHE_UNITY_BATCH})
  endif()
  if(NOT arg_NO_DISCOVERY)
    gtest_discover_tests(${name} PROPERTIES LABELS "${arg_LABELS}" PROCESSORS ${arg_PROCESSORS}
                         DISCOVERY_MODE PRE_TEST)
  endif()
endfunction()
