# The package_consumer ctest: installs a qatgraph build into a scratch prefix, then builds
# and runs tests/consumer against that prefix alone, as a separate project would.
#   cmake -DQG_BUILD_DIR=<main build> -DQG_WORK_DIR=<scratch> -DQG_CONSUMER_DIR=<tests/consumer>
#         [-DQG_CXX=<compiler>] [-DQG_LAUNCHER=ccache] -P run_consumer.cmake
foreach(var QG_BUILD_DIR QG_WORK_DIR QG_CONSUMER_DIR)
  if(NOT ${var})
    message(FATAL_ERROR "run_consumer.cmake needs -D${var}=...")
  endif()
endforeach()

function(step)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "failed (${rc}): ${ARGN}")
  endif()
endfunction()

set(prefix ${QG_WORK_DIR}/prefix)
file(REMOVE_RECURSE ${prefix})  # only what this install puts there
step(${CMAKE_COMMAND} --install ${QG_BUILD_DIR} --prefix ${prefix} --component dev)

set(configure_args -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH=${prefix}
    -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF)
if(QG_CXX)
  list(APPEND configure_args -DCMAKE_CXX_COMPILER=${QG_CXX})
endif()
if(QG_LAUNCHER)
  list(APPEND configure_args -DCMAKE_CXX_COMPILER_LAUNCHER=${QG_LAUNCHER})
endif()
# A fresh configure each time, so the package is found again in the new prefix.
file(REMOVE_RECURSE ${QG_WORK_DIR}/build)
step(${CMAKE_COMMAND} -S ${QG_CONSUMER_DIR} -B ${QG_WORK_DIR}/build ${configure_args})
step(${CMAKE_COMMAND} --build ${QG_WORK_DIR}/build)
step(${QG_WORK_DIR}/build/qatgraph_consumer)
