# The Debian package: from a build directory,
#
#   cpack -G DEB          # orochi_<version>_amd64.deb
#
# holds the `runtime` component of cmake/install.cmake under /usr (orochi, orochi-python, the
# engine, the default config in /usr/share/orochi) and the `debian` component below: the
# service's configuration /etc/orochi/orochi.json and /etc/default/orochi (conffiles), and the
# systemd unit orochi.service. dist/debian/ holds those files and the maintainer scripts, which
# create the system user orochi and /var/lib/orochi. Nothing in it is compiled at install time.
# docker/test-deb.sh installs it into a fresh Debian container and serves the examples from it.

# Absolute destinations, outside any prefix: excluded from `cmake --install`, which must not
# write to /etc of the machine it runs on; only the package asks for this component.
install(FILES ${PROJECT_SOURCE_DIR}/dist/debian/orochi.json DESTINATION /etc/orochi
        COMPONENT debian EXCLUDE_FROM_ALL)
# It may hold tokens: systemd reads it as root, before it starts the server as orochi.
install(FILES ${PROJECT_SOURCE_DIR}/dist/debian/default DESTINATION /etc/default RENAME orochi
        PERMISSIONS OWNER_READ OWNER_WRITE COMPONENT debian EXCLUDE_FROM_ALL)
install(FILES ${PROJECT_SOURCE_DIR}/dist/debian/orochi.service DESTINATION /lib/systemd/system
        COMPONENT debian EXCLUDE_FROM_ALL)

set(CPACK_PACKAGE_NAME orochi)
set(CPACK_PACKAGE_VENDOR "Orochi")
set(CPACK_PACKAGE_CONTACT "Orochi maintainers <maintainers@users.noreply.a-seed-a6cf5274.example>")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY
    "Inference server for Python models (KServe v2), many CPython copies in one process")
set(CPACK_PACKAGE_DESCRIPTION
    "Orochi serves packaged Python models over KServe v2 HTTP (port 8000), with Prometheus\n\
metrics (8002) and a model repository API (127.0.0.1:8003), running the models in many\n\
private copies of CPython inside one process. This package runs it as the systemd service\n\
orochi.service, as the system user orochi, serving /var/lib/orochi/models.")
set(CPACK_GENERATOR DEB)
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_STRIP_FILES ON)
# One package of two components: the runtime tree and the service's files, without headers,
# static libraries or the CMake package (those are for embedding: `cmake --install`).
set(CPACK_DEB_COMPONENT_INSTALL ON)
set(CPACK_COMPONENTS_GROUPING ALL_COMPONENTS_IN_ONE)
set(CPACK_COMPONENTS_ALL runtime debian)
set(CPACK_DEBIAN_PACKAGE_NAME orochi)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)  # orochi_<version>_<arch>.deb
set(CPACK_DEBIAN_PACKAGE_SECTION net)
set(CPACK_DEBIAN_PACKAGE_PRIORITY optional)
# dpkg-shlibdeps computes what the binaries link (libc, libstdc++, prometheus-cpp, ...); the
# engine it finds in the package through the binaries' RUNPATH ($ORIGIN/../lib).
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
# What no ELF header of the package names, so dpkg-shlibdeps cannot see it:
# - adduser, for the postinst;
# - OpenBLAS, which the engine dlopens by its soname (libopenblas.so.0, engine/cpu/blas.cpp);
# - CPython's standard extension modules (lib-dynload), which the copies load by path;
# - the interpreter copy's own library, embedded in the binary and written to a memfd at run
#   time: its dependencies are computed at packaging time, by dpkg-shlibdeps on the built file,
#   in the project config file below.
# (3.11 is interpreters/CMakeLists.txt's OROCHI_PYTHON.)
set(CPACK_DEBIAN_PACKAGE_DEPENDS
    "adduser, libopenblas0-pthread | libopenblas0, libpython3.11-stdlib")
set(OROCHI_DEB_DIR ${PROJECT_SOURCE_DIR}/dist/debian)
set(OROCHI_DEB_CONTROL ${CMAKE_BINARY_DIR}/deb-control)
file(MAKE_DIRECTORY ${OROCHI_DEB_CONTROL})
# dpkg marks these as configuration: an upgrade keeps the administrator's edits, `dpkg -r`
# leaves them, `dpkg --purge` deletes them.
file(WRITE ${OROCHI_DEB_CONTROL}/conffiles "/etc/default/orochi\n/etc/orochi/orochi.json\n")
set(CPACK_DEBIAN_PACKAGE_CONTROL_EXTRA
    ${OROCHI_DEB_CONTROL}/conffiles ${OROCHI_DEB_DIR}/postinst ${OROCHI_DEB_DIR}/prerm
    ${OROCHI_DEB_DIR}/postrm)
set(CPACK_DEBIAN_PACKAGE_CONTROL_STRICT_PERMISSION ON)

set(OROCHI_COPY_LIBRARY_FILE ${CMAKE_BINARY_DIR}/lib/liborochi_copy.so)
configure_file(${CMAKE_CURRENT_LIST_DIR}/CPackProjectConfig.cmake.in
               ${CMAKE_BINARY_DIR}/CPackProjectConfig.cmake @ONLY)
set(CPACK_PROJECT_CONFIG_FILE ${CMAKE_BINARY_DIR}/CPackProjectConfig.cmake)
include(CPack)
