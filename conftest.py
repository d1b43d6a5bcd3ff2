# Load the plugin when pytest runs from a checkout that was not pip-installed (the GPU
# machines). When the package is installed, its pytest11 entry point has loaded it already.
from pytest_cudaopt.launch import conftest_plugins

pytest_plugins = conftest_plugins()
