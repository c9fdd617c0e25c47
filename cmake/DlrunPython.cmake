# The project's Python: the tests' and benchmarks' interpreter (torchrun, the Python workers) and,
# where no LibTorch is named, where cmake/DlrunTorch.cmake finds LibTorch. Sets DLRUN_PYTHON_EXE
# (may be empty). Included in every configuration, with or without the worker library.
set(DLRUN_PYTHON "" CACHE FILEPATH
  "A Python with torch >= 2.4 (default: $DLRUN_PYTHON, else .venv/bin/python3)")

# DLRUN_PYTHON (cache), else $DLRUN_PYTHON, else .venv/bin/python3 (scripts/install-deps).
set(DLRUN_PYTHON_EXE "${DLRUN_PYTHON}")
if(NOT DLRUN_PYTHON_EXE AND DEFINED ENV{DLRUN_PYTHON})
  set(DLRUN_PYTHON_EXE "$ENV{DLRUN_PYTHON}")
endif()
if(NOT DLRUN_PYTHON_EXE AND EXISTS "${PROJECT_SOURCE_DIR}/.venv/bin/python3")
  set(DLRUN_PYTHON_EXE "${PROJECT_SOURCE_DIR}/.venv/bin/python3")
endif()

