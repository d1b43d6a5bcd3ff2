"""What model_new.py and kernels/ may call, include and import: the allow-lists and forbidden names of the rules."""

from __future__ import annotations

import re


ALLOWED_TORCH_CREATION = frozenset({
    "torch.empty", "torch.empty_like", "torch.empty_strided", "torch.zeros", "torch.zeros_like",
    "torch.ones", "torch.ones_like", "torch.full", "torch.full_like"})
# torch callables that are neither operators nor creation: metadata objects and grad-mode contexts.
ALLOWED_TORCH_OTHER = frozenset({"torch.device", "torch.Size", "torch.finfo", "torch.iinfo", "torch.is_tensor",
                                 "torch.is_floating_point", "torch.no_grad", "torch.inference_mode"})
# The allowed tensor methods that return a new tensor.
TENSOR_CREATING_METHODS = frozenset({"new_empty", "new_empty_strided", "new_zeros", "new_ones", "new_full"})
ALLOWED_TENSOR_METHODS = TENSOR_CREATING_METHODS | {
    "size", "stride", "numel", "nelement", "dim", "ndimension", "element_size", "is_contiguous",
    "data_ptr", "get_device", "storage_offset", "is_floating_point", "is_complex"}
ALLOWED_TENSOR_ATTRIBUTES = frozenset({
    "shape", "dtype", "device", "ndim", "is_cuda", "layout", "requires_grad", "itemsize", "nbytes", "is_meta"})
# Tensor properties that compute something (a view or a copy).
TENSOR_OP_ATTRIBUTES = frozenset({"T", "mT", "H", "mH", "real", "imag", "data", "grad"})
SAFE_CALL_MODULES = frozenset({"math", "typing"})
FORBIDDEN_STDLIB = frozenset({
    "importlib", "ctypes", "subprocess", "multiprocessing", "runpy", "builtins", "gc", "inspect", "pickle",
    "marshal", "shelve", "socket", "threading", "concurrent", "sqlite3", "urllib", "http"})
# Ways to an interpreter frame (the caller's locals: the harness's state) or to every object.
FRAME_CALLS = frozenset({
    "sys._getframe", "sys._getframemodulename", "sys._current_frames", "sys.settrace", "sys.setprofile",
    "sys.exc_info", "sys.exception", "traceback.walk_stack", "traceback.walk_tb", "traceback.extract_stack",
    "traceback.print_stack", "traceback.format_stack", "traceback.StackSummary.extract", "logging.currentframe"})
FRAME_ATTRIBUTES = frozenset({"f_back", "f_locals", "f_globals", "f_builtins", "tb_frame", "tb_next", "gi_frame",
                              "cr_frame", "ag_frame", "__traceback__"})
# Ways from an object to code that is not the candidate's (every class's subclasses, a function's globals and
# closure cells) and the parts of a function that can be replaced while it stays the same object.
OBJECT_GRAPH_ATTRIBUTES = frozenset({"__subclasses__", "__globals__", "__builtins__", "__closure__", "cell_contents",
                                     "__code__", "__defaults__", "__kwdefaults__"})
FILE_READ_CALLS = frozenset({
    "open", "io.open", "os.open", "os.read", "os.fdopen", "os.getenv", "os.getenvb", "os.popen",
    "torch.load", "torch.from_file", "numpy.load", "numpy.fromfile", "numpy.loadtxt", "numpy.genfromtxt",
    "numpy.memmap", "pickle.load", "json.load", "shelve.open", "builtins.open"})
FILE_READ_ATTRIBUTES = frozenset({"os.environ", "os.environb"})
FILE_READ_METHODS = frozenset({"read_text", "read_bytes"})
GLOBAL_STATE_CALLS = frozenset({"torch.manual_seed", "torch.seed", "torch.use_deterministic_algorithms",
                                "torch.cuda.manual_seed", "torch.cuda.manual_seed_all", "torch.random.manual_seed"})
