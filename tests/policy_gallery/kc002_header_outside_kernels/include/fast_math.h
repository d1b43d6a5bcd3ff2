// fast_math.h: a header of the workdir outside kernels/, which pulls in CuTe.
#pragma once

#include <cute/tensor.hpp>  // EXPECT: KC002
