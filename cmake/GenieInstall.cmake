# `cmake --install build [--prefix P] --component genie`: the C++ package for other projects.
#
#   P/bin/genie-node, P/bin/genie-bench           the service and the network microbenchmarks
#   P/lib/libgenie_{common,wire,transport,client}.a
#   P/include/genie/...                           status.h, log.h, units.h, wire/ (the codec and
#                                                 the generated schema), transport/, client/
#   P/lib/cmake/Genie/GenieConfig.cmake           find_package(Genie CONFIG REQUIRED), targets
#                                                 genie::common, genie::schema, genie::wire,
#                                                 genie::transport, genie::client
#
# A consumer links genie::client (the C++ client of genie-node), genie::transport (the UCX data
# plane) or genie::wire (the codec). The package finds the UCX it was built with again (the
# venv's libucx-cu13 or pkg-config's ucx) and the same fmt, spdlog and FlatBuffers.
# tests/python/test_install.py builds tests/install/consumer against an installed tree and runs
# it against a real genie-node.
include(CMakePackageConfigHelpers)

set(GENIE_INSTALL_CMAKEDIR ${CMAKE_INSTALL_LIBDIR}/cmake/Genie)
foreach(name common schema wire transport client)
  set_target_properties(genie_${name} PROPERTIES EXPORT_NAME ${name})
endforeach()
install(TARGETS genie_common genie_schema genie_wire genie_transport genie_client
        EXPORT GenieTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT genie
        INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
# Installed programs find the UCX (and torch) they were linked with: the venv's wheels are not
# on the loader's path (a system libucp would be taken instead).
set_target_properties(genie-bench PROPERTIES INSTALL_RPATH "${UCX_LIBRARY_DIRS}")
set(genie_programs genie-bench)
if(TARGET genie-node)
  list(APPEND genie_programs genie-node)
  if(NOT GENIE_BUILD_PYTHON)  # the wheel's build gives it the wheel's relative RPATH (python/)
    set_target_properties(genie-node PROPERTIES INSTALL_RPATH "${UCX_LIBRARY_DIRS};${TORCH_INSTALL_PREFIX}/lib")
  endif()
endif()
install(TARGETS ${genie_programs} RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT genie)

# Headers: the core's (not node/: it needs libtorch), the transport's, the generated schema.
install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/genie DESTINATION ${CMAKE_INSTALL_INCLUDEDIR} COMPONENT genie
        PATTERN node EXCLUDE)
install(DIRECTORY ${PROJECT_SOURCE_DIR}/transport/include/genie DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
        COMPONENT genie)
install(FILES ${CMAKE_BINARY_DIR}/generated/genie/wire/genie_generated.h
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/genie/wire COMPONENT genie)

install(EXPORT GenieTargets NAMESPACE genie:: DESTINATION ${GENIE_INSTALL_CMAKEDIR} COMPONENT genie)
configure_package_config_file(${CMAKE_CURRENT_LIST_DIR}/GenieConfig.cmake.in
                              ${CMAKE_BINARY_DIR}/GenieConfig.cmake
                              INSTALL_DESTINATION ${GENIE_INSTALL_CMAKEDIR})
write_basic_package_version_file(${CMAKE_BINARY_DIR}/GenieConfigVersion.cmake
                                 COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_BINARY_DIR}/GenieConfig.cmake ${CMAKE_BINARY_DIR}/GenieConfigVersion.cmake
        DESTINATION ${GENIE_INSTALL_CMAKEDIR} COMPONENT genie)
