# `cmake --install <build> --prefix P` installs the library so that another CMake project can
#   find_package(qatgraph 0.1 REQUIRED)              # or COMPONENTS CUDA when it needs the GPU
#   target_link_libraries(app PRIVATE qatgraph::qatgraph)
# and include the headers as #include <qatgraph/autograd/grad.h>, or by their path inside the
# repository, #include "autograd/grad.h" (both directories are on the target's include path).
#   P/lib/libqg_{core,device,ops,autograd,runtime,nn,data,train}.a (.so with BUILD_SHARED_LIBS): one
#     library per layer; qatgraph::qatgraph links them all
#   P/include/qatgraph/{core,device,ops,autograd,runtime,nn,data,train}/...h
#   P/lib/cmake/qatgraph/qatgraph{Config,ConfigVersion,Targets}.cmake
#   P/bin/qat (when the programs are built)
# The CUDA kernels, when built, are part of the ops library (they register into the same op
# registry as the CPU kernels); the package then offers the CUDA component, and cuDNN when it
# was found.
include(CMakePackageConfigHelpers)
set(QG_CMAKE_INSTALL_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/qatgraph)

install(TARGETS qatgraph qg_core qg_device qg_ops qg_autograd qg_runtime qg_nn qg_data
  qg_train
  EXPORT qatgraphTargets
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT dev
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT dev
  RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT dev)
# Every header of the library folders; the CUDA-only .cuh headers stay private.
install(DIRECTORY core device ops autograd runtime nn data train
  DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/qatgraph COMPONENT dev
  FILES_MATCHING PATTERN "*.h")
install(EXPORT qatgraphTargets NAMESPACE qatgraph:: DESTINATION ${QG_CMAKE_INSTALL_DIR}
  COMPONENT dev)

# Read by qatgraphConfig.cmake.in: what this build contained.
get_filename_component(QG_CUDNN_LIBRARY_NAME "${QG_CUDNN_LIBRARY}" NAME)
get_filename_component(QG_CUDNN_LIBRARY_DIR "${QG_CUDNN_LIBRARY}" DIRECTORY)
get_filename_component(QG_NCCL_LIBRARY_DIR "${QG_NCCL_LIBRARY}" DIRECTORY)
configure_package_config_file(cmake/qatgraphConfig.cmake.in
  ${CMAKE_CURRENT_BINARY_DIR}/qatgraphConfig.cmake INSTALL_DESTINATION ${QG_CMAKE_INSTALL_DIR})
# 0.x: a minor version may break the API, so only the same minor version is compatible.
write_basic_package_version_file(${CMAKE_CURRENT_BINARY_DIR}/qatgraphConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/qatgraphConfig.cmake
              ${CMAKE_CURRENT_BINARY_DIR}/qatgraphConfigVersion.cmake
  DESTINATION ${QG_CMAKE_INSTALL_DIR} COMPONENT dev)