TORCH_SETTER = re.compile(r"torch\.(\w+\.)*set_\w+")
# Builtins that, given a tensor, call its operators (__abs__, __gt__, __iter__, item(), ...).
TENSOR_DISPATCHING_BUILTINS = frozenset({
    "int", "float", "bool", "complex", "abs", "min", "max", "round", "divmod", "pow", "sum", "sorted", "any",
    "all", "iter", "next", "reversed", "list", "tuple", "map", "filter", "enumerate", "zip", "set", "frozenset"})
# Builtins that combine the items of a container: on a list of tensors they run tensor operators.
REDUCING_BUILTINS = frozenset({"sum", "min", "max", "sorted", "any", "all"})
DYNAMIC_BUILTINS = frozenset({"eval", "exec", "compile", "globals", "vars", "locals", "setattr", "delattr"})
FORBIDDEN_METHODS_OF_SELF = frozenset({"__call__", "_call_impl", "_wrapped_call_impl", "__getattr__",
                                       "__getattribute__"})
HOOK_METHODS = re.compile(r"register_(full_backward_|forward_|module_forward_)\w*hook")


TORCH_ROOTS = frozenset({"torch", "at", "c10", "caffe2", "aten"})
# torch::/at::/c10:: names that are not operators. Types (CamelCase) and constants (kFloat) are
# allowed by their spelling; functions and lower-case types must be listed here.
ALLOWED_CPP_CALLS = frozenset({
    "torch::empty", "torch::empty_like", "torch::empty_strided",
    "at::empty", "at::empty_like", "at::empty_strided",
    "torch::dtype", "torch::device", "torch::layout", "at::dtype", "at::device", "at::layout",
    "at::cuda::getCurrentCUDAStream", "c10::cuda::getCurrentCUDAStream",
    "at::cuda::getCurrentCUDABlasHandle", "at::cuda::getCurrentCUDABlasLtHandle",
    "at::cuda::getCUDABlasLtWorkspace", "at::cuda::getCUDABlasLtWorkspaceSize",
    "at::cuda::getCurrentDeviceProperties", "at::cuda::getDeviceProperties",
    "at::cuda::current_device", "c10::cuda::current_device",
    "c10::toString", "at::toString", "c10::elementSize", "at::elementSize",
    "c10::isFloatingType", "at::isFloatingType", "c10::isReducedFloatingType", "at::isReducedFloatingType",
    "c10::optional", "c10::nullopt", "c10::irange", "c10::complex", "c10::string_view",
    "at::opmath_type", "at::acc_type"})
# Tensor methods that read metadata or allocate (everything else on a tensor is an operator).
ALLOWED_CPP_METHODS = frozenset({
    "size", "sizes", "stride", "strides", "dim", "ndimension", "numel", "nelement", "element_size",
    "nbytes", "itemsize", "is_contiguous", "is_cuda", "is_cpu", "scalar_type", "dtype", "device",
    "get_device", "layout", "options", "defined", "storage_offset", "is_floating_point", "is_complex",
    "data_ptr", "const_data_ptr", "mutable_data_ptr", "accessor", "packed_accessor32",
    "packed_accessor64", "generic_packed_accessor", "requires_grad", "new_empty", "new_empty_strided",
    "is_pinned", "is_signed",
    # std::vector::resize shares its name with the deprecated Tensor.resize
    "resize"})
# Namespaces whose CamelCase names are modules or operators, not value types.
TORCH_OP_NAMESPACES = frozenset({"nn", "jit", "autograd", "native", "_ops", "functional", "indexing", "ops"})
# C/C++ math and std algorithm names that torch also has: an unqualified call is not ATen.
C_MATH_NAMES = frozenset("""abs fabs ceil floor round trunc exp exp2 expm1 log log2 log10 log1p pow sqrt
rsqrt cbrt sin cos tan asin acos atan atan2 sinh cosh tanh asinh acosh atanh erf erfc lgamma tgamma fmod
remainder fmax fmin hypot copysign ldexp frexp min max sort swap fill clamp isnan isinf isfinite signbit
nextafter lerp""".split())

