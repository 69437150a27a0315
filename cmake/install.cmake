# `cmake --install BUILD --prefix P`: the commands, the engine, the public headers, the default
# config, and a CMake package (find_package(Orochi)) whose imported targets let a C++ program
# embed the interpreter copies and replicated models, as torch::deploy's users did:
#
#   find_package(Orochi REQUIRED)
#   target_link_libraries(app PRIVATE Orochi::interpreters Orochi::packaging)
#
# The server and the command line are not exported: they are the `orochi` command's.
#
# Two components: `runtime` (what serving needs: the commands, the engine, the default config;
# all the Debian package of cmake/package.cmake ships) and `development` (headers, static
# libraries, the CMake package). A plain `cmake --install` installs both.
include(CMakePackageConfigHelpers)

install(TARGETS orochi RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT runtime)
install(CODE "execute_process(COMMAND \${CMAKE_COMMAND} -E create_symlink orochi
                \"\$ENV{DESTDIR}\${CMAKE_INSTALL_PREFIX}/${CMAKE_INSTALL_BINDIR}/orochi-python\")"
        COMPONENT runtime)
foreach(module base engine packaging interpreters)
  set_target_properties(orochi_${module} PROPERTIES EXPORT_NAME ${module})
endforeach()
install(TARGETS orochi_base orochi_engine orochi_packaging orochi_interpreters
        EXPORT OrochiTargets
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT runtime
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT development)
if(TARGET orochi_engine_cuda)
  # dlopened from beside liborochi_engine.so: no link dependency to export.
  install(TARGETS orochi_engine_cuda LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT runtime)
endif()
foreach(module base engine packaging interpreters)
  install(DIRECTORY ${PROJECT_SOURCE_DIR}/${module}/include/orochi
          DESTINATION ${CMAKE_INSTALL_INCLUDEDIR} COMPONENT development)
endforeach()
install(FILES ${PROJECT_SOURCE_DIR}/config/orochi.json ${PROJECT_SOURCE_DIR}/config/README.md
        DESTINATION ${CMAKE_INSTALL_DATADIR}/orochi COMPONENT runtime)

set(OROCHI_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/Orochi)
install(EXPORT OrochiTargets NAMESPACE Orochi:: DESTINATION ${OROCHI_CMAKE_DIR}
        COMPONENT development)
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/OrochiConfig.cmake.in
                              ${CMAKE_CURRENT_BINARY_DIR}/OrochiConfig.cmake
                              INSTALL_DESTINATION ${OROCHI_CMAKE_DIR})
write_basic_package_version_file(${CMAKE_CURRENT_BINARY_DIR}/OrochiConfigVersion.cmake
                                 COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/OrochiConfig.cmake
              ${CMAKE_CURRENT_BINARY_DIR}/OrochiConfigVersion.cmake
        DESTINATION ${OROCHI_CMAKE_DIR} COMPONENT development)
