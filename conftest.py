# Load the plugin when pytest runs from a checkout that was not pip-installed (the GPU
# machines). When the package is installed, its pytest11 entry point has imported the
# plugin already, and registering it again would be an error.
import sys

if "pytest_cudaopt.plugin" not in sys.modules:
    pytest_plugins = ["pytest_cudaopt.plugin"]
