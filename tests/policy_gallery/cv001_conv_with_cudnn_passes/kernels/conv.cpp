// conv.cpp: the 1-D convolution as a cuDNN 2-D convolution of height 1.
#include <cudnn.h>

extern "C" int conv_launcher(cudnnHandle_t handle, const float* x, const float* w, float* y, int n,
                             int width, void* workspace, size_t workspace_bytes) {
  cudnnTensorDescriptor_t x_desc, y_desc;
  cudnnFilterDescriptor_t w_desc;
  cudnnConvolutionDescriptor_t conv_desc;
  cudnnCreateTensorDescriptor(&x_desc);
  cudnnCreateTensorDescriptor(&y_desc);
  cudnnCreateFilterDescriptor(&w_desc);
  cudnnCreateConvolutionDescriptor(&conv_desc);
  cudnnSetTensor4dDescriptor(x_desc, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, n, 1, 1, width);
  cudnnSetTensor4dDescriptor(y_desc, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, n, 1, 1, width);
  cudnnSetFilter4dDescriptor(w_desc, CUDNN_DATA_FLOAT, CUDNN_TENSOR_NCHW, 1, 1, 1, 3);
  cudnnSetConvolution2dDescriptor(conv_desc, 0, 1, 1, 1, 1, 1, CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT);
  const float one = 1.0f, zero = 0.0f;
  cudnnStatus_t status = cudnnConvolutionForward(handle, &one, x_desc, x, w_desc, w, conv_desc,
                                                 CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM, workspace,
                                                 workspace_bytes, &zero, y_desc, y);
  cudnnDestroyConvolutionDescriptor(conv_desc);
  cudnnDestroyFilterDescriptor(w_desc);
  cudnnDestroyTensorDescriptor(y_desc);
  cudnnDestroyTensorDescriptor(x_desc);
  return static_cast<int>(status);
}
