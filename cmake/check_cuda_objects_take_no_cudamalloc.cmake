# ctest step (tests/cuda/CMakeLists.txt): fails when an object file of the cuda space references
# cudaMalloc or cudaFree. Every allocation of the space is stream-ordered (cudaMallocAsync on the
# space's stream, Thrust's scratch included: detail::thrust_policy); cudaFree synchronizes the
# whole device, so one stray call (Thrust with a plain `par`) would serialize the prefetch worker's
# stream with everything else. Reads the undefined symbols with nm; needs no GPU.
#   cmake -DNM=<nm> -DOBJECTS=<a|b|...> -P check_cuda_objects_take_no_cudamalloc.cmake
string(REPLACE "|" ";" objects "${OBJECTS}")
list(LENGTH objects count)
if(count EQUAL 0)
  message(FATAL_ERROR "no object files given")
endif()
set(found "")
foreach(object IN LISTS objects)
  execute_process(COMMAND "${NM}" --undefined-only "${object}" OUTPUT_VARIABLE symbols
                  RESULT_VARIABLE rc ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${NM} failed on ${object}: ${err}")
  endif()
  string(REGEX MATCHALL "U (cudaMalloc|cudaFree)\n" hits "${symbols}\n")
  foreach(hit IN LISTS hits)
    string(REGEX REPLACE "U ([a-zA-Z]+)\n" "\\1" name "${hit}")
    list(APPEND found "${object}: ${name}")
  endforeach()
endforeach()
if(found)
  list(JOIN found "\n  " lines)
  message(FATAL_ERROR "object files of the cuda space call a device-synchronizing allocator "
                      "(use the space's buffers, or detail::thrust_policy for Thrust):\n  ${lines}")
endif()
message(STATUS "${count} object files of the cuda space: no cudaMalloc, no cudaFree")
