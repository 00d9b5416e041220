# What every target of the project sets, in one place.

# embcache_warnings(<target>): the warnings every translation unit of the project compiles with.
function(embcache_warnings target)
  target_compile_options(${target} PRIVATE $<$<CXX_COMPILER_ID:GNU,Clang>:-Wall -Wextra>)
endfunction()

# embcache_host_target(<target>): a target of host translation units: the warnings, and Thrust's
# systems pinned to TBB and the CPU, so that a host translation unit can never pick Thrust's CUDA
# system by accident.
function(embcache_host_target target)
  embcache_warnings(${target})
  target_compile_definitions(${target} PRIVATE
    THRUST_DEVICE_SYSTEM=THRUST_DEVICE_SYSTEM_TBB THRUST_HOST_SYSTEM=THRUST_HOST_SYSTEM_CPP)
endfunction()
