# What every target of the project sets, in one place.

# embcache_warnings(<target>): the warnings every host translation unit of the project compiles
# with (CUDA translation units keep nvcc's defaults).
function(embcache_warnings target)
  target_compile_options(${target} PRIVATE
    $<$<AND:$<COMPILE_LANGUAGE:CXX>,$<CXX_COMPILER_ID:GNU,Clang>>:-Wall -Wextra>)
endfunction()

# embcache_host_target(<target>): a target of host translation units: the warnings, and Thrust's
# systems pinned to TBB and the CPU, so that a host translation unit can never pick Thrust's CUDA
# system by accident.
function(embcache_host_target target)
  embcache_warnings(${target})
  target_compile_definitions(${target} PRIVATE
    THRUST_DEVICE_SYSTEM=THRUST_DEVICE_SYSTEM_TBB THRUST_HOST_SYSTEM=THRUST_HOST_SYSTEM_CPP)
endfunction()

# embcache_test_binary(<name> SOURCES <file>... [LIBRARIES <target>...] [LABELS <label>...]
#                      [OWN_MAIN] [NO_DISCOVERY]): a GoogleTest binary of the suite. It links
# GoogleTest's main (OWN_MAIN: a main of its own in SOURCES, e.g. one that starts MPI), compiles
# with the project's warnings, and registers its tests with ctest under LABELS when ctest runs
# (NO_DISCOVERY: the caller adds its tests itself, e.g. under mpirun).
function(embcache_test_binary name)
  cmake_parse_arguments(arg "OWN_MAIN;NO_DISCOVERY" "" "SOURCES;LIBRARIES;LABELS" ${ARGN})
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
  if(NOT arg_NO_DISCOVERY)
    gtest_discover_tests(${name} PROPERTIES LABELS "${arg_LABELS}" DISCOVERY_MODE PRE_TEST)
  endif()
endfunction()
