# The Debian package: `cpack -G DEB` in a build configured for /usr,
#
#   cmake -S . -B build-deb -DCMAKE_INSTALL_PREFIX=/usr -DCMAKE_BUILD_TYPE=RelWithDebInfo
#   cmake --build build-deb && (cd build-deb && cpack -G DEB)
#
# makes dlshare_<version>_<arch>.deb: the daemon, dlsharectl, libdlshare
# and its header, pkg-config and CMake files, the systemd units,
# sysusers.d and tmpfiles.d files, the man pages, and maintainer scripts
# (cmake/deb/) that create the user, enable dlshared.socket and start it
# only where systemd runs. The Python binding is not in it (component
# "python"): Python users pip install the checkout (pyproject.toml).
# Dependencies come from dpkg-shlibdeps (dpkg-dev). tests/package checks
# it by installing it into a scratch root.
set(CPACK_PACKAGE_NAME dlshare)
set(CPACK_PACKAGE_VENDOR dlshare)
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGE_CONTACT "dlshare maintainers <dlshare@localhost>")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY
  "share tensors between processes on one machine without copying them")
set(CPACK_PACKAGE_DESCRIPTION
  "dlshared keeps named, versioned tensors (host memfds, CUDA IPC and VMM
memory) and hands them out over a Unix socket; libdlshare rebuilds them
as DLPack tensors for PyTorch, NumPy, JAX or C; dlsharectl looks inside.")
set(CPACK_PACKAGE_FILE_NAME "${CPACK_PACKAGE_NAME}-${PROJECT_VERSION}")
set(CPACK_GENERATOR DEB)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_SECTION misc)
set(CPACK_DEBIAN_PACKAGE_PRIORITY optional)
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
# The shlibs file of a package with a shared library (its ldconfig
# trigger is cmake/deb/triggers).
set(CPACK_DEBIAN_PACKAGE_GENERATE_SHLIBS ON)
# The maintainer scripts use systemd-sysusers where it is (else
# useradd, from passwd, which every Debian system has).
set(CPACK_DEBIAN_PACKAGE_RECOMMENDS "systemd")
set(CPACK_DEBIAN_PACKAGE_CONTROL_EXTRA
  ${CMAKE_CURRENT_LIST_DIR}/deb/postinst
  ${CMAKE_CURRENT_LIST_DIR}/deb/prerm
  ${CMAKE_CURRENT_LIST_DIR}/deb/postrm
  ${CMAKE_CURRENT_LIST_DIR}/deb/triggers)
# Where the build found UCX, dlshare-relay comes too, with its unit, man
# page and /etc/dlshare/relay.conf, which dpkg keeps as a conffile (an
# administrator's edits survive upgrades). The unit is not enabled: it needs
# that configuration and a key first.
if(NOT DEFINED UCX_FOUND)
  pkg_check_modules(UCX QUIET ucx)
endif()
if(UCX_FOUND)
  file(WRITE ${CMAKE_BINARY_DIR}/deb/conffiles "/etc/dlshare/relay.conf\n")
  list(APPEND CPACK_DEBIAN_PACKAGE_CONTROL_EXTRA
    ${CMAKE_BINARY_DIR}/deb/conffiles)
endif()
set(CPACK_DEBIAN_PACKAGE_CONTROL_STRICT_PERMISSION TRUE)
# Everything but the Python binding, in one package.
set(CPACK_DEB_COMPONENT_INSTALL ON)
set(CPACK_COMPONENTS_GROUPING ALL_COMPONENTS_IN_ONE)
set(CPACK_COMPONENTS_ALL Unspecified)
# The unit's ExecStart= and the libdir are fixed when configuring: a
# package made for another prefix would start a daemon that is not there.
set(CPACK_DLSHARE_CONFIGURED_PREFIX "${CMAKE_INSTALL_PREFIX}")
set(CPACK_PROJECT_CONFIG_FILE ${CMAKE_CURRENT_LIST_DIR}/package-check.cmake)
include(CPack)
