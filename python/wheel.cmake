# The wheel (pyproject.toml: scikit-build-core sets SKBUILD and installs
# only the component "python" into the wheel's root): libdlshare goes into
# the package, next to the extension, under its SONAME, and the extension
# finds it there by RPATH $ORIGIN. A plain file, not a symlink chain: a
# wheel is a zip and keeps none.
install(FILES $<TARGET_FILE:dlshare>
  DESTINATION ${DLSHARE_PYTHON_INSTALL_DIR}/dlshare
  RENAME $<TARGET_SONAME_FILE_NAME:dlshare>
  COMPONENT python)
set_target_properties(dlshare_python PROPERTIES INSTALL_RPATH "$ORIGIN")