STD_HEADERS = frozenset("""algorithm any array atomic barrier bit bitset cassert ccomplex cctype cerrno cfenv
cfloat charconv chrono cinttypes ciso646 climits clocale cmath codecvt compare complex concepts
condition_variable coroutine csetjmp csignal cstdalign cstdarg cstdbool cstddef cstdint cstdio cstdlib
cstring ctgmath ctime cuchar cwchar cwctype deque exception execution expected format forward_list
functional initializer_list iomanip ios iosfwd iostream istream iterator latch limits list locale map
mdspan memory memory_resource mutex new numbers numeric optional ostream print queue random ranges ratio
regex scoped_allocator semaphore set shared_mutex source_location span sstream stack stdexcept stdfloat
stop_token streambuf string string_view syncstream system_error thread tuple type_traits typeindex
typeinfo unordered_map unordered_set utility valarray variant vector version
assert.h complex.h ctype.h errno.h fenv.h float.h inttypes.h iso646.h limits.h locale.h math.h setjmp.h
signal.h stdalign.h stdarg.h stdbool.h stddef.h stdint.h stdio.h stdlib.h stdnoreturn.h string.h tgmath.h
time.h uchar.h wchar.h wctype.h""".split())
CUDA_HEADERS = frozenset("""cuda.h cuda_runtime.h cuda_runtime_api.h cudaTypedefs.h device_launch_parameters.h
device_functions.h device_types.h driver_types.h driver_functions.h host_defines.h builtin_types.h
vector_types.h vector_functions.h cuda_fp16.h cuda_fp16.hpp cuda_bf16.h cuda_bf16.hpp cuda_fp8.h
cuda_fp8.hpp cuda_fp6.h cuda_fp6.hpp cuda_fp4.h cuda_fp4.hpp cuda_pipeline.h cuda_pipeline_primitives.h
cuda_awbarrier.h cuda_awbarrier_primitives.h cuda_texture_types.h texture_types.h surface_types.h
surface_functions.h texture_fetch_functions.h math_constants.h math_functions.h mma.h
cooperative_groups.h cuComplex.h library_types.h cuda_occupancy.h cuda_device_runtime_api.h
nvToolsExt.h""".split())
CUDA_HEADER_PREFIXES = ("cooperative_groups/", "cuda/", "crt/", "sm_", "nvtx3/")
CUBLAS_HEADERS = frozenset({"cublas.h", "cublas_v2.h", "cublas_api.h", "cublasLt.h"})
CUDNN_HEADER = re.compile(r"cudnn(_(?!frontend)[A-Za-z0-9_]+)?\.h")
TORCH_BINDING_HEADERS = frozenset("""torch/extension.h torch/python.h torch/types.h ATen/ATen.h ATen/Tensor.h
ATen/core/Tensor.h ATen/Dispatch.h ATen/TensorUtils.h ATen/cuda/CUDAContext.h ATen/cuda/CUDAContextLight.h
ATen/cuda/Exceptions.h c10/cuda/CUDAStream.h c10/cuda/CUDAGuard.h c10/cuda/CUDAException.h
c10/cuda/CUDAFunctions.h c10/core/ScalarType.h c10/core/DeviceGuard.h c10/util/Half.h c10/util/BFloat16.h
c10/util/Exception.h c10/util/Optional.h c10/util/irange.h c10/macros/Macros.h
torch/csrc/autograd/generated/variable_factories.h torch/csrc/utils/pybind.h""".split())
TORCH_HEADER_PREFIXES = ("torch/", "ATen/", "c10/", "caffe2/")
PYBIND11_PREFIX = "pybind11/"
# Why a known library is refused (for the message); anything unknown is refused too.
FORBIDDEN_LIBRARIES = (
    ("cutlass/", "CUTLASS"), ("cute/", "CuTe"), ("cub/", "CUB (enable with allow-includes = [\"cub/\"])"),
    ("thrust/", "Thrust (enable with allow-includes = [\"thrust/\"])"), ("triton", "Triton"),
    ("flash", "flash-attention"), ("kittens", "ThunderKittens"), ("cudnn_frontend", "the cuDNN frontend"),
    ("cutensor", "cuTENSOR"), ("cusparse", "cuSPARSE"), ("cufft", "cuFFT"), ("curand", "cuRAND"),
    ("cusolver", "cuSOLVER"), ("nccl", "NCCL"), ("nvshmem", "NVSHMEM"), ("fstream", "file I/O"),
    ("filesystem", "file I/O"))

